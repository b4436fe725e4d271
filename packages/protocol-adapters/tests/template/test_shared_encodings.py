"""A long text many turns ask for at once (a batch's shared first request) is tokenized once,
and every caller gets exactly what tokenizing it would give, with a list of its own."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from tokenizers import Tokenizer

from protocol_adapters._tokenizer import TooManyTokens, Vocabulary
from protocol_adapters._tokenizer.shared import MAX_SHARED_CHARS, SHARED_CHARS

SYSTEM = "".join(
    f"You are agent number {i}. Read the repository, run the tests, fix what fails.\n"
    for i in range(400)
)
"""~30k characters: a system prompt and tools' length, one piece for the tokenizer."""


class CountingTokenizer:
    """The real tokenizer, counting (and optionally slowing) the texts it encodes."""

    def __init__(self, real: Tokenizer) -> None:
        self._real = real
        self.encoded: list[str] = []
        self.delay = 0.0

    def encode_batch_fast(self, texts: list[str], *, add_special_tokens: bool) -> Any:
        return self._counted(self._real.encode_batch_fast, texts, add_special_tokens)

    def encode_batch(self, texts: list[str], *, add_special_tokens: bool) -> Any:
        return self._counted(self._real.encode_batch, texts, add_special_tokens)

    def _counted(self, encode: Callable[..., Any], texts: list[str], special: bool) -> Any:
        self.encoded.extend(texts)
        time.sleep(self.delay)
        return encode(texts, add_special_tokens=special)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


@pytest.fixture
def counted(qwen_vocabulary: Vocabulary) -> tuple[Vocabulary, CountingTokenizer]:
    tokenizer = CountingTokenizer(qwen_vocabulary.tokenizer)
    vocabulary = Vocabulary(tokenizer, "counted")  # type: ignore[arg-type]  # a stand-in
    vocabulary.encode_with_starts("warm up: the byte lengths' checks encode samples")
    tokenizer.encoded.clear()
    return vocabulary, tokenizer


def exact(vocabulary: Vocabulary, text: str) -> tuple[list[int], list[int]]:
    """Ids and starts of ``text`` encoded afresh, nothing shared."""
    ids, starts = vocabulary._encode_with_starts(text, None)
    return ids, list(starts)


def test_a_long_text_asked_again_is_not_tokenized_again(
    counted: tuple[Vocabulary, CountingTokenizer],
) -> None:
    vocabulary, tokenizer = counted
    first = vocabulary.encode_with_starts(SYSTEM)
    assert tokenizer.encoded == [SYSTEM]
    again = vocabulary.encode_with_starts("".join(list(SYSTEM)))  # equal text, another object
    assert tokenizer.encoded == [SYSTEM]
    expected = exact(vocabulary, SYSTEM)
    assert (first[0], list(first[1])) == expected
    assert (again[0], list(again[1])) == expected


def test_a_text_asked_by_many_threads_at_once_is_tokenized_once(
    counted: tuple[Vocabulary, CountingTokenizer],
) -> None:
    vocabulary, tokenizer = counted
    tokenizer.delay = 0.2  # every caller arrives while the first is still tokenizing
    start = threading.Barrier(6)

    def ask() -> tuple[list[int], list[int]]:
        start.wait()
        ids, starts = vocabulary.encode_with_starts(SYSTEM)
        return ids, list(starts)

    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda _: ask(), range(6)))
    assert tokenizer.encoded == [SYSTEM]
    tokenizer.delay = 0.0
    expected = exact(vocabulary, SYSTEM)
    assert all(answer == expected for answer in answers)
    assert len({id(ids) for ids, _ in answers}) == 6  # a list of each caller's own


def test_a_callers_list_is_its_own(counted: tuple[Vocabulary, CountingTokenizer]) -> None:
    vocabulary, _ = counted
    mine, _ = vocabulary.encode_with_starts(SYSTEM)
    mine.append(-1)
    theirs, _ = vocabulary.encode_with_starts(SYSTEM)
    assert theirs == exact(vocabulary, SYSTEM)[0]


def test_a_shared_text_still_keeps_each_callers_token_limit(
    counted: tuple[Vocabulary, CountingTokenizer],
) -> None:
    vocabulary, _ = counted
    tokens = len(vocabulary.encode_with_starts(SYSTEM)[0])
    assert len(vocabulary.encode_with_starts(SYSTEM, max_tokens=tokens)[0]) == tokens
    with pytest.raises(TooManyTokens):
        vocabulary.encode_with_starts(SYSTEM, max_tokens=tokens - 1)


def test_when_the_first_caller_fails_a_waiting_one_tokenizes_the_text_itself(
    counted: tuple[Vocabulary, CountingTokenizer],
) -> None:
    """The first caller's limit is its own: its failure is not the waiting caller's answer, and
    nothing is kept from it."""
    vocabulary, tokenizer = counted
    tokenizer.delay = 0.3
    with ThreadPoolExecutor(2) as pool:
        limited = pool.submit(vocabulary.encode_with_starts, SYSTEM, max_tokens=10)
        time.sleep(0.1)
        unlimited = pool.submit(vocabulary.encode_with_starts, SYSTEM)
        with pytest.raises(TooManyTokens):
            limited.result()
        ids, starts = unlimited.result()
    tokenizer.delay = 0.0
    assert (ids, list(starts)) == exact(vocabulary, SYSTEM)
    assert tokenizer.encoded == [SYSTEM, SYSTEM, SYSTEM]  # the failure, the waiter, exact()


@pytest.mark.parametrize("length", [SHARED_CHARS - 1, MAX_SHARED_CHARS + 1])
def test_texts_too_short_or_too_long_to_share_are_tokenized_each_time(
    counted: tuple[Vocabulary, CountingTokenizer], length: int
) -> None:
    vocabulary, tokenizer = counted
    text = (SYSTEM * (length // len(SYSTEM) + 1))[:length]
    first = vocabulary.encode_with_starts(text)
    pieces = len(tokenizer.encoded)
    second = vocabulary.encode_with_starts(text)
    assert first[0] == second[0]
    assert pieces >= 1
    assert len(tokenizer.encoded) == 2 * pieces
