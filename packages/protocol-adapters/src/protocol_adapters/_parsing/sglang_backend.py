"""SGLang's ``FunctionCallParser`` / ``ReasoningParser`` behind our parser contract (optional).

SGLang is a GPU-node dependency (importing it pulls torch), so nothing here imports it until a
parser is built. Its gotcha: when a tool call has malformed JSON or names an unknown tool, its
detectors return no call *and drop the text*. We keep our guarantee around it: SGLang's result
is used only when it accounts for every call the built-in parser sees in the reply (parsed or
malformed); otherwise the built-in parser's result (malformed markup kept as text and counted)
is returned instead. For a format SGLang has no tool-call parser for (``SGLANG_TOOL_PARSERS``), a
reply with calls is the built-in parser's too.

SGLang's detectors are used on the whole reply at its end: a stream from this backend releases
its events at :meth:`BufferedReplyStream.finish`, not token by token.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
from collections.abc import Sequence
from typing import Any

from protocol_adapters._tokenizer import Vocabulary
from protocol_adapters._types import (
    ParsedReply,
    ReasoningDelta,
    ReplyEvent,
    TextDelta,
    ToolCallDone,
)
from trajectory_tree import ToolCall, ToolSpec

from .builtin import BuiltinReplyParser
from .config import ParserConfig
from .decode import strip_stop_ids
from .stream import assemble, events_of
from .tool_markup import CallIdFactory, new_call_id

_REASONING_MODULES = ("sglang.srt.parser.reasoning_parser", "sglang.srt.reasoning_parser")
_FUNCTION_CALL_MODULE = "sglang.srt.function_call.function_call_parser"
_PROTOCOL_MODULE = "sglang.srt.entrypoints.openai.protocol"


def sglang_available() -> bool:
    """Whether ``import sglang`` would find the package (without importing it)."""
    return importlib.util.find_spec("sglang") is not None


def _import_first(names: Sequence[str]) -> Any:
    errors: list[str] = []
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError as exc:
            errors.append(f"{name}: {exc}")
    raise ImportError("; ".join(errors))


class SGLangReplyParser:
    """Same interface as :class:`BuiltinReplyParser`, decisions delegated to SGLang."""

    def __init__(
        self,
        config: ParserConfig,
        tools: Sequence[ToolSpec] = (),
        call_id: CallIdFactory = new_call_id,
    ) -> None:
        self.config = config
        self.tools = tuple(tools)
        self.call_id = call_id
        self._builtin = BuiltinReplyParser(config, tools, call_id)
        self._reasoning_cls = _import_first(_REASONING_MODULES).ReasoningParser
        self._function_call_cls = importlib.import_module(_FUNCTION_CALL_MODULE).FunctionCallParser
        protocol = importlib.import_module(_PROTOCOL_MODULE)
        self._sglang_tools = [
            protocol.Tool(
                type="function",
                function=protocol.Function(
                    name=t.name, description=t.description, parameters=json.loads(t.parameters)
                ),
            )
            for t in self.tools
        ]

    def stream(self) -> BufferedReplyStream:
        return BufferedReplyStream(self)

    def parse_text(self, text: str) -> ParsedReply:
        builtin = self._builtin.parse_text(text)
        expected = len(builtin.message.tool_calls) + builtin.malformed_tool_calls
        tool_parser = self.config.sglang_tool_parser_name
        if expected and tool_parser is None:
            return builtin  # SGLang has no parser for this format: ours reads the calls
        events: list[ReplyEvent] = []
        normal = text
        if self.config.reasoning:
            reasoning_parser = self._reasoning_cls(
                model_type=self.config.sglang_reasoning_parser, stream_reasoning=False
            )
            reasoning, normal_or_none = reasoning_parser.parse_non_stream(text)
            normal = normal_or_none or ""
            if reasoning and reasoning.strip("\n"):
                events.append(ReasoningDelta(reasoning.strip("\n")))
        calls: list[Any] = []
        rest = normal
        if self._sglang_tools and expected:
            parser = self._function_call_cls(tools=self._sglang_tools, tool_call_parser=tool_parser)
            rest, calls = parser.parse_non_stream(normal)
        if len(calls) < expected:
            # SGLang dropped a malformed or unknown-tool call together with its text.
            return builtin
        if rest and rest.strip("\n"):
            events.append(TextDelta(rest.strip("\n")))
        events.extend(
            ToolCallDone(ToolCall(self.call_id(), str(c.name), str(c.parameters))) for c in calls
        )
        return ParsedReply(assemble(events), 0)

    def parse_ids(self, output_ids: Sequence[int], vocabulary: Vocabulary) -> ParsedReply:
        return self.parse_text(vocabulary.decode(strip_stop_ids(output_ids, vocabulary)))


class BufferedReplyStream:
    """A stream that collects text and parses the whole reply at :meth:`finish`."""

    def __init__(self, parser: SGLangReplyParser) -> None:
        self._parser = parser
        self._parts: list[str] = []
        self._reply: ParsedReply | None = None

    @property
    def malformed(self) -> int:
        return self._reply.malformed_tool_calls if self._reply else 0

    def feed(self, text: str) -> list[ReplyEvent]:
        if self._reply is not None:
            raise RuntimeError("feed() after finish()")
        self._parts.append(text)
        return []

    def finish(self) -> list[ReplyEvent]:
        if self._reply is not None:
            raise RuntimeError("finish() called twice")
        self._reply = self._parser.parse_text("".join(self._parts))
        return events_of(self._reply.message)

    def reply(self) -> ParsedReply:
        if self._reply is None:
            raise RuntimeError("reply() before finish()")
        return self._reply
