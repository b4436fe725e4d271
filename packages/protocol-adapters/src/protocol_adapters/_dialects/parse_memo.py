"""A session's messages as its last request parsed them: the next request parses only the new.

An agent re-sends its whole conversation on every call: parsing it anew costs the context's
number of messages per turn (~3 ms at 128k tokens, ~210 messages), although all but the last few
are the messages the previous call sent. Messages are compared by their ``marshal`` form
(version 2: no back-references, so equal content gives equal bytes; types and key order are
kept, so ``1`` and ``true``, or the same keys in another order, never compare equal: plain
``==`` on decoded JSON would confuse both) and by the parse state they were read in (for
Anthropic, the tool calls the message before it made).

The usual request re-sends every message of the previous one unchanged and adds a few (a
retry or a sibling: all but the last): the longest run of the previous request's messages that
this one starts with is found with one ``marshal`` of the whole list and a comparison or two of
its bytes with the previous request's (marshal writes a list as a short header and then each
element exactly as it writes it alone), and their parse is taken whole, with no Python work per
message (:meth:`MemoPass.prefix`). Each later message is compared with the message at its
position in the previous request, and gets that parse, the same immutable ``Message`` objects,
when its bytes and state are the same (:meth:`MemoPass.message`). Anything else is parsed.

Memory: the kept bytes are about as large as the messages' JSON, per session and agent (a large
body, past the server's large-body threshold, is parsed without a memo). A request's parse is
kept only when the whole request parsed, as one snapshot; two concurrent requests of one session
each read one snapshot and replace it, so the memo is at worst less useful, never wrong.
"""

from __future__ import annotations

import marshal
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from trajectory_tree import Message

_VERSION = 2
_LIST_HEADER = 5
"""marshal writes a list as a type byte and a 4-byte count, then its elements."""


@dataclass(frozen=True, slots=True)
class _Parsed:
    end: int
    """Where this message's marshal bytes end in its request's ``elements``."""
    state: Hashable
    messages: tuple[Message, ...]


@dataclass(frozen=True, slots=True)
class _Snapshot:
    parsed: tuple[_Parsed, ...] = ()
    elements: bytes = b""
    """The request's messages' marshal bytes, one after another."""
    state_after: Hashable = None
    """The parse state after its last message."""


@dataclass(frozen=True, slots=True)
class Prefix:
    """The leading messages a request re-sent unchanged, already parsed."""

    count: int
    """How many of the request's raw messages these are."""
    messages: tuple[Message, ...]
    state: Hashable
    """The parse state after them (the dialect's initial state when ``count`` is 0)."""


def _common_run(before: _Snapshot, whole: bytes, available: int) -> int:
    """How many of ``before``'s messages ``whole`` (a list's marshal bytes) starts with: the
    usual answers (all of them, all but the last) first, else a binary search (equal bytes up to
    a message's end mean equal messages up to it: marshal's elements delimit themselves)."""
    parsed, elements = before.parsed, before.elements

    def same(count: int) -> bool:
        end = parsed[count - 1].end
        return whole.startswith(memoryview(elements)[:end], _LIST_HEADER)

    top = min(len(parsed), available)
    if top == 0:
        return 0
    if same(top):
        return top
    low, high = 0, top - 1  # same(low) holds (0: vacuously), same(high + 1) does not
    if high > 0 and same(high):
        return high
    high -= 1
    while low < high:
        middle = (low + high + 1) // 2
        if same(middle):
            low = middle
        else:
            high = middle - 1
    return low


class ParseMemo:
    """One session's last parsed messages (per dialect: a session speaks one)."""

    __slots__ = ("_snapshot", "reused")

    def __init__(self) -> None:
        self._snapshot = _Snapshot()
        self.reused = 0
        """Messages whose parse came from the memo (for tests and benchmarks)."""


class MemoPass:
    """One request's messages parsed in order against ``memo`` (``None``: parse every one)."""

    __slots__ = ("_before", "_memo", "_now", "_pieces", "_size")

    def __init__(self, memo: ParseMemo | None) -> None:
        self._memo = memo
        self._before = memo._snapshot if memo is not None else _Snapshot()
        self._now: list[_Parsed] = []
        self._pieces: list[bytes] = []
        self._size = 0

    def prefix(self, raws: Sequence[object], state: Hashable) -> Prefix:
        """The previous request's parse of the longest run of its messages that ``raws`` starts
        with, unchanged, and the parse state after them (``state`` when there are none). Call
        before :meth:`message`."""
        before = self._before
        if self._memo is None or not before.parsed:
            return Prefix(0, (), state)
        whole = marshal.dumps(cast(Any, list(raws)), _VERSION)  # decoded JSON: marshallable
        count = _common_run(before, whole, len(raws))
        if count == 0:
            return Prefix(0, (), state)
        kept = before.parsed[:count]
        end = kept[-1].end
        self._now = list(kept)
        self._pieces = [before.elements if end == len(before.elements) else before.elements[:end]]
        self._size = end
        self._memo.reused += count
        messages = tuple(m for parsed in kept for m in parsed.messages)
        after = before.state_after if count == len(before.parsed) else before.parsed[count].state
        return Prefix(count, messages, after)

    def message(
        self,
        raw: object,
        state: Hashable,
        parse: Callable[..., Sequence[Message]],
        *args: object,
    ) -> tuple[Message, ...]:
        """The next message's parse: the previous request's at this position when ``raw`` and
        ``state`` are the same, else ``parse(*args)``."""
        if self._memo is None:
            return tuple(parse(*args))
        index = len(self._now)
        key = marshal.dumps(cast(Any, raw), _VERSION)  # decoded JSON: always marshallable
        parsed = self._before.parsed
        start = parsed[index - 1].end if 0 < index <= len(parsed) else 0
        before = parsed[index] if index < len(parsed) else None
        if (
            before is not None
            and before.end - start == len(key)
            and self._before.elements.startswith(key, start)
            and before.state == state
        ):
            messages = before.messages
            self._memo.reused += 1
        else:
            messages = tuple(parse(*args))
        self._size += len(key)
        self._pieces.append(key)
        self._now.append(_Parsed(self._size, state, messages))
        return messages

    def keep(self, state_after: Hashable = None) -> None:
        """The request parsed (``state_after``: the parse state after its last message): its
        messages are the memo now."""
        if self._memo is not None:
            elements = self._pieces[0] if len(self._pieces) == 1 else b"".join(self._pieces)
            self._memo._snapshot = _Snapshot(tuple(self._now), elements, state_after)
