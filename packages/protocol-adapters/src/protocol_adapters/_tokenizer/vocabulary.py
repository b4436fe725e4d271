"""The tokenizer as the renderer and the parsers use it.

A thin, typed face over a ``tokenizers.Tokenizer``: encode without adding anything, decode without
skipping anything. Both choices are about faithfulness: a chat template already wrote every
special token it wants, and a parser must see ``<tool_call>`` exactly as the engine produced it.

Thread safety: a :class:`Vocabulary` is immutable after construction and the Rust tokenizer it
wraps is safe to share, so one instance may serve any number of worker threads (the token byte
lengths it looks up as texts need them are written alike by any thread; the recent long texts'
encodings are kept under a lock). Encoding goes through
``encode_batch_fast`` (``encode_batch`` where offsets are needed): both release the GIL while Rust
tokenizes (plain ``encode`` holds it: measured, a 2k-token encode in a worker thread then stalls
the event loop for its whole duration).

Long text is encoded in pieces, one after the other: a 20 MB request costs a few MB of tokenizer
memory at a time, encoding can stop as soon as a limit is passed, and one request's tokenizing
keeps to one core (the event loop and the other sessions keep the rest). The pieces are cut only
where the pre-tokenizer always splits, so they encode exactly as the whole text does (see
pieces.py). :meth:`Vocabulary.encode_with_starts` finds where tokens begin from their byte
lengths where that is exact (token_starts.py), else from the piece's offsets.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from tokenizers import Encoding, Tokenizer

from .byte_level import byte_to_unicode
from .pieces import cutter_for
from .shared import MAX_SHARED_CHARS, SHARED_CHARS, SharedEncodings
from .special_tokens import END_OF_TEXT, END_OF_TURN
from .token_starts import ByteLengths, EncodingStarts, TokenStarts, byte_lengths_for

PIECE_CHARS = 32_768
"""Target size of one counted piece (a piece runs to the first cut after it). A rest of text at
most an eighth longer is not cut: a tail of a few characters would cost a second encode call,
and more than its own tokens (a 32,798-character tool result was cut 30 characters short of its
end)."""

NORMALIZED_SHRINK = 4
"""How far normalizing can shrink text, in UTF-8 bytes, at the most: NFC composes at most three
bytes into two (a letter and a combining mark into one code point); 4 leaves room to spare. With
the longest token's byte length it bounds a piece's token count from below without encoding it."""


_UNICODE_TO_BYTE = {char: byte for byte, char in byte_to_unicode().items()}


class TooManyTokens(ValueError):
    """Text encodes to more tokens than allowed. ``counted`` is more than the limit and at most
    the true count: encoding stopped once the limit was passed."""

    def __init__(self, counted: int) -> None:
        super().__init__(f"at least {counted} tokens")
        self.counted = counted


def _always(piece: str) -> bool:
    return True


def _never(piece: str) -> bool:
    return False


class Vocabulary:
    """Encode/decode plus the ids that end a turn."""

    __slots__ = (
        "_added_ids",
        "_byte_level",
        "_cut",
        "_lengths",
        "_lengths_known",
        "_longest",
        "_shared",
        "_stop_ids",
        "name",
        "tokenizer",
    )

    def __init__(
        self,
        tokenizer: Tokenizer,
        name: str,
        stop_tokens: Sequence[str] = (END_OF_TURN, END_OF_TEXT),
    ) -> None:
        self.tokenizer = tokenizer
        self.name = name
        self._added_ids = frozenset(tokenizer.get_added_tokens_decoder())
        self._stop_ids = frozenset(self.token_id(t) for t in stop_tokens)
        self._cut = cutter_for(tokenizer)
        decoder = tokenizer.decoder
        self._byte_level = (
            decoder is not None and json.loads(decoder.__getstate__()).get("type") == "ByteLevel"
        )
        self._longest = 0  # bytes of input the longest token can stand for; found on first use
        self._lengths: ByteLengths | None = None  # found on first use, if sound
        self._lengths_known = False
        self._shared: SharedEncodings[TokenStarts] = SharedEncodings()

    @classmethod
    def from_file(cls, path: Path, name: str | None = None) -> Vocabulary:
        """Load a ``tokenizer.json``."""
        return cls(Tokenizer.from_file(str(path)), name or path.stem)

    @property
    def size(self) -> int:
        return int(self.tokenizer.get_vocab_size(with_added_tokens=True))

    @property
    def stop_ids(self) -> frozenset[int]:
        """Ids that end an assistant turn (``<|im_end|>``, ``<|endoftext|>``)."""
        return self._stop_ids

    def encode(self, text: str, *, max_tokens: int | None = None) -> list[int]:
        """Token ids of ``text``; special-token text becomes its single id, nothing is added.

        Raises :class:`TooManyTokens` as soon as more than ``max_tokens`` ids are known.
        """
        ids: list[int] = []
        for _, _, encoding, _ in self._encoded(text, max_tokens):
            ids.extend(encoding.ids)
        return ids

    def encode_with_starts(
        self, text: str, *, max_tokens: int | None = None
    ) -> tuple[list[int], TokenStarts]:
        """Ids and where each id's token begins in ``text`` (see :meth:`encode`): from the
        tokens' byte lengths where the vocabulary and the piece allow it (token_starts.py),
        else, or when the lengths do not tile the piece, from the piece's offsets. A long text
        that other callers ask for too (the same first request of many episodes) is encoded
        once (shared.py)."""
        if not SHARED_CHARS <= len(text) <= MAX_SHARED_CHARS:
            return self._encode_with_starts(text, max_tokens)
        ids, starts = self._shared.encoded(text, lambda: self._encode_with_starts(text, max_tokens))
        if max_tokens is not None and len(ids) > max_tokens:
            raise TooManyTokens(len(ids))
        return ids, starts

    def _encode_with_starts(
        self, text: str, max_tokens: int | None
    ) -> tuple[list[int], TokenStarts]:
        lengths = self._byte_lengths()
        ids: list[int] = []
        pieces: list[tuple[int, Sequence[int]]] = []
        fast = lengths.applies if lengths is not None else _never
        for start, piece, encoding, without_offsets in self._encoded(text, max_tokens, fast):
            piece_ids, starts = self._starts(piece, encoding, lengths if without_offsets else None)
            if ids:
                ids.extend(piece_ids)
            else:  # the first piece's list as it is: most texts are one piece
                ids = piece_ids
            pieces.append((start, starts))
        return ids, TokenStarts(pieces)

    def _starts(
        self, piece: str, encoding: Encoding, lengths: ByteLengths | None
    ) -> tuple[list[int], Sequence[int]]:
        """Ids of ``piece`` and its tokens' starts: from ``lengths`` if given (``encoding`` has
        no offsets) and they tile the piece, else from offsets, encoding it again if need be."""
        ids: list[int] = encoding.ids
        if lengths is not None:
            starts = lengths.starts(piece, ids)
            if starts is not None:
                return ids, starts
            # The guard fired: never a wrong cut.
            (encoding,) = self.tokenizer.encode_batch([piece], add_special_tokens=False)
        return encoding.ids, EncodingStarts(encoding)

    def _byte_lengths(self) -> ByteLengths | None:
        """The tokens' byte lengths if starts can be found from them; the checks run on first
        use (a few ms)."""
        if not self._lengths_known:
            self._lengths = byte_lengths_for(self.tokenizer)
            self._lengths_known = True
        return self._lengths

    def count(self, text: str, *, max_tokens: int | None = None) -> int:
        """The number of tokens ``text`` encodes to, holding only one batch of pieces at a time;
        raises :class:`TooManyTokens` as soon as more than ``max_tokens`` are known."""
        return sum(len(encoding) for _, _, encoding, _ in self._encoded(text, max_tokens))

    def at_least(self, text: str) -> int:
        """A lower bound of the tokens ``text`` encodes to, found without encoding it: no token
        stands for more input than the longest one (normalizing aside, see NORMALIZED_SHRINK)."""
        encoded = len(text.encode("utf-8", "surrogatepass"))
        return encoded // (self._longest_bytes() * NORMALIZED_SHRINK)

    def _longest_bytes(self) -> int:
        """UTF-8 bytes of the longest token's text (a byte-level token's characters are bytes),
        found on first use."""
        if not self._longest:
            self._longest = self._longest_token_bytes()
        return self._longest

    def _longest_token_bytes(self) -> int:
        tokens = self.tokenizer.get_vocab(True)
        if self._byte_level:
            return max((len(token) for token in tokens), default=1)
        return max((len(token.encode("utf-8")) for token in tokens), default=1)

    def _encoded(
        self, text: str, max_tokens: int | None, fast: Callable[[str], bool] = _always
    ) -> Iterator[tuple[int, str, Encoding, bool]]:
        """``(start, piece, encoding, fast(piece))`` of each piece of ``text``, encoded without
        offsets where ``fast`` says so (the same ids, ~20% sooner); raises
        :class:`TooManyTokens` at the piece that passes ``max_tokens``, or before looking for a
        cut in, or encoding, text that must pass it (a 20 MB word, or text a tokenizer without
        a sound cutter cannot be cut in): the cost of a prompt over the limit is bounded by the
        limit, never by its size. Text is cut only where it encodes exactly as the whole
        (pieces.py); a tokenizer without such cuts encodes in one piece (exact, bounded only by
        that check)."""
        total = 0
        start = 0
        while True:
            rest = len(text) - start
            if max_tokens is not None and rest > PIECE_CHARS:
                # Characters are at least bytes: a bound of the rest without encoding it.
                bound = total + rest // (self._longest_bytes() * NORMALIZED_SHRINK)
                if bound > max_tokens:
                    raise TooManyTokens(bound)
            end = len(text)
            if self._cut is not None and rest > PIECE_CHARS + PIECE_CHARS // 8:
                end = self._cut(text, start, PIECE_CHARS)
            piece = text[start:end]
            if max_tokens is not None and len(piece) > PIECE_CHARS:
                bound = total + self.at_least(piece)
                if bound > max_tokens:
                    raise TooManyTokens(bound)
            without_offsets = fast(piece)
            encode = (
                self.tokenizer.encode_batch_fast if without_offsets else self.tokenizer.encode_batch
            )
            (encoding,) = encode([piece], add_special_tokens=False)
            total += len(encoding)
            if max_tokens is not None and total > max_tokens:
                raise TooManyTokens(total)
            yield start, piece, encoding, without_offsets
            start = end
            if start >= len(text):
                return

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` with every special token spelled out (nothing skipped)."""
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for: exact for byte-level vocabularies (a token may be part
        of a UTF-8 character), an added token's text, else the token decoded alone."""
        token = self.tokenizer.id_to_token(token_id)
        if token is None:
            raise KeyError(f"{token_id} is not a token id of {self.name}")
        if self.is_added(token_id):
            return str(token).encode()
        if self._byte_level:
            return bytes(_UNICODE_TO_BYTE[char] for char in token)
        return self.decode([token_id]).encode()

    def token_id(self, token: str) -> int:
        """The id of a single token, or a clear error if the vocabulary lacks it."""
        found = self.tokenizer.token_to_id(token)
        if found is None:
            raise KeyError(f"{token!r} is not a token of {self.name}")
        return int(found)

    def is_added(self, token_id: int) -> bool:
        """Whether ``token_id`` is an added (control) token such as ``<|im_end|>``."""
        return token_id in self._added_ids

    def __repr__(self) -> str:
        return f"Vocabulary({self.name!r}, size={self.size})"
