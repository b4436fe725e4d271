"""Encoding long text in pieces: the same ids and token starts as one encode, bounded memory, and an
early stop once a limit is passed (a 20 MB request is refused after the limit, not at its end).
And the bridge's cuts at span ends, read lazily from the pieces' encodings or found from the
tokens' byte lengths, exactly as from a list of every token's offsets."""

from __future__ import annotations

import unicodedata
from bisect import bisect_left
from collections.abc import Callable, Sequence
from itertools import accumulate
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Regex, Tokenizer, normalizers, pre_tokenizers, processors

from protocol_adapters._bridge.bridge import segment_ids
from protocol_adapters._tokenizer import TooManyTokens, Vocabulary
from protocol_adapters._tokenizer import pieces as pieces_module
from protocol_adapters._tokenizer import token_starts as token_starts_module
from protocol_adapters._tokenizer import vocabulary as vocabulary_module
from trajectory_tree import LossReason

SMALL = Path(__file__).parent.parent / "fixtures" / "small_tokenizer.json"

# Text built from what moves pre-token boundaries: runs of spaces, newlines, punctuation runs
# before newlines, digits, contractions, special tokens, combining marks, CJK, emoji.
ATOMS = [
    "def",
    " self",
    "x",
    "  ",
    "   ",
    "\n",
    "\n\n",
    " \n",
    ".\n",
    "...",
    "'s",
    "'ll",
    "0",
    "42",
    "3.14",
    "猫",
    "é",
    "e\u0301",
    "\u0301",
    "\t",
    "\r\n",
    "\U0001f600",
    "<|im_end|>",
    "<tool_call>",
    "_",
    "ab12cd",
    "<|im_start|>",
    "<|im_start|>user\n",
    "a\u0301\u0316",  # NFC reorders the marks, then composes: characters no token covers
    "\u0316\u0301",
    "    ",
    "\n\n\n",
    "\t\t \n",
]
TEXTS = st.lists(st.sampled_from(ATOMS), max_size=400).map("".join)


def one_encode(vocabulary: Vocabulary, text: str) -> tuple[list[int], list[int]]:
    """Ids and token starts of ``text`` encoded in one call, with no pieces."""
    (encoding,) = vocabulary.tokenizer.encode_batch([text], add_special_tokens=False)
    return list(encoding.ids), [begin for begin, _ in encoding.offsets]


def encoded(vocabulary: Vocabulary, text: str) -> tuple[list[int], list[int]]:
    """Ids and token starts as the vocabulary encodes ``text`` (in pieces), as plain lists."""
    ids, starts = vocabulary.encode_with_starts(text)
    return ids, list(starts)


@pytest.fixture
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pieces of a few characters, so every test text is cut many times."""
    monkeypatch.setattr(vocabulary_module, "PIECE_CHARS", 7)


# The fixture only patches a constant, the same for every example.
ONE_PATCH = [HealthCheck.function_scoped_fixture]


@settings(max_examples=300, deadline=None, suppress_health_check=ONE_PATCH)
@given(text=TEXTS)
def test_pieces_encode_exactly_as_the_whole_text(
    qwen_vocabulary: Vocabulary, small_pieces: None, text: str
) -> None:
    ids, starts = encoded(qwen_vocabulary, text)
    assert (ids, starts) == one_encode(qwen_vocabulary, text)
    assert qwen_vocabulary.encode(text) == ids
    assert qwen_vocabulary.count(text) == len(ids)


@settings(max_examples=100, deadline=None, suppress_health_check=ONE_PATCH)
@given(text=st.text(max_size=300))
def test_pieces_of_any_text_encode_exactly(
    qwen_vocabulary: Vocabulary, small_pieces: None, text: str
) -> None:
    assert encoded(qwen_vocabulary, text) == one_encode(qwen_vocabulary, text)


def test_the_small_fixture_tokenizer_is_cut_too(small_pieces: None) -> None:
    small = Vocabulary.from_file(SMALL)
    text = "def f(x):\n    return x + 12  # done\n" * 50
    assert encoded(small, text) == one_encode(small, text)


def test_a_limit_stops_encoding_early(qwen_vocabulary: Vocabulary) -> None:
    text = "print('hello world', 12345)\n" * 200_000  # 5.6 MB, about 1.8M tokens
    with pytest.raises(TooManyTokens) as caught:
        qwen_vocabulary.encode(text, max_tokens=32768)
    counted = caught.value.counted
    assert counted > 32768
    # One piece past the limit, not the whole text: a lower bound, far below the truth.
    assert counted <= qwen_vocabulary.count(text[: 32768 * 4 + vocabulary_module.PIECE_CHARS])
    with pytest.raises(TooManyTokens):
        qwen_vocabulary.encode_with_starts(text, max_tokens=32768)
    with pytest.raises(TooManyTokens):  # a short text (one piece) is held to the limit too
        qwen_vocabulary.encode("short text that is longer than two tokens", max_tokens=2)
    assert qwen_vocabulary.encode("short", max_tokens=2) == qwen_vocabulary.encode("short")


def test_a_rest_a_little_past_a_piece_is_not_cut(qwen_vocabulary: Vocabulary) -> None:
    """A tail of a few characters would cost a second encode call for nothing: a rest up to an
    eighth past ``PIECE_CHARS`` is one piece; past that it is cut."""
    size = vocabulary_module.PIECE_CHARS
    line = "x = 1\n"
    whole = line * ((size + size // 8) // len(line))
    assert len(whole) > size
    assert len(list(qwen_vocabulary._encoded(whole, None))) == 1
    assert len(list(qwen_vocabulary._encoded(whole + line * 10, None))) == 2


LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
O200K_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+"
    r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def split_then_bytes(pattern: str) -> pre_tokenizers.PreTokenizer:
    """A regex split then the byte-level mapping, as Llama 3's and GPT-OSS's tokenizers do."""
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def gpt2_bytes() -> pre_tokenizers.PreTokenizer:
    """GPT-2's byte-level pre-tokenizer, its regex built in."""
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


OTHER_PRE_TOKENIZERS: dict[str, Callable[[], pre_tokenizers.PreTokenizer]] = {
    "gpt2": gpt2_bytes,
    "llama3": lambda: split_then_bytes(LLAMA3_SPLIT),
    "o200k": lambda: split_then_bytes(O200K_SPLIT),
}


@pytest.fixture(params=sorted(OTHER_PRE_TOKENIZERS))
def other_vocabulary(request: pytest.FixtureRequest, qwen_vocabulary: Vocabulary) -> Vocabulary:
    """Qwen3's real BPE model and added tokens behind another family's pre-tokenizer."""
    tokenizer = Tokenizer.from_str(qwen_vocabulary.tokenizer.to_str())
    tokenizer.pre_tokenizer = OTHER_PRE_TOKENIZERS[request.param]()
    return Vocabulary(tokenizer, request.param)


def test_other_pre_tokenizers_get_their_own_cuts(other_vocabulary: Vocabulary) -> None:
    assert isinstance(other_vocabulary._cut, pieces_module.PreTokenizerCuts)


@settings(max_examples=150, deadline=None, suppress_health_check=ONE_PATCH)
@given(text=TEXTS | st.text(max_size=300))
def test_pieces_cut_by_another_pre_tokenizer_encode_exactly(
    other_vocabulary: Vocabulary, small_pieces: None, text: str
) -> None:
    assert encoded(other_vocabulary, text) == one_encode(other_vocabulary, text)


def test_another_pre_tokenizer_stops_early_too(other_vocabulary: Vocabulary) -> None:
    text = "print('hello world', 12345)\n" * 200_000  # 5.6 MB
    with pytest.raises(TooManyTokens) as caught:
        other_vocabulary.count(text, max_tokens=32768)
    assert caught.value.counted <= 32768 + other_vocabulary.count(text[:40_000])


@pytest.mark.parametrize(
    "pre_tokenizer",
    [
        pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True),  # a space added first
        pre_tokenizers.Metaspace(prepend_scheme="first"),  # "▁" before the first piece only
        pre_tokenizers.Split(Regex(r"(?<=a)b"), behavior="isolated"),  # looks back
    ],
)
def test_a_pre_tokenizer_whose_pieces_could_differ_is_encoded_whole(
    qwen_vocabulary: Vocabulary, small_pieces: None, pre_tokenizer: pre_tokenizers.PreTokenizer
) -> None:
    tokenizer = Tokenizer.from_str(qwen_vocabulary.tokenizer.to_str())
    tokenizer.pre_tokenizer = pre_tokenizer
    whole = Vocabulary(tokenizer, "uncut")
    assert whole._cut is None
    text = "x \n\nfoo bar 12\n" * 20
    assert encoded(whole, text) == one_encode(whole, text)


def test_a_cutter_that_fails_the_check_at_load_is_not_used(
    qwen_vocabulary: Vocabulary, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The load check is what stands behind a generic cutter: one that cuts where the
    tokenizer would not (here: anywhere) must be refused."""
    monkeypatch.setattr(
        pieces_module.PreTokenizerCuts, "__call__", lambda self, text, start, size: start + 1
    )
    tokenizer = Tokenizer.from_str(qwen_vocabulary.tokenizer.to_str())
    tokenizer.pre_tokenizer = OTHER_PRE_TOKENIZERS["gpt2"]()
    assert Vocabulary(tokenizer, "gpt2")._cut is None


@settings(max_examples=200, deadline=None)
@given(text=TEXTS | st.text(max_size=500))
def test_the_lower_bound_never_passes_the_count(qwen_vocabulary: Vocabulary, text: str) -> None:
    """`at_least` decides a prompt is over its limit without encoding it: it must never claim
    more tokens than the text really has (combining marks, special tokens, emoji included)."""
    assert qwen_vocabulary.at_least(text) <= qwen_vocabulary.count(text)


def test_a_huge_word_over_the_limit_is_refused_without_encoding_it(
    qwen_vocabulary: Vocabulary,
) -> None:
    """A 20 MB word has no cut point: encoding it would take seconds and gigabytes. When even
    the lower bound passes the limit, it is refused before the tokenizer sees it: the count in
    the refusal is that bound, not a count of the word."""
    word = "a" * 20_000_000
    bound = qwen_vocabulary.at_least(word)
    assert bound > 4096
    with pytest.raises(TooManyTokens) as caught:
        qwen_vocabulary.count(word, max_tokens=4096)
    assert caught.value.counted == bound
    with pytest.raises(TooManyTokens):  # after pieces that fit, the word is still refused
        qwen_vocabulary.encode("x " * 1_000 + word, max_tokens=4096)


# -- the bridge's cuts: lazy token starts against every token's offsets ------------------------


def offsets_as_before(vocabulary: Vocabulary, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Ids and offsets as ``Vocabulary.encode_with_offsets`` gave them (its code, kept here):
    every piece encoded with offsets."""
    ids: list[int] = []
    offsets: list[tuple[int, int]] = []
    for start, _, encoding, _ in vocabulary._encoded(text, None, lambda piece: False):
        ids.extend(encoding.ids)
        offsets.extend((begin + start, end + start) for begin, end in encoding.offsets)
    return ids, offsets


REASONS = st.sampled_from(
    [LossReason.CONTEXT, LossReason.TOOL_OUTPUT, LossReason.TEMPLATE_SCAFFOLD]
)


@st.composite
def spans_of(
    draw: st.DrawFn, length: int, near: Sequence[int] = ()
) -> list[tuple[int, LossReason]]:
    """Span ends anywhere in (and just past) a text of ``length``, or within a few characters
    of ``near``; in order as the bridge's labels are, or not."""
    position = st.integers(0, length + 2)
    if near:
        position |= st.sampled_from(near).flatmap(lambda at: st.integers(at - 3, at + 3))
    ends = draw(st.lists(position, min_size=1, max_size=12))
    if draw(st.booleans()):
        ends.sort()
    return [(end, draw(REASONS)) for end in ends]


def assert_cut_as_before(
    vocabulary: Vocabulary, text: str, spans: Sequence[tuple[int, LossReason]]
) -> None:
    """The cut as it was: ``segment_ids`` (whose loop is unchanged) bisected a list of every
    token's start, taken from the offsets."""
    ids, starts = vocabulary.encode_with_starts(text)
    before_ids, offsets = offsets_as_before(vocabulary, text)
    assert ids == before_ids
    before = segment_ids(ids, [begin for begin, _ in offsets], spans)
    assert segment_ids(ids, starts, spans) == before


@settings(max_examples=300, deadline=None, suppress_health_check=ONE_PATCH)
@given(text=TEXTS | st.text(max_size=300), data=st.data())
def test_cuts_at_span_ends_are_as_with_every_offset(
    qwen_vocabulary: Vocabulary, small_pieces: None, text: str, data: st.DataObject
) -> None:
    """Pieces of a few characters: a span end falls in any piece, at its start, or past all."""
    assert_cut_as_before(qwen_vocabulary, text, data.draw(spans_of(len(text))))


@settings(max_examples=15, deadline=None)
@given(unit=TEXTS.filter(bool), data=st.data())
def test_cuts_in_text_of_real_pieces_are_as_with_every_offset(
    qwen_vocabulary: Vocabulary, unit: str, data: st.DataObject
) -> None:
    """Text past ``PIECE_CHARS`` (two pieces of the real size), span ends near the join too."""
    text, join = real_pieces(qwen_vocabulary, unit)
    assert_cut_as_before(qwen_vocabulary, text, data.draw(spans_of(len(text), [join])))


def real_pieces(vocabulary: Vocabulary, unit: str) -> tuple[str, int]:
    """Lines of ``unit`` that start with a letter (so the text can be cut between them) past
    ``PIECE_CHARS``, and where the first piece ends."""
    line = "x" + unit + "\n"
    text = line * (vocabulary_module.PIECE_CHARS * 3 // 2 // len(line) + 1)
    assert vocabulary._cut is not None
    join = vocabulary._cut(text, 0, vocabulary_module.PIECE_CHARS)
    assert join < len(text)
    return text, join


@settings(max_examples=300, deadline=None)
@given(
    gaps=st.lists(st.lists(st.integers(0, 3), max_size=6), min_size=1, max_size=5),
    position=st.integers(-1, 40),
    lo=st.integers(0, 30),
)
def test_the_search_for_a_span_end_is_a_bisect(
    gaps: list[list[int]], position: int, lo: int
) -> None:
    """``first_from`` searches one piece; it answers as ``bisect_left`` over every start, ``lo``
    included (the bridge's cut never moves back, so only this test sees a ``lo`` past it)."""
    pieces: list[tuple[int, Sequence[int]]] = []
    at = 0
    for piece_gaps in gaps:  # each piece's starts, relative to its first character
        piece = list(accumulate(piece_gaps, initial=0))[:-1] if piece_gaps else []
        pieces.append((at, piece))
        at += (piece[-1] if piece else 0) + 1 + (piece_gaps[-1] if piece_gaps else 0)
    starts = token_starts_module.TokenStarts(pieces)
    every = list(starts)
    assume(lo <= len(every))
    expected = bisect_left(every, position, lo)
    assert starts.first_from(position, lo) == expected
    assert token_starts_module.first_token_from(starts, position, lo) == expected
    assert token_starts_module.first_token_from(every, position, lo) == expected


def test_token_starts_read_as_a_sequence(qwen_vocabulary: Vocabulary, small_pieces: None) -> None:
    text = "def f(x):\n    return x  # é e\u0301 猫 \U0001f600<|im_end|>\n" * 3
    ids, starts = qwen_vocabulary.encode_with_starts(text)
    expected = [begin for begin, _ in offsets_as_before(qwen_vocabulary, text)[1]]
    assert len(starts) == len(ids) == len(expected)
    assert list(starts) == expected
    assert starts[-1] == expected[-1]
    assert starts[3:9] == expected[3:9]
    assert starts[::-5] == expected[::-5]
    with pytest.raises(IndexError):
        starts[len(expected)]
    with pytest.raises(IndexError):
        starts[-len(expected) - 1]
    empty_ids, empty = qwen_vocabulary.encode_with_starts("")
    assert (empty_ids, list(empty)) == ([], [])


# -- token starts from byte lengths, against the offsets ----------------------------------------


class CountingTokenizer:
    """A real tokenizer that counts its calls of ``encode_batch`` (with offsets) and
    ``encode_batch_fast`` (without)."""

    def __init__(self, inner: Tokenizer) -> None:
        self._inner = inner
        self.with_offsets = 0
        self.without = 0

    def encode_batch(self, texts: list[str], **kwargs: Any) -> Any:
        self.with_offsets += 1
        return self._inner.encode_batch(texts, **kwargs)

    def encode_batch_fast(self, texts: list[str], **kwargs: Any) -> Any:
        self.without += 1
        return self._inner.encode_batch_fast(texts, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def counted(tokenizer: Tokenizer, name: str = "counted") -> tuple[Vocabulary, CountingTokenizer]:
    """A vocabulary over ``tokenizer`` whose encode calls are counted, its checks at load done."""
    counting = CountingTokenizer(tokenizer)
    vocabulary = Vocabulary(counting, name)  # type: ignore[arg-type]
    vocabulary._byte_lengths()
    counting.with_offsets = counting.without = 0
    return vocabulary, counting


@pytest.fixture(scope="module")
def counted_qwen(qwen_vocabulary: Vocabulary) -> tuple[Vocabulary, CountingTokenizer]:
    return counted(qwen_vocabulary.tokenizer, "qwen3")


# Beside ATOMS: what NFC changes (Hangul jamo that compose, a singleton, marks out of order),
# and NFC text a token may begin inside a character of (letters with marks, rare emoji).
STARTS_ATOMS = [
    *ATOMS,
    "\u1100\u1161",  # L + V jamo: NFC makes one syllable
    "\uac00\u11a8",  # LV syllable + T jamo: the same
    "\u1100",
    "\u11a8",
    "\u212b",  # the angstrom sign: NFC makes it Å
    "x\u0301\u0316",  # NFC reorders the marks only: the same length
    "ἀἁἂ",
    "\U0001fae8",
    "—",
    "✓",
    "<think>",
    "<|endoftext|>",
]
STARTS_TEXTS = st.lists(st.sampled_from(STARTS_ATOMS), max_size=300).map("".join)


def assert_starts_as_with_offsets(
    vocabulary: Vocabulary, text: str, spans: Sequence[tuple[int, LossReason]]
) -> None:
    """The ids, every start, and the bridge's cuts as from ``encode_batch``'s offsets."""
    ids, starts = vocabulary.encode_with_starts(text)
    before_ids, offsets = offsets_as_before(vocabulary, text)
    before = [begin for begin, _ in offsets]
    assert ids == before_ids
    assert list(starts) == before
    assert segment_ids(ids, starts, spans) == segment_ids(ids, before, spans)


@settings(max_examples=300, deadline=None, suppress_health_check=ONE_PATCH)
@given(text=STARTS_TEXTS | st.text(max_size=300), small=st.booleans(), data=st.data())
def test_starts_from_byte_lengths_are_the_offsets_starts(
    counted_qwen: tuple[Vocabulary, CountingTokenizer],
    monkeypatch: pytest.MonkeyPatch,
    text: str,
    small: bool,
    data: st.DataObject,
) -> None:
    """Any text, in pieces of a few characters or whole: NFC text is encoded once, without
    offsets; text NFC changes is encoded with them (no piece encoded twice either way)."""
    vocabulary, counting = counted_qwen
    with monkeypatch.context() as patch:
        if small:
            patch.setattr(vocabulary_module, "PIECE_CHARS", 7)
        counting.with_offsets = counting.without = 0
        vocabulary.encode_with_starts(text)
        calls = (counting.with_offsets, counting.without)
        assert_starts_as_with_offsets(vocabulary, text, data.draw(spans_of(len(text))))
    if unicodedata.is_normalized("NFC", text):
        assert calls[0] == 0
    if not small:
        assert sum(calls) == 1


@settings(max_examples=10, deadline=None)
@given(unit=STARTS_TEXTS.filter(bool), data=st.data())
def test_starts_from_byte_lengths_in_text_of_real_pieces(
    qwen_vocabulary: Vocabulary, unit: str, data: st.DataObject
) -> None:
    """Text past ``PIECE_CHARS``, cut in pieces of the real size, span ends near the join."""
    text, join = real_pieces(qwen_vocabulary, unit)
    assert_starts_as_with_offsets(qwen_vocabulary, text, data.draw(spans_of(len(text), [join])))


@settings(max_examples=100, deadline=None)
@given(
    text=STARTS_TEXTS.filter(lambda text: unicodedata.is_normalized("NFC", text)), data=st.data()
)
def test_a_wrong_byte_length_is_caught_and_the_offsets_read(
    qwen_vocabulary: Vocabulary, text: str, data: st.DataObject
) -> None:
    """The guard: one token's length off by any amount, and the lengths no longer add up to
    the text's; its piece is encoded again with offsets, and every start is still right."""
    vocabulary, counting = counted(qwen_vocabulary.tokenizer)
    ids = vocabulary.encode(text)
    assume(ids)
    lengths = vocabulary._byte_lengths()
    assert lengths is not None
    wrong = data.draw(st.sampled_from(ids))
    lengths._lengths[wrong] += data.draw(st.integers(-3, 3).filter(bool))
    counting.with_offsets = 0
    assert_starts_as_with_offsets(vocabulary, text, [(len(text), LossReason.CONTEXT)])
    assert counting.with_offsets == 2  # the guard's encode, then offsets_as_before's


def test_an_added_token_that_strips_spaces_is_caught(qwen_vocabulary: Vocabulary) -> None:
    """Such a token covers more of the text than its content: the lengths fall short."""
    tokenizer = Tokenizer.from_str(qwen_vocabulary.tokenizer.to_str())
    tokenizer.add_tokens([AddedToken("<mark>", lstrip=True, rstrip=True)])
    vocabulary, counting = counted(tokenizer)
    assert vocabulary._byte_lengths() is not None
    text = "def f():   <mark>  return 1\n"
    assert_starts_as_with_offsets(vocabulary, text, [(len(text), LossReason.CONTEXT)])
    assert (counting.with_offsets, counting.without) == (2, 1)
    assert_starts_as_with_offsets(vocabulary, "x = 1\n", [(6, LossReason.CONTEXT)])
    assert (counting.with_offsets, counting.without) == (3, 2)  # no mark: no second encode


def test_the_fixture_tokenizer_is_byte_level_too(small_pieces: None) -> None:
    vocabulary, counting = counted(Tokenizer.from_file(str(SMALL)))
    assert vocabulary._byte_lengths() is not None
    text = "def f(x):\n    return x + 12  # é 猫 \U0001f600 done\n" * 20
    assert_starts_as_with_offsets(vocabulary, text, [(len(text) // 2, LossReason.CONTEXT)])
    assert counting.with_offsets == counting.without  # offsets_as_before's encodes only


def not_byte_level(qwen_vocabulary: Vocabulary, step: str) -> Tokenizer:
    """Qwen3's tokenizer with one step that could add, drop or move text, or trim offsets."""
    tokenizer = Tokenizer.from_str(qwen_vocabulary.tokenizer.to_str())
    if step == "lowercase":
        tokenizer.normalizer = normalizers.Lowercase()
    elif step == "nfkc":
        tokenizer.normalizer = normalizers.NFKC()
    elif step == "prefix space":
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    elif step == "metaspace":
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    elif step == "removed":
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(r"\s+"), behavior="removed"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    elif step == "no byte level":
        tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    elif step == "trimmed offsets":
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=True)
    return tokenizer


@pytest.mark.parametrize(
    "step",
    [
        "lowercase",
        "nfkc",
        "prefix space",
        "metaspace",
        "removed",
        "no byte level",
        "trimmed offsets",
    ],
)
def test_a_pipeline_that_may_change_text_reads_the_offsets(
    qwen_vocabulary: Vocabulary, step: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused by the pipeline's description, before the sample at load is tried."""
    tokenizer = not_byte_level(qwen_vocabulary, step)
    with monkeypatch.context() as patch:
        patch.setattr(token_starts_module, "_agrees", lambda tokenizer, lengths: True)
        assert token_starts_module.byte_lengths_for(tokenizer) is None
    vocabulary, counting = counted(tokenizer)
    assert vocabulary._byte_lengths() is None
    text = "def F(x):\n    return  x + 12  # é 猫 done\n" * 3
    assert_starts_as_with_offsets(vocabulary, text, [(len(text) // 2, LossReason.CONTEXT)])
    assert counting.without == 0


def test_lengths_the_sample_at_load_contradicts_are_not_used(
    qwen_vocabulary: Vocabulary, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check at load stands behind the pipeline's description: starts that differ from the
    offsets' (here: byte starts taken for character starts) turn the lengths off."""
    monkeypatch.setattr(
        token_starts_module.Utf8Starts, "_at", lambda self, index: self._starts[index]
    )
    assert token_starts_module.byte_lengths_for(qwen_vocabulary.tokenizer) is None
