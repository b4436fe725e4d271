"""A session's messages as its last request parsed them: the next request parses only the new.

An agent re-sends its whole conversation on every call: parsing it anew costs the context's
number of messages per turn (~3 ms at 128k tokens, ~210 messages), although all but the last few
are the messages the previous call sent. Messages are compared by their ``marshal`` form
(version 2: no back-references, so equal content gives equal bytes; types and key order are
kept, so ``1`` and ``true``, or the same keys in another order, never compare equal: plain
``==`` on decoded JSON would confuse both) and by the parse state they were read in (for
Anthropic, the tool calls the message before it made).

The usual request re-sends every message of the previous one unchanged and adds a few: that is
found with one ``marshal`` of the whole list and one comparison of its bytes with the previous
request's (marshal writes a list as a short header and then each element exactly as it writes
it alone), and the previous parse is taken whole, with no Python work per message
(:meth:`MemoPass.prefix`). Otherwise each message is compared with the message at its position
in the previous request, and gets that parse, the same immutable ``Message`` objects, when its
bytes and state are the same (:meth:`MemoPass.message`). Anything else is parsed.

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
        """Every message of the previous request, parsed, when ``raws`` starts with all of them
        unchanged; else none (``state`` unchanged). Call before :meth:`message`."""
        before = self._before
        if self._memo is None or not before.parsed or len(raws) < len(before.parsed):
            return Prefix(0, (), state)
        whole = marshal.dumps(cast(Any, list(raws)), _VERSION)  # decoded JSON: marshallable
        if not whole.startswith(before.elements, _LIST_HEADER):
            return Prefix(0, (), state)
        self._now = list(before.parsed)
        self._pieces = [before.elements]
        self._size = len(before.elements)
        self._memo.reused += len(before.parsed)
        messages = tuple(m for parsed in before.parsed for m in parsed.messages)
        return Prefix(len(before.parsed), messages, before.state_after)

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
