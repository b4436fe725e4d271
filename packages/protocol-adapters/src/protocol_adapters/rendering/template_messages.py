"""Neutral messages and tools in the dict shape Hugging Face chat templates expect."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from protocol_adapters.types import AdapterError, ErrorKind
from trajectory_tree import Media, Message, Reasoning, Text, ToolCall, ToolSpec


def template_message(message: Message) -> dict[str, Any]:
    """``{"role", "content", "reasoning_content"?, "tool_calls"?, "tool_call_id"?, "name"?}``.

    Tool-call arguments stay the JSON *text* the client sent (templates print strings verbatim), so
    rendering never re-serializes them.
    """
    text: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in message.content:
        if isinstance(block, Text):
            text.append(block.text)
        elif isinstance(block, Reasoning):
            reasoning.append(block.text)
        elif isinstance(block, ToolCall):
            calls.append(
                {
                    "id": block.id,
                    "type": "function",
                    "function": {"name": block.name, "arguments": block.arguments},
                }
            )
        elif isinstance(block, Media):
            raise AdapterError(
                ErrorKind.INVALID_REQUEST,
                f"{block.media_type} content cannot be rendered by a text-only chat template",
            )
    out: dict[str, Any] = {"role": message.role, "content": "".join(text)}
    if any(reasoning):
        out["reasoning_content"] = "".join(reasoning)
    if calls:
        out["tool_calls"] = calls
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        out["name"] = message.name
    return out


def template_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    return [template_message(m) for m in messages]


@lru_cache(maxsize=64)
def template_tools(tools: tuple[ToolSpec, ...]) -> tuple[dict[str, Any], ...]:
    """OpenAI-style function specs; cached because agents resend the same tools every turn."""
    out: list[dict[str, Any]] = []
    for tool in tools:
        try:
            parameters = json.loads(tool.parameters)
        except ValueError:
            raise AdapterError(
                ErrorKind.INVALID_REQUEST, f"tool {tool.name!r}: parameters are not JSON"
            ) from None
        function: dict[str, Any] = {"name": tool.name}
        if tool.description:
            function["description"] = tool.description
        function["parameters"] = parameters
        out.append({"type": "function", "function": function})
    return tuple(out)


def template_options(options: Mapping[str, str]) -> dict[str, Any]:
    """Prompt options as template variables: JSON values decoded (``"false"`` -> ``False``),
    anything else passed as the string it is."""
    out: dict[str, Any] = {}
    for name, value in options.items():
        try:
            out[name] = json.loads(value)
        except ValueError:
            out[name] = value
    return out
