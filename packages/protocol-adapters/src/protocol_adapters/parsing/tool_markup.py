"""The body of one ``<tool_call>`` in each supported format -> a ToolCall, or None if malformed.

Arguments always come out as JSON text of an object. Qwen3-Coder's XML carries bare strings, so
its values are typed by the tool's JSON schema when the tool is known (``"5"`` stays a string for a
string parameter, becomes 5 for an integer one); unknown parameters stay strings.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Mapping
from typing import Any

from trajectory_tree import ToolCall, ToolSpec

from .config import ToolCallFormat

CallIdFactory = Callable[[], str]


def new_call_id() -> str:
    """``call_`` + 24 hex digits, the shape OpenAI clients expect."""
    return "call_" + secrets.token_hex(12)


def parse_hermes_json(body: str, call_id: str) -> ToolCall | None:
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict):
        return None
    name = value.get("name")
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):  # some models double-encode the arguments
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return None
    if not isinstance(name, str) or not name or not isinstance(arguments, dict):
        return None
    return ToolCall(call_id, name, json.dumps(arguments, ensure_ascii=False))


_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*?)</function>\s*", re.DOTALL)
_PARAMETER = re.compile(r"\s*<parameter=([^>\n]+)>(.*?)</parameter>\s*", re.DOTALL)


def _schema_types(tool: ToolSpec | None) -> Mapping[str, Any]:
    if tool is None:
        return {}
    try:
        schema = json.loads(tool.parameters)
    except ValueError:
        return {}
    properties = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(properties, dict):
        return {}
    return {k: v.get("type") for k, v in properties.items() if isinstance(v, dict)}


def _typed(raw: str, declared: Any) -> Any:
    if declared in (None, "string") or (isinstance(declared, list) and "string" in declared):
        return raw
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return raw


def parse_qwen3_coder_xml(
    body: str, call_id: str, tools: Mapping[str, ToolSpec]
) -> ToolCall | None:
    function = _FUNCTION.fullmatch(body)
    if function is None:
        return None
    name = function.group(1).strip()
    inner = function.group(2)
    types = _schema_types(tools.get(name))
    arguments: dict[str, Any] = {}
    position = 0
    while position < len(inner):
        parameter = _PARAMETER.match(inner, position)
        if parameter is None:
            if inner[position:].strip():
                return None  # text outside any <parameter> block
            break
        key = parameter.group(1).strip()
        value = parameter.group(2)
        value = value.removeprefix("\n").removesuffix("\n")
        if key in arguments:
            return None
        arguments[key] = _typed(value, types.get(key))
        position = parameter.end()
    if not name:
        return None
    return ToolCall(call_id, name, json.dumps(arguments, ensure_ascii=False))


def parse_tool_call(
    tool_format: ToolCallFormat, body: str, call_id: str, tools: Mapping[str, ToolSpec]
) -> ToolCall | None:
    if tool_format is ToolCallFormat.HERMES_JSON:
        return parse_hermes_json(body, call_id)
    return parse_qwen3_coder_xml(body, call_id, tools)
