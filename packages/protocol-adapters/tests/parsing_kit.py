"""What the tool-call family tests share: one tool list, call ids as the parser numbers them, and
a reply parsed whole or streamed in pieces cut anywhere."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable

from protocol_adapters._parsing import BuiltinReplyParser, ParserConfig, ToolCallFormat
from protocol_adapters._types import ParsedReply
from trajectory_tree import ToolCall, ToolSpec

TOOLS = (
    ToolSpec(
        "edit",
        "",
        json.dumps(
            {
                "type": "object",
                "properties": {"path": {"type": "string"}, "line": {"type": "integer"}},
            }
        ),
    ),
)


def ids() -> Callable[[], str]:
    numbers = itertools.count()
    return lambda: f"call_{next(numbers):024x}"


def call(index: int, name: str, arguments: dict[str, object]) -> ToolCall:
    return ToolCall(f"call_{index:024x}", name, json.dumps(arguments, ensure_ascii=False))


def parse(text: str, tool_format: ToolCallFormat) -> ParsedReply:
    config = ParserConfig(tool_format=tool_format)
    return BuiltinReplyParser(config, TOOLS, ids()).parse_text(text)


def streamed(text: str, tool_format: ToolCallFormat, cuts: list[int]) -> ParsedReply:
    stream = BuiltinReplyParser(ParserConfig(tool_format=tool_format), TOOLS, ids()).stream()
    start = 0
    for cut in sorted(set(cuts)):
        stream.feed(text[start:cut])
        start = cut
    stream.feed(text[start:])
    stream.finish()
    return stream.reply()
