"""OpenAI Chat Completions (``POST /v1/chat/completions``): requests in, completions and chunks out.

Decisions a reader should know:

- ``system`` and ``developer`` messages both become neutral ``system`` messages.
- ``function.arguments`` is kept verbatim (routing compares it canonically).
- An assistant message's blocks are read as reasoning (``reasoning_content`` or ``reasoning``),
  then text, then tool calls: the only order this format can express. A reply whose blocks
  interleave differently (text after a tool call) cannot come back identical through this
  dialect; the other two preserve block order.
- Empty or null assistant ``content`` means "no text" (clients send either next to tool calls).
- A ``tool`` message keeps the ``name`` the client gave it, and has none otherwise: templates
  print it (OLMo 3's "Function name returned:"), as vLLM passes it.
- Tools other than ``type: "function"`` are not offered to the model; their types are listed in
  ``metadata["ignored_tools"]``.
- ``n`` other than 1, ``audio`` output and legacy ``function_call`` are rejected.
- ``response_format`` (JSON schema or JSON object) constrains the engine's output (see
  ``structured_output.py``).
- A ``tool`` message must follow an assistant message with ``tool_calls`` (or another tool
  message answering it) and name one of its call ids, or the request is refused with the API's
  own 400 (wording, misspelling included, and ``param``): a result for a call that never
  happened would be trained as context.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from collections.abc import Sequence

from protocol_adapters._types import (
    AdapterError,
    ClientSampling,
    ErrorKind,
    NeutralRequest,
    ParsedReply,
    ReasoningDelta,
    ReplyEvent,
    StopReason,
    TextDelta,
    TokenLogprob,
    Usage,
)
from trajectory_tree import Block, Media, Message, Prompt, Reasoning, Text, ToolCall

from .json_shape import (
    JsonObject,
    at,
    expect_list,
    expect_object,
    expect_str,
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
from .openai_errors import openai_error
from .openai_logprobs import logprob_entries, top_logprobs
from .openai_media import image_media
from .openai_tools import nested, tool_fields
from .parse_memo import MemoPass, ParseMemo
from .protocol import Dialect, Logprobs
from .sse_writer import DONE, sse_event
from .structured_output import openai_schema

DIALECT = "openai_chat"

_READ_FIELDS = frozenset(
    (
        "model",
        "messages",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "top_k",
        "stop",
        "stream",
        "stream_options",
        "reasoning_effort",
        "n",
        "user",
        "response_format",
        "logprobs",
        "top_logprobs",
    )
)
_FINISH_REASONS = {
    StopReason.END_TURN: "stop",
    StopReason.TOOL_USE: "tool_calls",
    StopReason.MAX_TOKENS: "length",
}


# -- requests ----------------------------------------------------------------------------------


def parse_request(body: object, memo: ParseMemo | None = None) -> NeutralRequest:
    """Validate a Chat Completions body and normalize it; raises AdapterError(INVALID_REQUEST).
    ``memo``: the session's last request's messages, parsed (only new ones are parsed again)."""
    root = expect_object(body, "")
    model = required_str(root, "model", "")
    raw_messages = expect_list(require(root, "messages", ""), "messages")
    if not raw_messages:
        fail("messages", "must contain at least one message")
    memo_pass = MemoPass(memo)
    prefix = memo_pass.prefix(raw_messages, None)
    messages = [*prefix.messages]
    for i in range(prefix.count, len(raw_messages)):
        raw = raw_messages[i]
        messages.extend(memo_pass.message(raw, None, _one, raw, at("messages", i)))
    _check_tool_messages(messages)
    for key in ("function_call", "functions", "audio"):
        if root.get(key) is not None:
            fail(key, "not supported; use tools / text output")
    n = optional_int(root, "n", "", minimum=1)
    if n not in (None, 1):
        fail("n", f"only one choice per request is supported, got {n}")

    metadata: dict[str, str] = {}
    tools = tool_fields(root, metadata, nested)
    effort = optional_str(root, "reasoning_effort", "")
    if effort is not None:
        metadata["reasoning_effort"] = effort
    stream_options = optional_object(root, "stream_options", "")
    if stream_options is not None and optional_bool(
        stream_options, "include_usage", "stream_options"
    ):
        metadata["include_usage"] = "true"
    ignored = unknown_keys(root, _READ_FIELDS)
    if ignored:
        metadata["ignored_fields"] = ignored

    logprobs = optional_bool(root, "logprobs", "") or False
    top = top_logprobs(root)
    if top and not logprobs:
        fail("top_logprobs", "needs logprobs: true")
    max_tokens = optional_int(root, "max_completion_tokens", "", minimum=1)
    if max_tokens is None:
        max_tokens = optional_int(root, "max_tokens", "", minimum=1)
    sampling = ClientSampling(
        max_tokens=max_tokens,
        temperature=optional_number(root, "temperature", ""),
        top_p=optional_number(root, "top_p", ""),
        top_k=optional_int(root, "top_k", ""),
        stop=_stop(root.get("stop")),
        json_schema=openai_schema(root.get("response_format"), "response_format", nested=True),
        logprobs=logprobs,
        top_logprobs=top,
    )
    memo_pass.keep()
    return NeutralRequest(
        dialect=DIALECT,
        model=model,
        prompt=Prompt(tuple(messages), tuple(tools)),
        sampling=sampling,
        stream=optional_bool(root, "stream", "") or False,
        metadata=metadata,
    )


def _check_tool_messages(messages: list[Message]) -> None:
    calls: frozenset[str] | None = None  # what a tool message here may answer (None: nothing)
    for i, message in enumerate(messages):
        if message.role == "tool":
            if calls is None:
                raise AdapterError(
                    ErrorKind.INVALID_REQUEST,
                    "Invalid parameter: messages with role 'tool' must be a response to a "
                    "preceeding message with 'tool_calls'.",
                    param=f"messages.[{i}].role",
                )
            if message.tool_call_id not in calls:
                raise AdapterError(
                    ErrorKind.INVALID_REQUEST,
                    f"Invalid parameter: 'tool_call_id' of '{message.tool_call_id}' not found in "
                    "'tool_calls' of previous message.",
                    param=f"messages.[{i}].tool_call_id",
                )
        elif message.role == "assistant" and message.tool_calls:
            calls = frozenset(call.id for call in message.tool_calls)
        else:
            calls = None


def _stop(raw: object) -> tuple[str, ...]:
    if raw is None:
        return ()
    if isinstance(raw, str):
        return (raw,)
    return string_list(raw, "stop")


def _one(raw: object, path: str) -> list[Message]:
    return [_message(raw, path)]


def _message(raw: object, path: str) -> Message:
    obj = expect_object(raw, path)
    role = required_str(obj, "role", path)
    content_path = at(path, "content")
    if role in ("system", "developer"):
        return Message("system", _parts(require(obj, "content", path), content_path, images=False))
    if role == "user":
        return Message("user", _parts(require(obj, "content", path), content_path, images=True))
    if role == "assistant":
        return _assistant(obj, path)
    if role == "tool":
        call_id = required_str(obj, "tool_call_id", path)
        content = _parts(require(obj, "content", path), content_path, images=False)
        name = optional_str(obj, "name", path)
        return Message("tool", content, tool_call_id=call_id, name=name)
    fail(
        at(path, "role"),
        f"unknown role {role!r}; expected 'system', 'developer', 'user', 'assistant' or 'tool'",
    )


def _parts(content: object, path: str, *, images: bool) -> tuple[Block, ...]:
    """String content, or an array of ``text`` (and, for users, ``image_url``) parts."""
    if isinstance(content, str):
        return (Text(content),)
    blocks: list[Block] = []
    for i, raw in enumerate(expect_list(content, path)):
        part_path = at(path, i)
        part = expect_object(raw, part_path)
        kind = required_str(part, "type", part_path)
        if kind == "text":
            blocks.append(Text(required_str(part, "text", part_path)))
        elif kind == "image_url" and images:
            blocks.append(_image(part, part_path))
        else:
            fail(at(part_path, "type"), f"unsupported content part type {kind!r} here")
    return tuple(blocks)


def _image(part: JsonObject, path: str) -> Media:
    image = require(part, "image_url", path)
    url = (
        image
        if isinstance(image, str)
        else required_str(expect_object(image, at(path, "image_url")), "url", at(path, "image_url"))
    )
    return image_media(url)


def _assistant(obj: JsonObject, path: str) -> Message:
    if obj.get("function_call") is not None:
        fail(at(path, "function_call"), "legacy function_call is not supported; use tool_calls")
    blocks: list[Block] = []
    for key in ("reasoning_content", "reasoning"):
        reasoning = optional_str(obj, key, path)
        if reasoning:
            blocks.append(Reasoning(reasoning))
            break
    content = obj.get("content")
    if isinstance(content, list):
        for i, raw in enumerate(content):
            part_path = at(at(path, "content"), i)
            part = expect_object(raw, part_path)
            kind = required_str(part, "type", part_path)
            if kind == "text":
                blocks.append(Text(required_str(part, "text", part_path)))
            elif kind == "refusal":
                blocks.append(Text(required_str(part, "refusal", part_path)))
            else:
                fail(at(part_path, "type"), f"unsupported content part type {kind!r} here")
    elif content is not None:
        text = expect_str(content, at(path, "content"))
        if text:
            blocks.append(Text(text))
    raw_calls = obj.get("tool_calls")
    if raw_calls is not None:
        calls_path = at(path, "tool_calls")
        for i, raw in enumerate(expect_list(raw_calls, calls_path)):
            blocks.append(_tool_call(raw, at(calls_path, i)))
    return Message("assistant", tuple(blocks))


def _tool_call(raw: object, path: str) -> ToolCall:
    call = expect_object(raw, path)
    kind = optional_str(call, "type", path) or "function"
    if kind != "function":
        fail(at(path, "type"), f"unsupported tool call type {kind!r}")
    function_path = at(path, "function")
    function = expect_object(require(call, "function", path), function_path)
    return ToolCall(
        required_str(call, "id", path),
        required_str(function, "name", function_path),
        required_str(function, "arguments", function_path),
    )


# -- responses ---------------------------------------------------------------------------------


def _usage(usage: Usage) -> dict[str, int]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def _tool_call_json(call: ToolCall) -> dict[str, object]:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


def _logprobs(tokens: Sequence[TokenLogprob]) -> dict[str, object]:
    return {"content": logprob_entries(tokens), "refusal": None}


def response_body(
    reply: ParsedReply,
    usage: Usage,
    stop: StopReason,
    model: str,
    response_id: str,
    *,
    created: int | None = None,
    logprobs: Sequence[TokenLogprob] | None = None,
) -> dict[str, object]:
    """The non-streaming ``chat.completion`` object for a reply (``logprobs``: the generated
    tokens, when the client asked for them)."""
    message = reply.message
    text = [b.text for b in message.content if isinstance(b, Text)]
    body: dict[str, object] = {"role": "assistant", "content": "".join(text) if text else None}
    if message.reasoning:
        body["reasoning_content"] = "".join(r.text for r in message.reasoning)
    if message.tool_calls:
        body["tool_calls"] = [_tool_call_json(call) for call in message.tool_calls]
    choice = {
        "index": 0,
        "message": body,
        "finish_reason": _FINISH_REASONS[stop],
        "logprobs": None if logprobs is None else _logprobs(logprobs),
    }
    return {
        "id": response_id,
        "object": "chat.completion",
        "created": int(time.time()) if created is None else created,
        "model": model,
        "choices": [choice],
        "usage": _usage(usage),
    }


class StreamEncoder:
    """Turns one reply's events into ``chat.completion.chunk`` SSE lines ending in ``[DONE]``.

    With ``include_usage`` (the client's ``stream_options.include_usage``) every chunk carries
    ``"usage": null`` and a final chunk with empty ``choices`` carries the real usage. Token
    logprobs given to :meth:`logprobs` ride on the next chunk written (the last on the finish).
    """

    def __init__(
        self,
        model: str,
        response_id: str,
        *,
        include_usage: bool = False,
        created: int | None = None,
    ) -> None:
        self._model = model
        self._response_id = response_id
        self._include_usage = include_usage
        self._created = int(time.time()) if created is None else created
        self._calls = 0
        self._done = False
        self._tokens: list[TokenLogprob] = []

    def start(self, usage_in: Usage) -> bytes:
        del usage_in  # Chat Completions reports usage only at the end.
        self._check_open()
        return self._chunk({"role": "assistant"})

    def event(self, e: ReplyEvent) -> bytes:
        self._check_open()
        if isinstance(e, ReasoningDelta):
            return self._chunk({"reasoning_content": e.text}) if e.text else b""
        if isinstance(e, TextDelta):
            return self._chunk({"content": e.text}) if e.text else b""
        call = {"index": self._calls, **_tool_call_json(e.call)}
        self._calls += 1
        return self._chunk({"tool_calls": [call]})

    def logprobs(self, tokens: Sequence[TokenLogprob]) -> bytes:
        self._tokens.extend(tokens)
        return b""

    def finish(self, stop: StopReason, usage: Usage) -> bytes:
        self._check_open()
        self._done = True
        out = self._chunk({}, finish_reason=_FINISH_REASONS[stop])
        if self._include_usage:
            out += sse_event(self._envelope([], _usage(usage)))
        return out + DONE

    def error(self, kind: ErrorKind, message: str) -> bytes:
        """A mid-stream ``{"error": ...}`` data line; OpenAI clients raise on it."""
        self._done = True
        _, body = error_response(kind, message)
        return sse_event(body)

    def _check_open(self) -> None:
        if self._done:
            raise RuntimeError("the stream has already ended")

    def _chunk(self, delta: dict[str, object], finish_reason: str | None = None) -> bytes:
        choice = {
            "index": 0,
            "delta": delta,
            "finish_reason": finish_reason,
            "logprobs": _logprobs(self._tokens) if self._tokens else None,
        }
        self._tokens = []
        return sse_event(self._envelope([choice], None))

    def _envelope(self, choices: list[object], usage: dict[str, int] | None) -> dict[str, object]:
        chunk: dict[str, object] = {
            "id": self._response_id,
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": self._model,
            "choices": choices,
        }
        if self._include_usage:
            chunk["usage"] = usage
        return chunk


def error_response(
    kind: ErrorKind, message: str, param: str | None = None
) -> tuple[int, dict[str, object]]:
    """HTTP status and OpenAI error body; context length carries ``context_length_exceeded``."""
    return openai_error(kind, message, param, context_param="messages")


# -- the dialect -------------------------------------------------------------------------------


class OpenAIChatDialect(Dialect):
    """Chat Completions behind the server's uniform :class:`Dialect`."""

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
        return response_body(reply, usage, stop, request.model, response_id, logprobs=logprobs)

    def stream_encoder(self, request: NeutralRequest, response_id: str) -> StreamEncoder:
        include_usage = request.metadata.get("include_usage") == "true"
        return StreamEncoder(request.model, response_id, include_usage=include_usage)

    def error_response(
        self, kind: ErrorKind, message: str, param: str | None = None
    ) -> tuple[int, dict[str, object]]:
        return error_response(kind, message, param)

    def new_response_id(self) -> str:
        return "chatcmpl-" + secrets.token_hex(12)

    def echoed(self, message: Message) -> Message:
        """A reply as a Chat Completions client holds it: one reasoning text, one content text,
        then the calls. The wire keeps no order between text and calls, so text the model wrote
        after a call (or whitespace, as Hermes-style templates write) comes back joined with the
        rest."""
        reasoning = "".join(r.text for r in message.reasoning)
        text = "".join(b.text for b in message.content if isinstance(b, Text))
        blocks: list[Block] = [Reasoning(reasoning)] if reasoning else []
        if text:
            blocks.append(Text(text))
        blocks.extend(message.tool_calls)
        return dataclasses.replace(message, content=tuple(blocks))
