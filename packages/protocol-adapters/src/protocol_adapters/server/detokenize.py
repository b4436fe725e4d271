"""Streaming detokenization: text deltas from ids as they arrive, never splitting a character.

Decoding every id on its own breaks multi-byte characters and byte-level merges, and decoding the
whole output on every chunk is quadratic. Like the engines themselves, this keeps a small window:
it decodes from the last emitted boundary, emits only text past what was already emitted, and
holds back while the tail is an incomplete UTF-8 sequence (the replacement character). The text is
for the client and the parser only; training uses the engine's ids, never this text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

Decode = Callable[[Sequence[int]], str]


class IncrementalDetokenizer:
    def __init__(self, decode: Decode) -> None:
        self._decode = decode
        self._ids: list[int] = []
        self._prefix = 0
        self._read = 0

    def feed(self, ids: Sequence[int]) -> str:
        """Append ``ids``; return the text they complete (possibly empty)."""
        self._ids.extend(ids)
        seen = self._decode(self._ids[self._prefix : self._read])
        text = self._decode(self._ids[self._prefix :])
        if len(text) <= len(seen) or text.endswith("\ufffd"):
            return ""
        self._prefix = self._read
        self._read = len(self._ids)
        return text[len(seen) :]

    def flush(self) -> str:
        """Whatever is still held back at the end of generation (a trailing partial character)."""
        seen = self._decode(self._ids[self._prefix : self._read])
        text = self._decode(self._ids[self._prefix :])
        self._read = len(self._ids)
        self._prefix = self._read
        return text[len(seen) :] if len(text) > len(seen) else ""
