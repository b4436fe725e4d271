"""The built-in streaming reply parser: text deltas in, ReplyEvents out as soon as they are certain.

One small state machine over three modes (text, reasoning, inside a tool-call block) and the
markers of the configured format (``<think>``, ``</think>``, and the call markers of
:mod:`.syntax`). Text is released immediately except a tail that could still become a marker
(``<tool`` ...) and a run of newlines that may turn out to be template whitespace. Newlines
touching a marker or the ends of the reply are the template's layout (``<think>\\n``,
``\\n</think>\\n\\n``, ``\\n<tool_call>``), not content, and are dropped; every other character
reaches the client, and so do the newlines before a call marker whose block turns out not to
be a call. A call block is released when its closing marker arrives (or, for formats
whose calls run to the end of the reply, at the end); one that does not parse, or is cut off by
the end of the reply, is released as text and counted in ``malformed``: never dropped.

Because the final message is assembled from exactly the events the client streamed, the echo a
client sends back is the message the tree recorded, however the output was chunked.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from itertools import groupby

from protocol_adapters._types import (
    ParsedReply,
    ReasoningDelta,
    ReplyEvent,
    TextDelta,
    ToolCallDone,
)
from trajectory_tree import Block, Message, Reasoning, Text, ToolCall, ToolSpec

from .config import ParserConfig
from .syntax import SYNTAX
from .tool_markup import CallIdFactory, looks_like_llama_call, new_call_id, parse_tool_calls

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


class _Mode(Enum):
    TEXT = "text"
    REASONING = "reasoning"
    CALL = "call"


def assemble(events: Sequence[ReplyEvent]) -> Message:
    """The assistant message the events spell: consecutive deltas of a kind become one block."""
    blocks: list[Block] = []
    for kind, group in groupby(events, key=type):
        if kind is ToolCallDone:
            blocks.extend(e.call for e in group if isinstance(e, ToolCallDone))
        elif kind is TextDelta:
            blocks.append(Text("".join(e.text for e in group if isinstance(e, TextDelta))))
        else:
            blocks.append(
                Reasoning("".join(e.text for e in group if isinstance(e, ReasoningDelta)))
            )
    return Message("assistant", tuple(blocks))


def events_of(message: Message) -> list[ReplyEvent]:
    """One event per block of ``message``, in order: how a finished reply is streamed or
    released whole (the other way round from :func:`assemble`)."""
    events: list[ReplyEvent] = []
    for block in message.content:
        if isinstance(block, Reasoning):
            events.append(ReasoningDelta(block.text))
        elif isinstance(block, Text):
            events.append(TextDelta(block.text))
        elif isinstance(block, ToolCall):
            events.append(ToolCallDone(block))
    return events


class ReplyStream:
    """Incremental parser for one reply. Not thread-safe: one reply, one consumer."""

    def __init__(
        self,
        config: ParserConfig | None = None,
        tools: Sequence[ToolSpec] = (),
        call_id: CallIdFactory = new_call_id,
    ) -> None:
        self.config = config or ParserConfig()
        self._syntax = SYNTAX[self.config.tool_format]
        self._tools = {t.name: t for t in tools}
        self._call_id = call_id
        reasoning_first = self.config.reasoning and self.config.starts_in_reasoning
        self._mode = _Mode.REASONING if reasoning_first else _Mode.TEXT
        self._buffer = ""
        self._newlines = 0
        self._at_start = True
        # <think> opens reasoning only as the first thing in a reply (whitespace aside).
        self._think_possible = self.config.reasoning and not reasoning_first
        # A reply that is a call (Llama's JSON) starts with one, once any reasoning is over.
        self._leading_possible = bool(self._syntax.leading)
        self._opened = ""  # the marker the current call block began with
        self._gap = ""  # the newlines between the text and that marker (layout, unless malformed)
        self._finished = False
        self._events: list[ReplyEvent] = []
        self.malformed = 0

    def feed(self, text: str) -> list[ReplyEvent]:
        """Events made certain by ``text``."""
        if self._finished:
            raise RuntimeError("feed() after finish()")
        self._buffer += text
        out: list[ReplyEvent] = []
        self._drain(out, final=False)
        self._events.extend(out)
        return out

    def finish(self) -> list[ReplyEvent]:
        """The events still held back, once the reply has ended."""
        if self._finished:
            raise RuntimeError("finish() called twice")
        self._finished = True
        out: list[ReplyEvent] = []
        self._drain(out, final=True)
        if self._mode is _Mode.CALL:
            if self._syntax.close is None:  # the block runs to the end of the reply
                body, self._buffer = self._buffer, ""
                self._close_call(body, out)
            else:  # cut off inside a call: keep it, as text
                self.malformed += 1
                out.append(TextDelta(self._gap + self._opened + self._buffer))
                self._buffer = ""
        self._events.extend(out)
        return out

    def reply(self) -> ParsedReply:
        """The whole reply; only after :meth:`finish`."""
        if not self._finished:
            raise RuntimeError("reply() before finish()")
        return ParsedReply(assemble(self._events), self.malformed)

    # -- the state machine ----------------------------------------------------------------------

    def _markers(self) -> tuple[str, ...]:
        if self._mode is _Mode.REASONING:
            return (THINK_CLOSE,)
        return (self._syntax.open,) if self._syntax.open else ()

    def _opens_with_call(self, *, final: bool) -> bool | None:
        """At the start of the text: True if the reply is a call block (entered, its prefix
        kept for the body parser), None if too early to tell, False once it cannot be."""
        stripped = self._buffer.lstrip()
        if stripped.startswith(self._syntax.leading):
            self._buffer = stripped
            self._leading_possible = False
            self._mode, self._opened = _Mode.CALL, ""
            return True
        if not final and any(prefix.startswith(stripped) for prefix in self._syntax.leading):
            return None
        self._leading_possible = False
        return False

    def _opens_with_think(self, *, final: bool) -> bool | None:
        """At the start of a reply: True if it opens reasoning (consumed), None if it is too
        early to tell (hold everything), False once it cannot any more."""
        stripped = self._buffer.lstrip()
        if stripped.startswith(THINK_OPEN):
            self._buffer = stripped[len(THINK_OPEN) :]
            self._think_possible = False
            self._switch(THINK_OPEN)
            return True
        if not final and THINK_OPEN.startswith(stripped):
            return None
        self._think_possible = False
        return False

    def _drain(self, out: list[ReplyEvent], *, final: bool) -> None:
        while True:
            if self._mode is _Mode.CALL:
                close = self._syntax.close
                end = self._buffer.find(close) if close is not None else -1
                if end < 0:
                    return
                body = self._buffer[:end]
                self._buffer = self._buffer[end + len(close or "") :]
                self._close_call(body, out)
                continue
            if self._think_possible and self._opens_with_think(final=final) is None:
                return
            if self._mode is _Mode.TEXT and self._leading_possible:
                opened = self._opens_with_call(final=final)
                if opened is None:
                    return
                if opened:
                    continue
            markers = self._markers()
            found = _earliest(self._buffer, markers)
            if found is not None:
                at, marker = found
                self._emit(self._buffer[:at], out)
                self._buffer = self._buffer[at + len(marker) :]
                self._switch(marker)
                continue
            keep = 0 if final else _partial_marker_length(self._buffer, markers)
            self._emit(self._buffer[: len(self._buffer) - keep], out)
            self._buffer = self._buffer[len(self._buffer) - keep :]
            return

    def _switch(self, marker: str) -> None:
        self._gap = "\n" * self._newlines
        self._newlines = 0  # newlines before a marker are layout
        self._at_start = True
        if marker == THINK_OPEN:
            self._mode = _Mode.REASONING
        elif marker == THINK_CLOSE:
            self._mode = _Mode.TEXT
            self._leading_possible = bool(self._syntax.leading)
        else:
            self._mode, self._opened = _Mode.CALL, marker

    def _close_call(self, body: str, out: list[ReplyEvent]) -> None:
        syntax = self._syntax
        calls = parse_tool_calls(self.config.tool_format, body.strip(), self._call_id, self._tools)
        self._mode = _Mode.TEXT
        self._at_start = True
        self._newlines = 0
        if calls is not None:
            out.extend(ToolCallDone(call) for call in calls)
        elif self._opened or looks_like_llama_call(body):
            # Not a call after all: every character goes back to the client as the model wrote
            # it, the newlines that would have been the template's layout included.
            self.malformed += 1
            out.append(TextDelta(self._gap + self._opened + body + (syntax.close or "")))
            self._at_start = False  # and the newlines after it are the model's too
        else:  # a reply that only looked like a call from its first character: plain text
            self._emit(body, out)

    def _emit(self, text: str, out: list[ReplyEvent]) -> None:
        if not text:
            return
        if self._at_start:
            text = text.lstrip("\n")
            if not text:
                return
        text = "\n" * self._newlines + text
        core = text.rstrip("\n")
        self._newlines = len(text) - len(core)
        if core:
            out.append(ReasoningDelta(core) if self._mode is _Mode.REASONING else TextDelta(core))
            self._at_start = False


def _earliest(text: str, markers: Sequence[str]) -> tuple[int, str] | None:
    best: tuple[int, str] | None = None
    for marker in markers:
        at = text.find(marker)
        if at >= 0 and (best is None or at < best[0]):
            best = (at, marker)
    return best


def _partial_marker_length(text: str, markers: Sequence[str]) -> int:
    """Length of the longest end of ``text`` that is the start of a marker."""
    longest = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), longest, -1):
            if text.endswith(marker[:size]):
                longest = size
                break
    return longest
