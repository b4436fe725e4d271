"""Output ids -> text, incrementally, without ever splitting a character."""

from __future__ import annotations

from collections.abc import Sequence

from protocol_adapters._tokenizer import Vocabulary

_MAX_SPLIT_IDS = 4
"""A UTF-8 character spans at most 4 bytes, so at most 4 trailing ids can hold an unfinished one."""


def strip_stop_ids(ids: Sequence[int], vocabulary: Vocabulary) -> Sequence[int]:
    """``ids`` without the trailing end-of-turn ids (kept by ``no_stop_trim``)."""
    end = len(ids)
    while end and ids[end - 1] in vocabulary.stop_ids:
        end -= 1
    return ids[:end]


class IncrementalDecoder:
    """Decode streamed output ids into text deltas.

    Byte-level tokens can end in the middle of a multi-byte character; such ids are held until the
    character completes, so concatenated deltas equal decoding all ids at once. End-of-turn ids
    are not text and are skipped. One decoder per reply; not thread-safe.
    """

    def __init__(self, vocabulary: Vocabulary) -> None:
        self._vocabulary = vocabulary
        self._held: list[int] = []

    def feed(self, ids: Sequence[int]) -> str:
        stops = self._vocabulary.stop_ids
        self._held.extend(i for i in ids if i not in stops)
        if not self._held:
            return ""
        held = self._held
        for keep in range(min(_MAX_SPLIT_IDS, len(held) - 1) + 1):
            text = self._vocabulary.decode(held[: len(held) - keep])
            if not text.endswith("\ufffd"):
                self._held = held[len(held) - keep :]
                return text
        if len(held) <= _MAX_SPLIT_IDS:
            return ""  # all of it may still be one unfinished character
        self._held = []
        return self._vocabulary.decode(held)  # invalid bytes the model produced itself

    def finish(self) -> str:
        text = self._vocabulary.decode(self._held) if self._held else ""
        self._held.clear()
        return text
