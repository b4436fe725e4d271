"""A session's messages as its last request parsed them: the next request parses only the new.

An agent re-sends its whole conversation on every call: parsing it anew costs the context's
number of messages per turn (~3 ms at 128k tokens, ~210 messages), although all but the last few
are the messages the previous call sent. Each message is keyed by its ``marshal`` form (version 2:
no back-references, so equal content gives equal bytes; types and key order are kept, so ``1``
and ``true``, or the same keys in another order, never share a key: plain ``==`` on decoded JSON
would confuse both) and by the parse state it was read in (for Anthropic, the tool calls the
message before it made). A message whose key and state equal those of the message at its
position in the previous request gets that parse: the same immutable ``Message`` objects,
found at C speed. Anything else is parsed.

Memory: the keys are about as large as the messages' JSON, per session and agent (a large body,
past the server's large-body threshold, is parsed without a memo). A request's parse is kept only
when the whole request parsed; two concurrent requests of one
session each read one snapshot and replace it, so the memo is at worst less useful, never wrong.
"""

from __future__ import annotations

import marshal
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from trajectory_tree import Message


@dataclass(frozen=True, slots=True)
class _Parsed:
    key: bytes
    state: Hashable
    messages: tuple[Message, ...]


class ParseMemo:
    """One session's last parsed messages (per dialect: a session speaks one)."""

    __slots__ = ("_last", "reused")

    def __init__(self) -> None:
        self._last: tuple[_Parsed, ...] = ()
        self.reused = 0
        """Messages whose parse came from the memo (for tests and benchmarks)."""


class MemoPass:
    """One request's messages parsed in order against ``memo`` (``None``: parse every one)."""

    __slots__ = ("_before", "_memo", "_now")

    def __init__(self, memo: ParseMemo | None) -> None:
        self._memo = memo
        self._before = memo._last if memo is not None else ()
        self._now: list[_Parsed] = []

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
        key = marshal.dumps(cast(Any, raw), 2)  # decoded JSON: always marshallable
        before = self._before[index] if index < len(self._before) else None
        if before is not None and before.key == key and before.state == state:
            messages = before.messages
            self._memo.reused += 1
        else:
            messages = tuple(parse(*args))
        self._now.append(_Parsed(key, state, messages))
        return messages

    def keep(self) -> None:
        """The request parsed: its messages are the memo now."""
        if self._memo is not None:
            self._memo._last = tuple(self._now)
