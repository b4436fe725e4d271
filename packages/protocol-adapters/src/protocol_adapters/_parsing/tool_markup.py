"""The body of one tool-call block in each supported format -> its ToolCalls, or None if malformed.

A block is what the family's markers enclose (:mod:`.syntax`): one call for most formats, a list
for Mistral's JSON array, a DeepSeek calls section, MiniMax-M1's and OLMo 3's one-a-line blocks
and Phi-4-mini's ``functools`` list. Arguments always come out as JSON text of an object.
OLMo 3's pythonic calls and Gemma 4's ``key:value`` markup are read by small readers of their own
(never evaluated; nesting bounded). Qwen3-Coder's XML and GLM's key/value pairs carry bare
strings, so their values are typed by the tool's JSON schema when the tool is known (``"5"`` stays
a string for a string parameter, becomes 5 for an integer one); unknown parameters stay strings
(GLM: JSON when they parse as JSON, as its template writes non-string values).
"""

from __future__ import annotations

import json
import math
import re
import secrets
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
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


class _Malformed(Exception):
    """Raised inside the OLMo 3 and Gemma 4 readers; the block is then malformed."""


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of range")
    return value


_JSON = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite)
"""Strict JSON: no ``NaN`` / ``Infinity`` (nor ``1e999``), which would not survive as JSON
arguments."""


def _json_at(text: str, position: int) -> tuple[Any, int]:
    try:
        return _JSON.raw_decode(text, position)
    except (ValueError, RecursionError):
        raise _Malformed from None


def parse_minimax_m1(body: str, new_id: CallIdFactory) -> list[ToolCall] | None:
    """Inside ``<tool_calls>``: ``{"name": ..., "arguments": {...}}`` objects separated by
    whitespace (the template writes one a line)."""
    text = body.strip()
    calls: list[ToolCall] = []
    position = 0
    while position < len(text):
        try:
            value, position = _json_at(text, position)
        except _Malformed:
            return None
        call = _call_from_object(value, new_id(), "arguments")
        if call is None:
            return None
        calls.append(call)
        while position < len(text) and text[position].isspace():
            position += 1
    return calls or None


PHI4_CALLS = "functools["


def parse_phi4_mini(body: str, new_id: CallIdFactory) -> list[ToolCall] | None:
    """After ``functools[``: the rest of a JSON list of ``{"name", "arguments"}`` objects
    (``parameters`` accepted for ``arguments``), nothing after it."""
    try:
        value = _JSON.decode("[" + body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, list) or not value:
        return None
    found = [_call_from_object(item, new_id(), "arguments", "parameters") for item in value]
    return None if any(c is None for c in found) else [c for c in found if c is not None]


_OLMO3_NAME = re.compile(r"[A-Za-z_][\w.\-]*")
_OLMO3_KEY = re.compile(r"[A-Za-z_]\w*")
_OLMO3_WORDS: Mapping[str, Any] = {
    "true": True,
    "false": False,
    "null": None,
    "True": True,
    "False": False,
    "None": None,
}
_OLMO3_QUOTE_END = re.compile(r"'(?=\s*(?:,\s*(?:[A-Za-z_]\w*\s*=|\))|\)[ \t]*(?:\r?\n|\Z)))")
"""A quote that may end a string the template wrote unescaped: one followed by the next argument
(``, key=``) or by the call's end (``)`` at the end of its line)."""
_OLMO3_BETWEEN = re.compile(r"[ \t]*(?:\r?\n\s*|\Z)")
_OLMO3_MAX_RETRIES = 200
"""Readings of a block tried past the first, before it is declared malformed."""


def parse_olmo3(body: str, new_id: CallIdFactory) -> list[ToolCall] | None:
    """Inside ``<function_calls>``: one ``name(key=value, ...)`` a line. Read, never evaluated:
    a value is a string in single quotes taken as it is (the template does not escape it), or a
    JSON value (number, ``"string"``, list, object; ``true``, ``false``, ``null``, or Python's
    spelling of them), nothing else; no positional arguments, nothing after the ``)``.

    An unescaped string ends at a quote followed by ``, key=`` or by ``)`` and the line's end;
    when several quotes could end it (a quote, ``')`` at the end of a line of code inside it), the
    first that lets the whole block be read is taken."""
    try:
        found = _Olmo3Reader(body.strip()).read()
    except _Malformed:
        return None
    calls = [ToolCall(new_id(), n, json.dumps(a, ensure_ascii=False)) for n, a in found]
    return calls or None


@dataclass(frozen=True, slots=True)
class _Olmo3Choice:
    """An unescaped string at ``start``, the value of ``key``: the quotes not yet tried as its
    end, and how much had been read before it (``calls`` of the block, ``arguments`` entries of
    the call ``name``; both only grow after it, so going back is cutting them back)."""

    ends: Iterator[int]
    start: int
    key: str
    calls: int
    name: str
    arguments: dict[str, Any]
    entries: int


class _Olmo3Reader:
    """Reads a block left to right; a string with several possible ends is a choice point, and a
    reading that fails goes back to the latest one with an end left (depth first, bounded)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.choices: list[_Olmo3Choice] = []

    def read(self) -> list[tuple[str, dict[str, Any]]]:
        position, name, arguments = 0, None, dict[str, Any]()
        retries = 0
        while True:
            try:
                self._run(position, name, arguments)
                return self.calls
            except _Malformed:
                retries += 1
                if retries > _OLMO3_MAX_RETRIES:
                    raise
            position, arguments = self._back()
            name = self.choices[-1].name

    def _back(self) -> tuple[int, dict[str, Any]]:
        """Back to the latest choice with an end left, that end taken: the position after it and
        the call's arguments so far."""
        while self.choices:
            choice = self.choices[-1]
            end = next(choice.ends, None)
            if end is None:
                self.choices.pop()
                continue
            del self.calls[choice.calls :]
            while len(choice.arguments) > choice.entries:
                choice.arguments.popitem()  # the entries read after the choice, latest first
            try:
                return self._take(choice, end), choice.arguments
            except _Malformed:
                continue
        raise _Malformed

    def _run(self, position: int, name: str | None, arguments: dict[str, Any]) -> None:
        """Read on to the block's end; a string's first possible end is taken, the others left
        as a choice."""
        text = self.text
        while True:
            if name is None:
                if position >= len(text):
                    return
                match = _OLMO3_NAME.match(text, position)
                if match is None or not text.startswith("(", match.end()):
                    raise _Malformed
                name, arguments = match.group(), {}
                position = _skip(text, match.end() + 1)
            if text.startswith(")", position):
                between = _OLMO3_BETWEEN.match(text, position + 1)
                if between is None:
                    raise _Malformed  # something after the call on its line
                self.calls.append((name, arguments))
                name, position = None, between.end()
                continue
            key = _OLMO3_KEY.match(text, position)
            if key is None or key.group() in arguments:
                raise _Malformed
            position = _skip(text, key.end())
            if not text.startswith("=", position):
                raise _Malformed
            position = _skip(text, position + 1)
            if text.startswith("'", position):
                ends = (m.start() for m in _OLMO3_QUOTE_END.finditer(text, position + 1))
                choice = _Olmo3Choice(
                    ends, position, key.group(), len(self.calls), name, arguments, len(arguments)
                )
                self.choices.append(choice)
                first = next(ends, None)
                if first is None:
                    raise _Malformed
                position = self._take(choice, first)
                continue
            value, end = self._value(position)
            arguments[key.group()] = value
            position = self._after_value(end)

    def _take(self, choice: _Olmo3Choice, end: int) -> int:
        """The string of ``choice`` ends at the quote at ``end``: the position after it."""
        choice.arguments[choice.key] = self.text[choice.start + 1 : end]
        return self._after_value(end + 1)

    def _value(self, position: int) -> tuple[Any, int]:
        word = _OLMO3_KEY.match(self.text, position)
        if word is not None:
            if word.group() not in _OLMO3_WORDS:
                raise _Malformed  # a name, not a value: nothing is ever looked up or called
            return _OLMO3_WORDS[word.group()], word.end()
        return _json_at(self.text, position)

    def _after_value(self, position: int) -> int:
        """Past the ``,`` after a value, or at the call's ``)``."""
        position = _skip(self.text, position)
        if self.text.startswith(",", position):
            return _skip(self.text, position + 1)
        if self.text.startswith(")", position):
            return position
        raise _Malformed


def _skip(text: str, position: int) -> int:
    """Past the whitespace at ``position``."""
    while position < len(text) and text[position].isspace():
        position += 1
    return position


GEMMA4_STRING = '<|"|>'
_GEMMA4_CALL = re.compile(r"call:([\w.\-]+)")
_GEMMA4_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_GEMMA4_WORD = re.compile(r"[A-Za-z_]\w*")
_GEMMA4_WORDS: Mapping[str, Any] = {"true": True, "false": False, "null": None, "None": None}
_GEMMA4_KEY = re.compile(r"[^:{}\[\],<\s][^:{}\[\],<\n]*")
_GEMMA4_MAX_DEPTH = 32
"""Objects and lists nested deeper than this make a call malformed (the reader recurses)."""


def parse_gemma4(body: str, call_id: str) -> ToolCall | None:
    """Between ``<|tool_call>`` and ``<tool_call|>``: ``call:name{key:value,...}``. Values:
    strings between ``<|"|>`` delimiters (taken as they are), numbers, ``true``, ``false``,
    ``null``, objects ``{key:value,...}`` with bare (or delimited) keys, lists ``[a,b]``."""
    text = body.strip()
    call = _GEMMA4_CALL.match(text)
    if call is None or not text.startswith("{", call.end()):
        return None
    try:
        arguments, position = _gemma4_object(text, call.end(), 1)
    except _Malformed:
        return None
    if text[position:].strip():
        return None
    return ToolCall(call_id, call.group(1), json.dumps(arguments, ensure_ascii=False))


def _gemma4_value(text: str, position: int, depth: int) -> tuple[Any, int]:
    if text.startswith(GEMMA4_STRING, position):
        return _gemma4_string(text, position)
    if text.startswith("{", position):
        return _gemma4_object(text, position, depth + 1)
    if text.startswith("[", position):
        return _gemma4_list(text, position, depth + 1)
    word = _GEMMA4_WORD.match(text, position)
    if word is not None:
        if word.group() not in _GEMMA4_WORDS:
            raise _Malformed
        return _GEMMA4_WORDS[word.group()], word.end()
    number = _GEMMA4_NUMBER.match(text, position)
    if number is None:
        raise _Malformed
    try:
        return _JSON.decode(number.group()), number.end()
    except ValueError:
        raise _Malformed from None


def _gemma4_string(text: str, position: int) -> tuple[str, int]:
    start = position + len(GEMMA4_STRING)
    end = text.find(GEMMA4_STRING, start)
    if end < 0:
        raise _Malformed
    return text[start:end], end + len(GEMMA4_STRING)


def _gemma4_object(text: str, position: int, depth: int) -> tuple[dict[str, Any], int]:
    """``{`` at ``position`` .. its ``}``."""
    if depth > _GEMMA4_MAX_DEPTH:
        raise _Malformed
    value: dict[str, Any] = {}
    position = _skip(text, position + 1)
    if text.startswith("}", position):
        return value, position + 1
    while True:
        if text.startswith(GEMMA4_STRING, position):
            key, position = _gemma4_string(text, position)
        else:
            bare = _GEMMA4_KEY.match(text, position)
            if bare is None:
                raise _Malformed
            key, position = bare.group().rstrip(), bare.end()
        position = _skip(text, position)
        if key in value or not text.startswith(":", position):
            raise _Malformed
        value[key], position = _gemma4_value(text, _skip(text, position + 1), depth)
        position = _skip(text, position)
        if text.startswith("}", position):
            return value, position + 1
        if not text.startswith(",", position):
            raise _Malformed
        position = _skip(text, position + 1)


def _gemma4_list(text: str, position: int, depth: int) -> tuple[list[Any], int]:
    """``[`` at ``position`` .. its ``]``."""
    if depth > _GEMMA4_MAX_DEPTH:
        raise _Malformed
    value: list[Any] = []
    position = _skip(text, position + 1)
    if text.startswith("]", position):
        return value, position + 1
    while True:
        item, position = _gemma4_value(text, position, depth)
        value.append(item)
        position = _skip(text, position)
        if text.startswith("]", position):
            return value, position + 1
        if not text.startswith(",", position):
            raise _Malformed
        position = _skip(text, position + 1)


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
    if tool_format is ToolCallFormat.MINIMAX_M1:
        return parse_minimax_m1(body, new_id)
    if tool_format is ToolCallFormat.OLMO3:
        return parse_olmo3(body, new_id)
    if tool_format is ToolCallFormat.PHI4_MINI:
        return parse_phi4_mini(body, new_id)
    if tool_format is ToolCallFormat.GEMMA4:
        return _one(parse_gemma4(body, new_id()))
    return parse_deepseek(body, new_id)


def _one(call: ToolCall | None) -> list[ToolCall] | None:
    return None if call is None else [call]
