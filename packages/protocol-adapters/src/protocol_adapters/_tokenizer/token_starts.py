"""Where each token of a text begins, found without the tokenizer's offsets.

``encode_batch_fast`` tracks no offsets and is ~20% faster than ``encode_batch`` (measured on
Qwen3: 13.2 -> 10.0 ms for 32 KB of Python source). A byte-level BPE token stands for a known
number of bytes (its characters are bytes; an added token is its content in UTF-8), so where the
normalizer leaves a text as it is, the tokens cover its UTF-8 bytes in order and the prefix sums
of their byte lengths are where they begin (:class:`ByteLengths`).

Sound only for a pipeline that neither adds, drops nor moves text: no normalizer or NFC (and the
text NFC already: a substring of NFC text is NFC too, so every stretch the tokenizer normalizes
apart is unchanged), pre-tokenizers that only split (``Split`` that keeps its matches, one
``ByteLevel`` adding no prefix space), BPE with a token for every byte (never an unknown token)
and no subword affixes, no post-processor that trims offsets. :func:`byte_lengths_for` checks
that, then a sample against the offsets. At run time each text is checked once more: every
token covers a stretch of its bytes, in order and apart, and a length from the table is at most
its stretch (an added token that strips spaces covers them too), so when the lengths add up to
the text's length they are the stretches and tile the text; when they do not, the caller encodes
the text again with offsets (:class:`EncodingStarts`).
"""

from __future__ import annotations

import unicodedata
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from itertools import accumulate
from typing import overload

from tokenizers import Encoding, Tokenizer, models

from .byte_level import byte_to_unicode
from .pieces import _state

_UNSEEN = 1 << 40
"""The length of an id not looked up yet: a sum with it is at least this."""
_NONE = 1 << 41
"""The length of an id with no one length in bytes: a sum with it never fits a text."""
_BYTE_CHARS = frozenset(byte_to_unicode().values())

_PROBE = (
    "def f(self, x):\n    return x + 12  # done\r\n\n\tit's 3.14... '  ll'll\n"
    "猫猫 é x\u0301 \u0301 \U0001f600 \U0001fae8 ἀἁ ab12cd __init__ ???\n\n\n   x  y   \n.\n"
)


class LazyStarts(Sequence[int]):
    """Token starts read one at a time (:meth:`_at`): the bridge reads a dozen per span end."""

    __slots__ = ()

    def _at(self, index: int) -> int:
        raise NotImplementedError

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index: int | slice) -> int | list[int]:
        length = len(self)
        if isinstance(index, slice):
            return [self._at(i) for i in range(*index.indices(length))]
        if index < 0:
            index += length
        if not 0 <= index < length:
            raise IndexError("token index out of range")
        return self._at(index)


class EncodingStarts(LazyStarts):
    """Starts read from an ``Encoding`` with offsets (``encode_batch``'s), one token at a time."""

    __slots__ = ("_encoding",)

    def __init__(self, encoding: Encoding) -> None:
        self._encoding = encoding

    def __len__(self) -> int:
        return len(self._encoding)

    def _at(self, index: int) -> int:
        span = self._encoding.token_to_chars(index)
        if span is None:  # not for one sequence's encoding; the offsets say the same, slower
            span = self._encoding.offsets[index]
        return int(span[0])


class Utf8Starts(LazyStarts):
    """Character starts of non-ASCII text from its tokens' byte starts, converted on reading: a
    token that begins inside a character begins at that character, as the offsets say."""

    __slots__ = ("_encoded", "_starts")

    def __init__(self, starts: list[int], encoded: bytes) -> None:
        self._starts = starts
        self._encoded = encoded

    def __len__(self) -> int:
        return len(self._starts)

    def _at(self, index: int) -> int:
        # The characters wholly before the byte (a partial one at the end is ignored): a copy
        # and a decode in C, cheaper for a few reads than converting every start up front.
        return len(self._encoded[: self._starts[index]].decode("utf-8", "ignore"))


class TokenStarts(LazyStarts):
    """The character of a text each of its tokens begins at, from its pieces' starts. A bridged
    turn reads it only where its spans end (:meth:`first_from`); the offsets as a list cost a
    tuple per token (1.2 ms of a 32 KB text's 22 ms encode, most of it in the gen-0 collections
    those tuples set off)."""

    __slots__ = ("_chars", "_firsts", "_length", "_pieces")

    def __init__(self, pieces: Sequence[tuple[int, Sequence[int]]]) -> None:
        """``pieces``: each piece's first character in the text and its tokens' starts in it,
        in order."""
        self._pieces: list[tuple[int, int, Sequence[int]]] = []  # first token, first character
        self._firsts: list[int] = []
        self._chars: list[int] = []
        self._length = 0
        for start, starts in pieces:
            self._pieces.append((self._length, start, starts))
            self._firsts.append(self._length)
            self._chars.append(start)
            self._length += len(starts)

    def __len__(self) -> int:
        return self._length

    def _at(self, index: int) -> int:
        first, start, starts = self._pieces[bisect_right(self._firsts, index) - 1]
        return start + starts[index - first]

    def first_from(self, position: int, lo: int = 0) -> int:
        """``bisect_left(self, position, lo)``, searching only the piece ``position`` is in (a
        piece's last token begins before the next piece's first character)."""
        index = bisect_right(self._chars, position) - 1
        if index < 0:
            return lo
        first, start, starts = self._pieces[index]
        return max(lo, first + bisect_left(starts, position - start))


def first_token_from(starts: Sequence[int], position: int, lo: int = 0) -> int:
    """The first token at or after ``lo`` that begins at or after ``position`` in a text whose
    tokens begin at ``starts`` (``bisect_left``)."""
    if isinstance(starts, TokenStarts):
        return starts.first_from(position, lo)
    return bisect_left(starts, position, lo)


class ByteLengths:
    """The byte length of each token of a vocabulary, by id, looked up the first time a text
    holds it (the whole vocabulary at once would cost ~0.2 s: ``get_vocab`` alone does), and
    whether the vocabulary's normalizer is NFC (else it has none)."""

    __slots__ = ("_added", "_id_to_token", "_lengths", "_nfc")

    def __init__(self, tokenizer: Tokenizer, nfc: bool) -> None:
        added = tokenizer.get_added_tokens_decoder()
        self._added = {token_id: len(token.content.encode()) for token_id, token in added.items()}
        self._id_to_token = tokenizer.model.id_to_token
        size = max(tokenizer.get_vocab_size(with_added_tokens=True), max(added, default=-1) + 1)
        self._lengths = [_UNSEEN] * size
        self._nfc = nfc

    def applies(self, text: str) -> bool:
        """Whether the normalizer leaves ``text`` as it is (ASCII is NFC)."""
        return not self._nfc or text.isascii() or unicodedata.is_normalized("NFC", text)

    def starts(self, text: str, ids: Sequence[int]) -> Sequence[int] | None:
        """Where each token of ``text`` (``ids``, encoded from it) begins, or None when the
        lengths do not tile its bytes: then the caller must read the tokenizer's offsets."""
        try:
            starts = self._byte_starts(ids)
            if starts[-1] >= _UNSEEN:  # a token not looked up yet
                self._learn(ids)
                starts = self._byte_starts(ids)
        except IndexError:  # an id past the vocabulary's: not a token of it
            return None
        end = starts.pop()
        if text.isascii():  # bytes are characters
            return starts if end == len(text) else None
        encoded = text.encode("utf-8")
        return Utf8Starts(starts, encoded) if end == len(encoded) else None

    def _byte_starts(self, ids: Sequence[int]) -> list[int]:
        """Each token's first byte, then the sum of all (C loops: ~0.5 ms for 10k tokens)."""
        return list(accumulate(map(self._lengths.__getitem__, ids), initial=0))

    def _learn(self, ids: Sequence[int]) -> None:
        lengths = self._lengths
        for token_id in set(ids):
            if lengths[token_id] == _UNSEEN:
                lengths[token_id] = self._length_of(token_id)

    def _length_of(self, token_id: int) -> int:
        """A model token's characters (each one byte), an added token's UTF-8; :data:`_NONE`
        for an id that has no token or two of different lengths."""
        token = self._id_to_token(token_id)
        added = self._added.get(token_id)
        if token is None:
            return _NONE if added is None else added
        if not _BYTE_CHARS.issuperset(token) or added not in (None, len(token)):
            return _NONE
        return len(token)


def byte_lengths_for(tokenizer: Tokenizer) -> ByteLengths | None:
    """The byte lengths of ``tokenizer``'s tokens, or None where starts cannot be found from
    them (see the module doc): a pipeline that might add, drop or move text, a byte without a
    token, or a sample whose starts differ from the offsets'."""
    normalizer = tokenizer.normalizer
    nfc = normalizer is not None
    if nfc and _state(normalizer) != {"type": "NFC"}:
        return None
    if not _only_splits(tokenizer):
        return None
    if any(tokenizer.model.token_to_id(char) is None for char in _BYTE_CHARS):
        return None
    found = ByteLengths(tokenizer, nfc)
    return found if _agrees(tokenizer, found) else None


def _only_splits(tokenizer: Tokenizer) -> bool:
    pre_tokenizer = tokenizer.pre_tokenizer
    if pre_tokenizer is None:
        return False
    pre = _state(pre_tokenizer)
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else [pre]
    if not isinstance(steps, list):
        return False
    kinds = [step.get("type") for step in steps]
    if kinds.count("ByteLevel") != 1 or not set(kinds) <= {"Split", "ByteLevel"}:
        return False
    for step in steps:
        if step.get("add_prefix_space") or step.get("behavior", "Isolated") == "Removed":
            return False
    post = tokenizer.post_processor
    if post is not None and _state(post).get("type") != "ByteLevel":
        return False
    if post is not None and _state(post).get("trim_offsets"):
        return False
    model = tokenizer.model
    return (
        isinstance(model, models.BPE)
        and not model.continuing_subword_prefix
        and not model.end_of_word_suffix
    )


def _agrees(tokenizer: Tokenizer, lengths: ByteLengths) -> bool:
    """The check at load: a sample's tokens start where the offsets say, and so do those of one
    with every added token in it, unless their lengths fall short of it as the guard finds at
    run time (an added token that strips spaces covers more than its content)."""
    added = " ".join(token.content for token in tokenizer.get_added_tokens_decoder().values())
    for text, must_fit in ((_PROBE, True), (_PROBE + added + "\n" + _PROBE, False)):
        if not lengths.applies(text):
            return False
        (fast,) = tokenizer.encode_batch_fast([text], add_special_tokens=False)
        (slow,) = tokenizer.encode_batch([text], add_special_tokens=False)
        if fast.ids != slow.ids:
            return False
        starts = lengths.starts(text, fast.ids)
        if starts is None and must_fit:
            return False
        if starts is not None and list(starts) != list(EncodingStarts(slow)):
            return False
    return True
