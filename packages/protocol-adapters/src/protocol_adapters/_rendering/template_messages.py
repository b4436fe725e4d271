"""Neutral messages and tools in the dict shape Hugging Face chat templates expect.

Three conventions of transformers are followed, because published templates are written for them:

- tool-call ``arguments`` are a mapping (templates write ``arguments | tojson``, or iterate over
  ``arguments | items`` as Qwen3-Coder's does); the JSON text the client sent is passed only to a
  template that prints arguments as they come (``ArgumentsForm.STRING``, decided by the audit), or
  when it is not a JSON object;
- a tool result carries the ``name`` of the function it answers (Hermes-style templates refuse one
  without), taken from the call it answers when the client did not send one;
- reasoning is ``reasoning_content``, aliased as ``thinking`` as transformers does.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum
from functools import lru_cache
from typing import Any

from protocol_adapters._types import AdapterError, ErrorKind
from trajectory_tree import Media, Message, Reasoning, Text, ToolCall, ToolSpec


class ArgumentsForm(StrEnum):
    """How a template receives tool-call arguments."""

    MAPPING = "mapping"
    """Decoded JSON objects: transformers' convention, what nearly every template expects."""
    STRING = "string"
    """The JSON text as the client sent it: for templates that print arguments verbatim."""


def call_names(messages: Iterable[Message]) -> dict[str, str]:
    """Tool-call id -> function name for every call the ``messages`` make."""
    return {call.id: call.name for message in messages for call in message.tool_calls}


def _decoded(text: str) -> Any:
    """The JSON value of ``text``; ValueError when it is not JSON, or when decoding its escapes
    gives text that is not Unicode (``"\\ud800"``: valid JSON text, a lone surrogate decoded,
    which no tokenizer takes)."""
    try:
        value = json.loads(text)
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except (UnicodeEncodeError, RecursionError) as exc:
        raise ValueError(str(exc)) from None
    return value


def _arguments(text: str, form: ArgumentsForm) -> Any:
    if form is ArgumentsForm.STRING:
        return text
    try:
        value = _decoded(text)
    except ValueError:
        return text  # what the client sent, which is valid text
    return value if isinstance(value, dict) else text


def template_message(
    message: Message,
    arguments: ArgumentsForm = ArgumentsForm.MAPPING,
    names: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """``{"role", "content", "reasoning_content"?, "thinking"?, "tool_calls"?, "tool_call_id"?,
    "name"?}``; ``names`` maps call ids to function names for tool results."""
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
                    "function": {
                        "name": block.name,
                        "arguments": _arguments(block.arguments, arguments),
                    },
                }
            )
        elif isinstance(block, Media):
            raise AdapterError(
                ErrorKind.INVALID_REQUEST,
                f"{block.media_type} content cannot be rendered by a text-only chat template",
            )
    out: dict[str, Any] = {"role": message.role, "content": "".join(text)}
    if any(reasoning):
        joined = "".join(reasoning)
        out = {"thinking": joined, **out, "reasoning_content": joined}  # transformers' key order
    if calls:
        out["tool_calls"] = calls
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    name = message.name
    if name is None and message.tool_call_id is not None and names:
        name = names.get(message.tool_call_id)
    if name is not None:
        out["name"] = name
    return out


def template_messages(
    messages: Sequence[Message],
    arguments: ArgumentsForm = ArgumentsForm.MAPPING,
    names: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Each message converted; tool results are named after the calls in ``messages`` (or in
    ``names``, for calls made before them)."""
    known = {**(names or {}), **call_names(messages)}
    return [template_message(m, arguments, known) for m in messages]


@lru_cache(maxsize=64)
def template_tools(tools: tuple[ToolSpec, ...]) -> tuple[dict[str, Any], ...]:
    """OpenAI-style function specs; cached because agents resend the same tools every turn."""
    out: list[dict[str, Any]] = []
    for tool in tools:
        try:
            parameters = _decoded(tool.parameters)
        except ValueError:
            raise AdapterError(
                ErrorKind.INVALID_REQUEST,
                f"tool {tool.name!r}: parameters are not JSON of valid Unicode text",
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
