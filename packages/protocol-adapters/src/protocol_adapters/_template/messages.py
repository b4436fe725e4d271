"""Neutral messages and tools in the dict shape Hugging Face chat templates expect.

They are passed as vLLM's chat endpoint passes a client's request to the template, so that the
policy is trained on the prompt it sees when served (SGLang's decodes arguments alike, but passes
its request models' dumps: ``None`` for every field a message lacks, tools with its own keys):

- tool-call ``arguments`` are the mapping their JSON text decodes to (both engines decode them
  before templating, whatever the template then prints: Phi-4-mini's prints a Python dict); the
  client's text stays only when it is not a JSON object (SGLang refuses such arguments, vLLM
  passes the decoded value, or ``{}`` for text that is not JSON);
- a tool result carries the ``name`` the client sent, or none (vLLM's form). Only a template that
  refuses a tool result without one (Hermes) gets the name of the call it answers
  (:attr:`ToolResultNames.FROM_CALLS`, decided by the audit), since the engines have no prompt
  for such a request: vLLM refuses it, SGLang passes ``name: None`` (Hermes prints "None");
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


class ToolResultNames(StrEnum):
    """Which ``name`` a tool result carries in the template's messages."""

    AS_SENT = "as sent"
    """The client's, or none: what vLLM passes, for every template that accepts it."""
    FROM_CALLS = "from calls"
    """The function's name when the client sent none: for templates that refuse a result
    without one, which no engine renders (vLLM refuses the request)."""


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


def _arguments(text: str) -> Any:
    try:
        value = _decoded(text)
    except ValueError:
        return text  # what the client sent, which is valid text
    return value if isinstance(value, dict) else text


def template_message(message: Message, names: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``{"role", "content", "reasoning_content"?, "thinking"?, "tool_calls"?, "tool_call_id"?,
    "name"?}``; ``names`` maps call ids to the function names a tool result the client did not
    name gets (None: it gets none)."""
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
                        "arguments": _arguments(block.arguments),
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
    names: Mapping[str, str] | None = None,
    result_names: ToolResultNames = ToolResultNames.FROM_CALLS,
) -> list[dict[str, Any]]:
    """Each message converted. With ``FROM_CALLS``, a tool result the client did not name is
    named after its call in ``messages`` (or in ``names``, for calls made before them)."""
    if result_names is ToolResultNames.AS_SENT:
        return [template_message(m) for m in messages]
    known = {**(names or {}), **call_names(messages)}
    return [template_message(m, known) for m in messages]


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
