"""Anthropic Messages (``POST /v1/messages``): requests in, messages and SSE events out.

Accepts everything Claude Code sends (packages/harness/docs/clients.md): system text blocks with
``cache_control`` (ignored), ``role: "system"`` entries inside ``messages``, thinking blocks with
signatures, re-serialized ``tool_use`` inputs, parallel ``tool_result`` blocks in completion
order, ``context_management`` (accepted and ignored; its name is kept in
``metadata["ignored_fields"]``) and ``output_config`` (its ``format`` is the structured output
the engine is constrained to, see ``structured_output.py``; its ``effort`` is recorded).

Decisions a reader should know:

- A user message's ``tool_result`` blocks become one neutral ``tool`` message each, in the
  order given, followed by one ``user`` message with the remaining blocks (the API requires
  tool results first, so nothing is reordered in practice).
- A ``tool_result`` must answer a ``tool_use`` of the assistant message before it (``system``
  entries in between are allowed), or the request is refused with the API's own 400: a result
  for a call that never happened would be trained as context.
- ``tool_use.input`` becomes canonical JSON text (sorted keys, compact, UTF-8 kept).
- Tool arguments the model produced that are not a JSON object cannot be an ``input`` dict; they
  go out as ``{"__raw_arguments__": "<text>"}`` and that exact shape is read back to the raw text,
  so the echo still equals the reply and the client's tool sees (and reports) bad input.
- Server tools (``type`` other than ``custom``) are not offered to the model; their
  ``type:name`` are listed in ``metadata["ignored_tools"]``.
- ``max_tokens`` may be absent (the ``count_tokens`` body has none).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence
from typing import Literal, cast

from protocol_adapters._types import (
    ClientSampling,
    ErrorKind,
    NeutralRequest,
    ParsedReply,
    ReasoningDelta,
    ReplyEvent,
    StopReason,
    TextDelta,
    TokenLogprob,
    ToolCallDone,
    Usage,
)
from trajectory_tree import Block, Media, Message, Prompt, Reasoning, Text, ToolCall, ToolSpec

from .json_shape import (
    JsonObject,
    at,
    compact_dumps,
    expect_list,
    expect_object,
    fail,
    optional_bool,
    optional_int,
    optional_number,
    optional_object,
    optional_str,
    require,
    required_str,
    string_list,
    unknown_keys,
)
from .opaque import thinking_signature
from .parse_memo import MemoPass, ParseMemo
from .protocol import Dialect, Logprobs
from .sse_writer import sse_event
from .structured_output import anthropic_schema

DIALECT = "anthropic"
RAW_ARGUMENTS_KEY = "__raw_arguments__"

_READ_FIELDS = frozenset(
    (
        "model",
        "messages",
        "system",
        "tools",
        "tool_choice",
        "thinking",
        "metadata",
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "stop_sequences",
        "stream",
        "output_config",
    )
)
_THINKING_TYPES = ("enabled", "disabled", "adaptive")
_TOOL_CHOICE_TYPES = ("auto", "any", "tool", "none")


# -- requests ----------------------------------------------------------------------------------


def parse_request(body: object, memo: ParseMemo | None = None) -> NeutralRequest:
    """Validate a Messages request body and normalize it; raises AdapterError(INVALID_REQUEST).
    ``memo``: the session's last request's messages, parsed (only new ones are parsed again)."""
    root = expect_object(body, "")
    model = required_str(root, "model", "")
    metadata: dict[str, str] = {}

    messages: list[Message] = []
    if root.get("system") is not None:
        messages.append(Message("system", _text_blocks(root["system"], "system")))
    raw_messages = expect_list(require(root, "messages", ""), "messages")
    if not raw_messages:
        fail("messages", "must contain at least one message")
    memo_pass = MemoPass(memo)
    # The parse state: the tool_use ids of the previous assistant message.
    prefix = memo_pass.prefix(raw_messages, frozenset())
    messages.extend(prefix.messages)
    calls = cast(frozenset[str], prefix.state)
    for i in range(prefix.count, len(raw_messages)):
        raw = raw_messages[i]
        parsed = memo_pass.message(raw, calls, _message, raw, at("messages", i), calls)
        messages.extend(parsed)
        if parsed[0].role == "assistant":
            calls = frozenset(call.id for call in parsed[0].tool_calls)
        elif parsed[0].role != "system":
            calls = frozenset()

    tools = _tools(root.get("tools"), metadata)
    _tool_choice(root.get("tool_choice"), metadata)
    _thinking(root.get("thinking"), metadata)
    client_metadata = optional_object(root, "metadata", "")
    if client_metadata is not None:
        user_id = optional_str(client_metadata, "user_id", "metadata")
        if user_id is not None:
            metadata["user_id"] = user_id
    output_config = optional_object(root, "output_config", "")
    json_schema = None
    if output_config is not None:
        effort = optional_str(output_config, "effort", "output_config")
        if effort is not None:
            metadata["effort"] = effort
        json_schema = anthropic_schema(output_config)
    ignored = unknown_keys(root, _READ_FIELDS)
    if ignored:
        metadata["ignored_fields"] = ignored

    stop = root.get("stop_sequences")
    sampling = ClientSampling(
        max_tokens=optional_int(root, "max_tokens", "", minimum=1),
        temperature=optional_number(root, "temperature", ""),
        top_p=optional_number(root, "top_p", ""),
        top_k=optional_int(root, "top_k", ""),
        stop=() if stop is None else string_list(stop, "stop_sequences"),
        json_schema=json_schema,
    )
    memo_pass.keep(calls)
    return NeutralRequest(
        dialect=DIALECT,
        model=model,
        prompt=Prompt(tuple(messages), tuple(tools)),
        sampling=sampling,
        stream=optional_bool(root, "stream", "") or False,
        metadata=metadata,
    )


def _message(raw: object, path: str, calls: frozenset[str]) -> list[Message]:
    obj = expect_object(raw, path)
    role = required_str(obj, "role", path)
    content = require(obj, "content", path)
    content_path = at(path, "content")
    if role == "user":
        return _user_messages(content, content_path, calls)
    if role == "assistant":
        return [Message("assistant", _assistant_blocks(content, content_path))]
    if role == "system":
        return [Message("system", _text_blocks(content, content_path))]
    fail(at(path, "role"), f"unknown role {role!r}; expected 'user', 'assistant' or 'system'")


def _blocks(content: object, path: str) -> list[tuple[str, JsonObject, str]]:
    """(type, block, path) of each block; a plain string is one text block."""
    if isinstance(content, str):
        return [("text", {"type": "text", "text": content}, path)]
    result = []
    for i, raw in enumerate(expect_list(content, path)):
        block_path = at(path, i)
        block = expect_object(raw, block_path)
        result.append((required_str(block, "type", block_path), block, block_path))
    return result


def _text_blocks(content: object, path: str) -> tuple[Block, ...]:
    blocks: list[Block] = []
    for kind, block, block_path in _blocks(content, path):
        if kind != "text":
            fail(at(block_path, "type"), f"expected 'text' here, got {kind!r}")
        blocks.append(Text(required_str(block, "text", block_path)))
    return tuple(blocks)


def _user_messages(content: object, path: str, calls: frozenset[str]) -> list[Message]:
    results: list[Message] = []
    rest: list[Block] = []
    for kind, block, block_path in _blocks(content, path):
        if kind == "tool_result":
            result = _tool_result(block, block_path)
            if result.tool_call_id not in calls:
                fail(
                    block_path,
                    f"unexpected `tool_use_id` found in `tool_result` blocks: "
                    f"{result.tool_call_id}. Each `tool_result` block must have a corresponding "
                    "`tool_use` block in the previous message.",
                )
            results.append(result)
        elif kind == "text":
            rest.append(Text(required_str(block, "text", block_path)))
        elif kind in ("image", "document"):
            rest.append(_media(block, block_path, kind))
        else:
            fail(at(block_path, "type"), f"unknown block type {kind!r} in a user message")
    if rest or not results:
        results.append(Message("user", tuple(rest)))
    return results


def _tool_result(block: JsonObject, path: str) -> Message:
    call_id = required_str(block, "tool_use_id", path)
    content: list[Block] = []
    raw = block.get("content")
    if raw is not None:
        for kind, part, part_path in _blocks(raw, at(path, "content")):
            if kind == "text":
                content.append(Text(required_str(part, "text", part_path)))
            elif kind in ("image", "document"):
                content.append(_media(part, part_path, kind))
            else:
                fail(at(part_path, "type"), f"unknown block type {kind!r} in a tool_result")
    is_error = optional_bool(block, "is_error", path) or False
    return Message("tool", tuple(content), tool_call_id=call_id, is_error=is_error)


def _media(block: JsonObject, path: str, kind: str) -> Media:
    source_path = at(path, "source")
    source = expect_object(require(block, "source", path), source_path)
    source_type = required_str(source, "type", source_path)
    if source_type == "base64":
        media_type = required_str(source, "media_type", source_path)
        data = required_str(source, "data", source_path)
        return Media(media_type, f"data:{media_type};base64,{data}")
    if source_type == "url":
        return Media(kind, required_str(source, "url", source_path))
    if source_type == "text":
        media_type = optional_str(source, "media_type", source_path) or "text/plain"
        return Media(media_type, required_str(source, "data", source_path))
    fail(at(source_path, "type"), f"unsupported {kind} source type {source_type!r}")


def _assistant_blocks(content: object, path: str) -> tuple[Block, ...]:
    blocks: list[Block] = []
    for kind, block, block_path in _blocks(content, path):
        if kind == "text":
            blocks.append(Text(required_str(block, "text", block_path)))
        elif kind == "thinking":
            text = required_str(block, "thinking", block_path)
            signature = optional_str(block, "signature", block_path)
            blocks.append(Reasoning(text, signature=signature))
        elif kind == "redacted_thinking":
            blocks.append(Reasoning("", encrypted=required_str(block, "data", block_path)))
        elif kind == "tool_use":
            blocks.append(_tool_use(block, block_path))
        else:
            fail(at(block_path, "type"), f"unknown block type {kind!r} in an assistant message")
    return tuple(blocks)


def _tool_use(block: JsonObject, path: str) -> ToolCall:
    call_id = required_str(block, "id", path)
    name = required_str(block, "name", path)
    tool_input = expect_object(require(block, "input", path), at(path, "input"))
    raw = tool_input.get(RAW_ARGUMENTS_KEY)
    if len(tool_input) == 1 and isinstance(raw, str):
        return ToolCall(call_id, name, raw)
    return ToolCall(call_id, name, compact_dumps(tool_input))  # key order as the client sent it


def _tools(raw: object, metadata: dict[str, str]) -> list[ToolSpec]:
    if raw is None:
        return []
    specs: list[ToolSpec] = []
    ignored: list[str] = []
    for i, item in enumerate(expect_list(raw, "tools")):
        path = at("tools", i)
        tool = expect_object(item, path)
        name = required_str(tool, "name", path)
        kind = optional_str(tool, "type", path) or "custom"
        if kind != "custom":
            ignored.append(f"{kind}:{name}")
            continue
        schema = expect_object(require(tool, "input_schema", path), at(path, "input_schema"))
        description = optional_str(tool, "description", path) or ""
        specs.append(ToolSpec(name, description, compact_dumps(schema)))
    if ignored:
        metadata["ignored_tools"] = ",".join(ignored)
    return specs


def _tool_choice(raw: object, metadata: dict[str, str]) -> None:
    if raw is None:
        return
    choice = expect_object(raw, "tool_choice")
    kind = required_str(choice, "type", "tool_choice")
    if kind not in _TOOL_CHOICE_TYPES:
        fail("tool_choice.type", f"unknown tool_choice type {kind!r}")
    metadata["tool_choice"] = kind
    if kind == "tool":
        metadata["tool_choice_name"] = required_str(choice, "name", "tool_choice")
    if optional_bool(choice, "disable_parallel_tool_use", "tool_choice"):
        metadata["parallel_tool_calls"] = "false"


def _thinking(raw: object, metadata: dict[str, str]) -> None:
    if raw is None:
        return
    thinking = expect_object(raw, "thinking")
    kind = required_str(thinking, "type", "thinking")
    if kind not in _THINKING_TYPES:
        fail("thinking.type", f"unknown thinking type {kind!r}; expected one of {_THINKING_TYPES}")
    metadata["thinking"] = kind
    budget = optional_int(thinking, "budget_tokens", "thinking", minimum=1)
    if kind == "enabled" and budget is None:
        fail("thinking.budget_tokens", "field required when thinking is enabled")
    if budget is not None:
        metadata["thinking_budget"] = str(budget)


# -- responses ---------------------------------------------------------------------------------


def _tool_input(arguments: str) -> dict[str, object]:
    """The ``input`` dict for tool arguments; non-object or invalid JSON is wrapped verbatim."""
    try:
        value = json.loads(arguments, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        value = None
    if isinstance(value, dict):
        return value
    return {RAW_ARGUMENTS_KEY: arguments}


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _usage(usage: Usage) -> dict[str, int]:
    return {
        "input_tokens": usage.prompt_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": usage.completion_tokens,
    }


def _content_block(block: Block) -> dict[str, object]:
    if isinstance(block, Text):
        return {"type": "text", "text": block.text}
    if isinstance(block, Reasoning):
        return {
            "type": "thinking",
            "thinking": block.text,
            "signature": thinking_signature(block.text),
        }
    if isinstance(block, ToolCall):
        return {
            "type": "tool_use",
            "id": block.id,
            "name": block.name,
            "input": _tool_input(block.arguments),
        }
    raise ValueError("an assistant reply cannot contain media")


def response_body(
    reply: ParsedReply, usage: Usage, stop: StopReason, model: str, response_id: str
) -> dict[str, object]:
    """The non-streaming ``message`` object for a reply."""
    return {
        "id": response_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [_content_block(block) for block in reply.message.content],
        "stop_reason": stop.value,
        "stop_sequence": None,
        "usage": _usage(usage),
    }


class StreamEncoder:
    """Turns one reply's events into Messages SSE: ``message_start``, content blocks, stop.

    Consecutive deltas of one kind share a content block; a thinking block closes with a
    ``signature_delta`` carrying the same signature the non-streaming body would have.
    """

    def __init__(self, model: str, response_id: str) -> None:
        self._model = model
        self._response_id = response_id
        self._index = -1
        self._open: Literal["thinking", "text"] | None = None
        self._thinking: list[str] = []
        self._done = False

    def start(self, usage_in: Usage) -> bytes:
        message: dict[str, object] = {
            "id": self._response_id,
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": _usage(usage_in),
        }
        return sse_event({"type": "message_start", "message": message}, "message_start") + (
            sse_event({"type": "ping"}, "ping")
        )

    def event(self, e: ReplyEvent) -> bytes:
        self._check_open()
        if isinstance(e, ToolCallDone):
            call = e.call
            start = {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": _arguments_json(call.arguments)}
            return self._close() + self._start_block(start) + self._delta(delta) + self._stop()
        if not e.text:
            return b""
        if isinstance(e, ReasoningDelta):
            out = b"" if self._open == "thinking" else self._close() + self._begin("thinking")
            self._thinking.append(e.text)
            return out + self._delta({"type": "thinking_delta", "thinking": e.text})
        assert isinstance(e, TextDelta)
        out = b"" if self._open == "text" else self._close() + self._begin("text")
        return out + self._delta({"type": "text_delta", "text": e.text})

    def logprobs(self, tokens: Sequence[TokenLogprob]) -> bytes:
        """The Messages API has no token logprobs: nothing to write."""
        del tokens
        return b""

    def finish(self, stop: StopReason, usage: Usage) -> bytes:
        self._check_open()
        out = self._close()
        self._done = True
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": stop.value, "stop_sequence": None},
            "usage": _usage(usage),
        }
        return (
            out
            + sse_event(delta, "message_delta")
            + sse_event({"type": "message_stop"}, "message_stop")
        )

    def error(self, kind: ErrorKind, message: str) -> bytes:
        """A mid-stream ``error`` event; the stream ends with it."""
        self._done = True
        _, body = error_response(kind, message)
        return sse_event(body, "error")

    def _check_open(self) -> None:
        if self._done:
            raise RuntimeError("the stream has already ended")

    def _begin(self, kind: Literal["thinking", "text"]) -> bytes:
        self._open = kind
        if kind == "thinking":
            self._thinking = []
            return self._start_block({"type": "thinking", "thinking": "", "signature": ""})
        return self._start_block({"type": "text", "text": ""})

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        out = b""
        if self._open == "thinking":
            signature = thinking_signature("".join(self._thinking))
            out = self._delta({"type": "signature_delta", "signature": signature})
        self._open = None
        return out + self._stop()

    def _start_block(self, block: Mapping[str, object]) -> bytes:
        self._index += 1
        event = {"type": "content_block_start", "index": self._index, "content_block": block}
        return sse_event(event, "content_block_start")

    def _delta(self, delta: Mapping[str, object]) -> bytes:
        event = {"type": "content_block_delta", "index": self._index, "delta": delta}
        return sse_event(event, "content_block_delta")

    def _stop(self) -> bytes:
        return sse_event({"type": "content_block_stop", "index": self._index}, "content_block_stop")


def _arguments_json(arguments: str) -> str:
    return compact_dumps(_tool_input(arguments))


# -- errors ------------------------------------------------------------------------------------

_ERRORS: dict[ErrorKind, tuple[int, str]] = {
    ErrorKind.INVALID_REQUEST: (400, "invalid_request_error"),
    ErrorKind.CONTEXT_LENGTH: (400, "invalid_request_error"),
    ErrorKind.AUTHENTICATION: (401, "authentication_error"),
    ErrorKind.NOT_FOUND: (404, "not_found_error"),
    ErrorKind.REQUEST_TOO_LARGE: (413, "request_too_large"),
    ErrorKind.RATE_LIMITED: (429, "rate_limit_error"),
    ErrorKind.ENGINE_ERROR: (500, "api_error"),
    ErrorKind.TIMEOUT: (504, "timeout_error"),
    ErrorKind.OVERLOADED: (529, "overloaded_error"),
}


def error_response(
    kind: ErrorKind, message: str, param: str | None = None
) -> tuple[int, dict[str, object]]:
    """HTTP status and body. A context-length error is the 400 that makes Claude Code compact:
    pass a message like ``prompt is too long: N tokens > M maximum``. (Anthropic's shape has no
    ``param``: its messages start with the field's path instead.)"""
    del param
    status, error_type = _ERRORS[kind]
    return status, {"type": "error", "error": {"type": error_type, "message": message}}


# -- the dialect -------------------------------------------------------------------------------


class AnthropicDialect(Dialect):
    """Anthropic Messages behind the server's uniform :class:`Dialect`."""

    name = DIALECT

    def parse_request(self, body: object, memo: ParseMemo | None = None) -> NeutralRequest:
        return parse_request(body, memo)

    def response_body(
        self,
        request: NeutralRequest,
        reply: ParsedReply,
        usage: Usage,
        stop: StopReason,
        response_id: str,
        logprobs: Logprobs,
    ) -> dict[str, object]:
        del logprobs  # the Messages API has no token logprobs
        return response_body(reply, usage, stop, request.model, response_id)

    def stream_encoder(self, request: NeutralRequest, response_id: str) -> StreamEncoder:
        return StreamEncoder(request.model, response_id)

    def error_response(
        self, kind: ErrorKind, message: str, param: str | None = None
    ) -> tuple[int, dict[str, object]]:
        return error_response(kind, message, param)

    def new_response_id(self) -> str:
        return "msg_" + secrets.token_hex(12)
