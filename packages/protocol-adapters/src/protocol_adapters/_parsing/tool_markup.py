"""The body of one tool-call block in each supported format -> its ToolCalls, or None if malformed.

A block is what the family's markers enclose (:mod:`.syntax`): one call for most formats, a list
for Mistral's JSON array and a DeepSeek calls section. Arguments always come out as JSON text of
an object. Qwen3-Coder's XML and GLM's key/value pairs carry bare strings, so their values are
typed by the tool's JSON schema when the tool is known (``"5"`` stays a string for a string
parameter, becomes 5 for an integer one); unknown parameters stay strings (GLM: JSON when they
parse as JSON, as its template writes non-string values).
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
    return _call_from_object(value, call_id, "arguments")


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


_ARG_PAIR = re.compile(r"\s*<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>\s*", re.DOTALL)


def parse_glm45(body: str, call_id: str, tools: Mapping[str, ToolSpec]) -> ToolCall | None:
    """``name`` then ``<arg_key>k</arg_key><arg_value>v</arg_value>`` pairs."""
    at = body.find("<arg_key>")
    name = (body if at < 0 else body[:at]).strip()
    if not name or "<" in name or "\n" in name:
        return None
    types = _schema_types(tools.get(name))
    arguments: dict[str, Any] = {}
    rest = "" if at < 0 else body[at:]
    position = 0
    while position < len(rest):
        pair = _ARG_PAIR.match(rest, position)
        if pair is None:
            return None  # text outside any key/value pair
        key, raw = pair.group(1).strip(), pair.group(2)
        if not key or key in arguments:
            return None
        arguments[key] = _typed(raw, types[key]) if key in types else _json_or_text(raw)
        position = pair.end()
    return ToolCall(call_id, name, json.dumps(arguments, ensure_ascii=False))


def _json_or_text(raw: str) -> Any:
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return raw
    return value if not isinstance(value, str) else raw


def _call_from_object(value: Any, call_id: str, *argument_keys: str) -> ToolCall | None:
    """``{"name": ..., <argument key>: {...}}`` (a JSON-encoded object accepted) -> a call."""
    if not isinstance(value, dict):
        return None
    name = value.get("name")
    key = next((k for k in argument_keys if k in value), None)
    arguments = value.get(key, {}) if key is not None else {}
    if isinstance(arguments, str):  # some models double-encode the arguments
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return None
    if not isinstance(name, str) or not name or not isinstance(arguments, dict):
        return None
    return ToolCall(call_id, name, json.dumps(arguments, ensure_ascii=False))


PYTHON_TAG = "<|python_tag|>"


def parse_llama_json(body: str, new_id: CallIdFactory) -> list[ToolCall] | None:
    """One or more ``{"name": ..., "parameters": {...}}`` objects separated by ``;``."""
    text = body.strip().removeprefix(PYTHON_TAG).strip()
    decoder = json.JSONDecoder()
    calls: list[ToolCall] = []
    position = 0
    while position < len(text):
        try:
            value, end = decoder.raw_decode(text, position)
        except (ValueError, RecursionError):
            return None
        call = _call_from_object(value, new_id(), "parameters", "arguments")
        if call is None:
            return None
        calls.append(call)
        position = end
        while position < len(text) and (text[position].isspace() or text[position] == ";"):
            position += 1
    return calls or None


def looks_like_llama_call(body: str) -> bool:
    """Whether a reply that failed to parse as calls was meant as one (else it is plain text, a
    JSON answer say, and not a malformed call)."""
    text = body.lstrip()
    return text.startswith(PYTHON_TAG) or re.match(r'\{\s*"name"\s*:', text) is not None


MISTRAL_ARGS = "[ARGS]"
MISTRAL_CALLS = "[TOOL_CALLS]"


def parse_mistral(body: str, new_id: CallIdFactory) -> list[ToolCall] | None:
    """After ``[TOOL_CALLS]``: a JSON array of ``{"name", "arguments"}``, or ``name[ARGS]{...}``
    calls each introduced by ``[TOOL_CALLS]`` (the first marker already consumed)."""
    text = body.strip()
    if text.startswith("["):
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            return None
        if not isinstance(value, list) or not value:
            return None
        found = [_call_from_object(item, new_id(), "arguments") for item in value]
        return None if any(c is None for c in found) else [c for c in found if c is not None]
    calls: list[ToolCall] = []
    for part in text.split(MISTRAL_CALLS):
        name, separator, arguments = part.partition(MISTRAL_ARGS)
        call = _call_from_object(
            {"name": name.strip(), "arguments": arguments.strip()} if separator else None,
            new_id(),
            "arguments",
        )
        if call is None:
            return None
        calls.append(call)
    return calls


DEEPSEEK_CALL_BEGIN = "<\uff5ctool\u2581call\u2581begin\uff5c>"
DEEPSEEK_CALL_END = "<\uff5ctool\u2581call\u2581end\uff5c>"
DEEPSEEK_SEP = "<\uff5ctool\u2581sep\uff5c>"
_DEEPSEEK_V3 = re.compile(r"function" + DEEPSEEK_SEP + r"(.+?)\n```json\n(.*)\n```\s*", re.DOTALL)


def parse_deepseek(body: str, new_id: CallIdFactory) -> list[ToolCall] | None:
    """A calls section: call blocks (begin marker, body, end marker) and nothing else."""
    calls: list[ToolCall] = []
    rest = body.strip()
    while rest:
        if not rest.startswith(DEEPSEEK_CALL_BEGIN):
            return None
        end = rest.find(DEEPSEEK_CALL_END)
        if end < 0:
            return None
        call = _deepseek_call(rest[len(DEEPSEEK_CALL_BEGIN) : end], new_id())
        if call is None:
            return None
        calls.append(call)
        rest = rest[end + len(DEEPSEEK_CALL_END) :].strip()
    return calls or None


def _deepseek_call(inner: str, call_id: str) -> ToolCall | None:
    v3 = _DEEPSEEK_V3.fullmatch(inner)
    if v3 is not None:
        name, arguments = v3.group(1).strip(), v3.group(2)
    else:
        name, separator, arguments = inner.partition(DEEPSEEK_SEP)
        if not separator:
            return None
        name = name.strip()
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError):
        return None
    return _call_from_object({"name": name, "arguments": value}, call_id, "arguments")


def parse_tool_calls(
    tool_format: ToolCallFormat,
    body: str,
    new_id: CallIdFactory,
    tools: Mapping[str, ToolSpec],
) -> list[ToolCall] | None:
    """The calls of one block in ``tool_format``, or None when it is malformed."""
    if tool_format is ToolCallFormat.HERMES_JSON:
        return _one(parse_hermes_json(body, new_id()))
    if tool_format is ToolCallFormat.QWEN3_CODER_XML:
        return _one(parse_qwen3_coder_xml(body, new_id(), tools))
    if tool_format is ToolCallFormat.GLM45:
        return _one(parse_glm45(body, new_id(), tools))
    if tool_format is ToolCallFormat.LLAMA_JSON:
        return parse_llama_json(body, new_id)
    if tool_format is ToolCallFormat.MISTRAL:
        return parse_mistral(body, new_id)
    return parse_deepseek(body, new_id)


def _one(call: ToolCall | None) -> list[ToolCall] | None:
    return None if call is None else [call]
