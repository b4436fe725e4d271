"""The JSON text of a prompt's token ids, encoded once per session and reused turn by turn.

``/generate`` takes the whole prompt as a JSON list of ids on every call; at 128k tokens that is
~700 KB of text, ~12-20 ms of ``json.dumps`` per turn. But an agent's prompts share their start:
the next turn's prompt extends this one's, a retry repeats it, a sibling (a re-sent request with
another tool result) shares all but its end. So each routing key (one session) keeps the ids it
last sent, packed, their text, and where in the text every :data:`STRIDE`-th id ends; the next
prompt reuses the text of the longest shared prefix, to the last such mark (found with C-speed
byte comparisons), and encodes only the ids after it.

Memory is bounded (``max_bytes``; least recently used keys go first): an entry holds ~9.5 bytes
per id (4 packed, ~5.5 of text), ~1.2 MB at 128k ids.
"""

from __future__ import annotations

import json
import threading
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

STRIDE = 1024
"""Ids between two marks: a prompt reuses the shared prefix's text to a mark."""


def packed(ids: Sequence[int]) -> array[int]:
    """``ids`` as a signed 32-bit array (the token ids' type everywhere in the adapter), without a
    copy when they already are one."""
    if isinstance(ids, array) and ids.typecode == "i":
        return ids
    return array("i", ids)


@dataclass(frozen=True, slots=True)
class Encoded:
    """Ids (packed), the inside of their JSON list (``1,2,3``: what ``json.dumps`` writes), and
    ``marks[j]``: the length of the text of the first ``(j + 1) * STRIDE`` ids."""

    raw: bytes
    text: str
    marks: tuple[int, ...]

    @property
    def cost(self) -> int:
        return len(self.raw) + len(self.text) + 8 * len(self.marks)


def encode(ids: Sequence[int], after: Encoded | None = None, known: int = 0) -> Encoded:
    """``ids`` encoded, reusing ``after``'s text for the first ``known`` ids (a multiple of
    :data:`STRIDE`, and ``after`` holds at least that many ids that ``ids`` start with)."""
    values = packed(ids)
    if after is None or known == 0:
        text, marks, start = "", [], 0
    else:
        marks = list(after.marks[: known // STRIDE])
        text, start = after.text[: marks[-1]], known
    pieces = [text] if text else []
    length = len(text)
    for begin in range(start, len(values), STRIDE):
        piece = json.dumps(values[begin : begin + STRIDE].tolist(), separators=(",", ":"))[1:-1]
        if pieces:
            piece = "," + piece
        pieces.append(piece)
        length += len(piece)
        if begin + STRIDE <= len(values):
            marks.append(length)
    return Encoded(values.tobytes(), "".join(pieces), tuple(marks))


class IdsJson:
    """Per routing key, the last ids sent and their text. Thread-safe: the engine client encodes
    large prompts on worker threads."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, Encoded] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()
        self.reused_ids = 0
        """Ids whose text came from an earlier call (a counter for tests and benchmarks)."""

    @property
    def size(self) -> int:
        """Bytes held."""
        return self._size

    def plan(self, key: str | None, ids: Sequence[int]) -> tuple[Encoded | None, int]:
        """``key``'s entry and how many of ``ids`` its text covers (0: encode them all)."""
        if key is None or self.max_bytes == 0:
            return None, 0
        with self._lock:
            entry = self._entries.get(key)
        if entry is None:
            return None, 0
        known = _shared_marks(packed(ids).tobytes(), entry)
        return (entry, known) if known else (None, 0)

    def text(self, key: str | None, ids: Sequence[int]) -> str:
        """The inside of the JSON list of ``ids``; reuses, then replaces, ``key``'s entry."""
        entry, known = self.plan(key, ids)
        return self.keep(key, encode(ids, entry, known), known)

    def keep(self, key: str | None, encoded: Encoded, reused: int = 0) -> str:
        """Remember ``encoded`` as ``key``'s last prompt (``reused`` of its ids came from the
        entry it replaces); returns its text."""
        if key is None or self.max_bytes == 0:
            return encoded.text
        with self._lock:
            self.reused_ids += reused
            dropped = self._entries.pop(key, None)
            if dropped is not None:
                self._size -= dropped.cost
            if encoded.cost <= self.max_bytes:
                self._entries[key] = encoded
                self._size += encoded.cost
            while self._size > self.max_bytes:
                _, dropped = self._entries.popitem(last=False)
                self._size -= dropped.cost
        return encoded.text

    def forget(self, key: str) -> None:
        """Drop ``key``'s entry (its session ended)."""
        with self._lock:
            entry = self._entries.pop(key, None)
            if entry is not None:
                self._size -= entry.cost


def _shared_marks(raw: bytes, entry: Encoded) -> int:
    """Ids (a multiple of :data:`STRIDE`) at the start of ``raw`` that ``entry`` holds the same
    and has marked: all of its marks when ``raw`` extends it, else found by binary search."""
    width = STRIDE * 4
    with memoryview(entry.raw) as old:
        marks = len(entry.marks)
        if raw.startswith(old[: marks * width]):
            return marks * STRIDE
        low, high = 0, marks  # a prefix of `low` marks is shared, one of `high` is not
        while high - low > 1:
            middle = (low + high) // 2
            if raw.startswith(old[: middle * width]):
                low = middle
            else:
                high = middle
        return low * STRIDE
