"""OpenAI Responses (``POST /v1/responses``): what current Codex speaks, and nothing else.

Decisions a reader should know:

- ``instructions`` becomes a leading ``system`` message; ``developer`` and ``system`` messages
  become ``system`` messages where they stand.
- Consecutive assistant-side items (``reasoning``, assistant ``message``, ``function_call``) form
  ONE neutral assistant message, blocks in item order, the way the model produced them; any
  other item (a user/system message, a ``function_call_output``) ends it.
- A reasoning item's text is, in order of preference: the text inside our own
  ``encrypted_content`` (what the model actually produced, whatever the client did to the
  summary), its ``reasoning_text`` content, or its summary texts joined by blank lines. The
  ``encrypted_content`` is kept on the neutral Reasoning.
- Our replies put each run of text in one ``message`` item (one ``output_text`` part per text
  block), each reasoning block in one ``reasoning`` item (its text as the single summary part,
  plus an ``encrypted_content`` we can read back), each tool call in one ``function_call`` item.
- A reply cut by the token limit ends ``incomplete`` (``response.incomplete``,
  ``incomplete_details.reason = "max_output_tokens"``), as OpenAI does.
- Tools other than ``type: "function"`` (web_search, custom, local_shell, ...) are not offered
  to the model; their types are listed in ``metadata["ignored_tools"]``. Input items of those
  kinds cannot occur (we never produce them) and are rejected.
- ``previous_response_id`` is rejected: nothing is stored; send the full input (``store: false``).
- ``text.format`` (JSON schema or JSON object) constrains the engine's output (see
  ``structured_output.py``).
- A ``function_call_output`` must answer a ``function_call`` earlier in the input, or the request
  is refused with the API's own 400: a result for a call that never happened would be trained
  as context.
"""

from __future__ import annotations

import json
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
    ToolCallDone,
    Usage,
)
from trajectory_tree import Block, Message, Prompt, Reasoning, Text, ToolCall

from .json_shape import (
    JsonObject,
    at,
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
from .opaque import decode_reasoning, encode_reasoning
from .openai_errors import error_code, openai_error
from .openai_logprobs import logprob_entries, top_logprobs
from .openai_media import image_media
from .openai_tools import flat, tool_fields
from .parse_memo import ParseMemo
from .protocol import Dialect, Logprobs
from .sse_writer import sse_event
from .structured_output import openai_schema

DIALECT = "openai_responses"
LOGPROBS_INCLUDE = "message.output_text.logprobs"
"""The ``include`` entry that asks for the generated tokens' logprobs."""

_READ_FIELDS = frozenset(
    (
        "model",
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "reasoning",
        "store",
        "include",
        "prompt_cache_key",
        "max_output_tokens",
        "temperature",
        "top_p",
        "top_k",
        "stream",
        "previous_response_id",
        "text",
        "top_logprobs",
    )
)
_MESSAGE_ROLES = {
    "user": "user",
    "system": "system",
    "developer": "system",
    "assistant": "assistant",
}


# -- requests ----------------------------------------------------------------------------------


def parse_request(body: object) -> NeutralRequest:
    """Validate a Responses body and normalize it; raises AdapterError(INVALID_REQUEST)."""
    root = expect_object(body, "")
    model = required_str(root, "model", "")
    if root.get("previous_response_id") is not None:
        fail("previous_response_id", "not supported: nothing is stored; send the full input")
    messages: list[Message] = []
    instructions = optional_str(root, "instructions", "")
    if instructions is not None:
        messages.append(Message.text("system", instructions))
    raw_input = require(root, "input", "")
    if isinstance(raw_input, str):
        messages.append(Message.text("user", raw_input))
    else:
        messages.extend(_items(expect_list(raw_input, "input")))
    if not messages:
        fail("input", "must contain at least one item")

    metadata: dict[str, str] = {}
    tools = tool_fields(root, metadata, flat)
    reasoning = optional_object(root, "reasoning", "")
    if reasoning is not None:
        for key in ("effort", "summary"):
            value = optional_str(reasoning, key, "reasoning")
            if value is not None:
                metadata[f"reasoning_{key}"] = value
    store = optional_bool(root, "store", "")
    if store is not None:
        metadata["store"] = "true" if store else "false"
    include = () if root.get("include") is None else string_list(root["include"], "include")
    if include:
        metadata["include"] = ",".join(include)
    cache_key = optional_str(root, "prompt_cache_key", "")
    if cache_key is not None:
        metadata["prompt_cache_key"] = cache_key
    ignored = unknown_keys(root, _READ_FIELDS)
    if ignored:
        metadata["ignored_fields"] = ignored

    text = optional_object(root, "text", "")
    sampling = ClientSampling(
        max_tokens=optional_int(root, "max_output_tokens", "", minimum=1),
        temperature=optional_number(root, "temperature", ""),
        top_p=optional_number(root, "top_p", ""),
        top_k=optional_int(root, "top_k", ""),
        json_schema=None
        if text is None
        else openai_schema(text.get("format"), "text.format", nested=False),
        logprobs=LOGPROBS_INCLUDE in include,
        top_logprobs=top_logprobs(root),
    )
    return NeutralRequest(
        dialect=DIALECT,
        model=model,
        prompt=Prompt(tuple(messages), tuple(tools)),
        sampling=sampling,
        stream=optional_bool(root, "stream", "") or False,
        metadata=metadata,
    )


def _items(items: list[object]) -> list[Message]:
    """Input items to messages, grouping each model turn's items into one assistant message."""
    messages: list[Message] = []
    turn: list[Block] = []
    called: set[str] = set()
    for i, raw in enumerate(items):
        path = at("input", i)
        item = expect_object(raw, path)
        kind = optional_str(item, "type", path) or "message"
        role = optional_str(item, "role", path) if kind == "message" else None
        if kind == "reasoning":
            turn.append(_reasoning(item, path))
        elif kind == "function_call":
            call = _function_call(item, path)
            called.add(call.id)
            turn.append(call)
        elif kind == "message" and role == "assistant":
            turn.extend(_content(require(item, "content", path), at(path, "content"), False))
        else:
            if turn:
                messages.append(Message("assistant", tuple(turn)))
                turn = []
            message = _other_item(item, kind, path)
            if message.role == "tool" and message.tool_call_id not in called:
                raise AdapterError(
                    ErrorKind.INVALID_REQUEST,
                    "No tool call found for function call output with call_id "
                    f"{message.tool_call_id}.",
                    param="input",
                )
            messages.append(message)
    if turn:
        messages.append(Message("assistant", tuple(turn)))
    return messages


def _other_item(item: JsonObject, kind: str, path: str) -> Message:
    if kind == "function_call_output":
        call_id = required_str(item, "call_id", path)
        content = _content(require(item, "output", path), at(path, "output"), True)
        return Message("tool", content, tool_call_id=call_id)
    if kind == "message":
        role = required_str(item, "role", path)
        neutral = _MESSAGE_ROLES.get(role)
        if neutral is None:
            fail(at(path, "role"), f"unknown role {role!r}")
        content = _content(require(item, "content", path), at(path, "content"), role == "user")
        return Message(neutral, content)  # type: ignore[arg-type]
    fail(at(path, "type"), f"unsupported input item type {kind!r}")


def _content(content: object, path: str, images: bool) -> tuple[Block, ...]:
    if isinstance(content, str):
        return (Text(content),)
    blocks: list[Block] = []
    for i, raw in enumerate(expect_list(content, path)):
        part_path = at(path, i)
        part = expect_object(raw, part_path)
        kind = required_str(part, "type", part_path)
        if kind in ("input_text", "output_text"):
            blocks.append(Text(required_str(part, "text", part_path)))
        elif kind == "input_image" and images:
            url = optional_str(part, "image_url", part_path)
            if url is None:
                fail(
                    at(part_path, "image_url"), "field required (file_id images are not supported)"
                )
            blocks.append(image_media(url))
        else:
            fail(at(part_path, "type"), f"unsupported content part type {kind!r} here")
    return tuple(blocks)


def _reasoning(item: JsonObject, path: str) -> Reasoning:
    summary = [
        required_str(
            expect_object(part, at(at(path, "summary"), i)), "text", at(at(path, "summary"), i)
        )
        for i, part in enumerate(expect_list(require(item, "summary", path), at(path, "summary")))
    ]
    content = [
        required_str(
            expect_object(part, at(at(path, "content"), i)), "text", at(at(path, "content"), i)
        )
        for i, part in enumerate(expect_list(item.get("content") or [], at(path, "content")))
    ]
    encrypted = optional_str(item, "encrypted_content", path)
    ours = decode_reasoning(encrypted) if encrypted is not None else None
    if ours is not None:
        text = ours
    elif content:
        text = "".join(content)
    else:
        text = "\n\n".join(summary)
    return Reasoning(text, encrypted=encrypted)


def _function_call(item: JsonObject, path: str) -> ToolCall:
    return ToolCall(
        required_str(item, "call_id", path),
        required_str(item, "name", path),
        required_str(item, "arguments", path),
    )


# -- output items ------------------------------------------------------------------------------


def _item_id(prefix: str, response_id: str, index: int) -> str:
    return f"{prefix}_{response_id.removeprefix('resp_')}_{index}"


def _reasoning_item(item_id: str, text: str) -> dict[str, object]:
    summary = [{"type": "summary_text", "text": text}] if text else []
    return {
        "id": item_id,
        "type": "reasoning",
        "summary": summary,
        "encrypted_content": encode_reasoning(text),
    }


def _text_part(text: str) -> dict[str, object]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message_item(item_id: str, texts: list[str], status: str) -> dict[str, object]:
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [_text_part(text) for text in texts],
    }


def _function_call_item(
    item_id: str, call: ToolCall, arguments: str, status: str
) -> dict[str, object]:
    return {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call.id,
        "name": call.name,
        "arguments": arguments,
    }


def _output_items(message: Message, response_id: str) -> list[dict[str, object]]:
    """A reply's output items: one per reasoning block and tool call, one per run of text."""
    items: list[dict[str, object]] = []
    texts: list[str] | None = None
    for block in message.content:
        if isinstance(block, Text):
            if texts is None:
                texts = []
                items.append(
                    _message_item(_item_id("msg", response_id, len(items)), texts, "completed")
                )
            texts.append(block.text)
            items[-1]["content"] = [_text_part(text) for text in texts]
            continue
        texts = None
        item_id_index = len(items)
        if isinstance(block, Reasoning):
            items.append(_reasoning_item(_item_id("rs", response_id, item_id_index), block.text))
        elif isinstance(block, ToolCall):
            item_id = _item_id("fc", response_id, item_id_index)
            items.append(_function_call_item(item_id, block, block.arguments, "completed"))
        else:
            raise ValueError("an assistant reply cannot contain media")
    return items


# -- response objects --------------------------------------------------------------------------


def _usage(usage: Usage) -> dict[str, object]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def _request_echo(request: NeutralRequest | None) -> dict[str, object]:
    """The request settings a Response object repeats back."""
    if request is None:
        return {"tools": [], "tool_choice": "auto", "parallel_tool_calls": True}
    tools = [
        {
            "type": "function",
            "name": tool.name,
            "description": tool.description or None,
            "parameters": json.loads(tool.parameters),
            "strict": False,
        }
        for tool in request.prompt.tools
    ]
    choice: object = request.metadata.get("tool_choice", "auto")
    if choice == "function":
        choice = {"type": "function", "name": request.metadata.get("tool_choice_name", "")}
    return {
        "tools": tools,
        "tool_choice": choice,
        "parallel_tool_calls": request.metadata.get("parallel_tool_calls", "true") == "true",
        "max_output_tokens": request.sampling.max_tokens,
        "temperature": request.sampling.temperature,
        "top_p": request.sampling.top_p,
    }


def _response(
    response_id: str,
    model: str,
    created_at: int,
    status: str,
    output: list[dict[str, object]],
    usage: Usage | None,
    request: NeutralRequest | None,
) -> dict[str, object]:
    body: dict[str, object] = {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "model": model,
        "output": output,
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "metadata": {},
        **_request_echo(request),
        "usage": None if usage is None else _usage(usage),
    }
    if status == "incomplete":
        body["incomplete_details"] = {"reason": "max_output_tokens"}
    return body


def _final_status(stop: StopReason) -> str:
    return "incomplete" if stop is StopReason.MAX_TOKENS else "completed"


def _with_logprobs(
    output: list[dict[str, object]], tokens: Sequence[TokenLogprob]
) -> list[dict[str, object]]:
    """``output`` with every generated token's logprob on the first ``output_text`` part (a
    reply without text has no place for them in this format)."""
    for index, item in enumerate(output):
        content = item.get("content")
        if item["type"] == "message" and isinstance(content, list) and content:
            first = {**content[0], "logprobs": logprob_entries(tokens)}
            changed = {**item, "content": [first, *content[1:]]}
            return [*output[:index], changed, *output[index + 1 :]]
    return output


def response_body(
    reply: ParsedReply,
    usage: Usage,
    stop: StopReason,
    model: str,
    response_id: str,
    *,
    request: NeutralRequest | None = None,
    created_at: int | None = None,
    logprobs: Sequence[TokenLogprob] | None = None,
) -> dict[str, object]:
    """The non-streaming ``response`` object; ``request`` fills the echoed settings (tools...),
    ``logprobs`` are the generated tokens when the client included them."""
    created = int(time.time()) if created_at is None else created_at
    output = _output_items(reply.message, response_id)
    if logprobs is not None:
        output = _with_logprobs(output, logprobs)
    return _response(response_id, model, created, _final_status(stop), output, usage, request)


class StreamEncoder:
    """Turns one reply's events into Responses SSE events, each with a ``sequence_number``.

    Items open on their first event and close (``*.done`` then ``response.output_item.done``)
    when an event of another kind arrives or the reply ends, so every item is announced,
    filled and finished in order, as OpenAI streams them. Token logprobs given to
    :meth:`logprobs` ride on the next text delta; the final response carries all of them, as
    the non-streaming one does.
    """

    def __init__(
        self,
        model: str,
        response_id: str,
        *,
        request: NeutralRequest | None = None,
        created_at: int | None = None,
    ) -> None:
        self._model = model
        self._response_id = response_id
        self._request = request
        self._created_at = int(time.time()) if created_at is None else created_at
        self._sequence = 0
        self._output: list[dict[str, object]] = []
        self._open: str | None = None  # "reasoning" | "message"
        self._text: list[str] = []
        self._started = False
        self._done = False
        self._tokens: list[TokenLogprob] = []
        self._pending: list[TokenLogprob] = []

    def start(self, usage_in: Usage) -> bytes:
        del usage_in  # Responses reports usage only in the final response object.
        self._check_open()
        self._started = True
        response = self._snapshot("in_progress", None)
        return self._emit("response.created", response=response) + self._emit(
            "response.in_progress", response=response
        )

    def event(self, e: ReplyEvent) -> bytes:
        self._check_open()
        if isinstance(e, ToolCallDone):
            return self._close() + self._function_call(e.call)
        if not e.text:
            return b""
        kind = "reasoning" if isinstance(e, ReasoningDelta) else "message"
        out = b"" if self._open == kind else self._close() + self._begin(kind)
        self._text.append(e.text)
        index = len(self._output)
        item_id = self._current_id()
        if isinstance(e, TextDelta):
            pending, self._pending = self._pending, []
            return out + self._emit(
                "response.output_text.delta",
                item_id=item_id,
                output_index=index,
                content_index=0,
                delta=e.text,
                logprobs=logprob_entries(pending),
            )
        return out + self._emit(
            "response.reasoning_summary_text.delta",
            item_id=item_id,
            output_index=index,
            summary_index=0,
            delta=e.text,
        )

    def logprobs(self, tokens: Sequence[TokenLogprob]) -> bytes:
        self._tokens.extend(tokens)
        self._pending.extend(tokens)
        return b""

    def finish(self, stop: StopReason, usage: Usage) -> bytes:
        self._check_open()
        out = self._close()
        self._done = True
        status = _final_status(stop)
        event = "response.incomplete" if status == "incomplete" else "response.completed"
        response = self._snapshot(status, usage)
        if self._request is not None and self._request.sampling.logprobs:
            output = response["output"]
            assert isinstance(output, list)
            response["output"] = _with_logprobs(output, self._tokens)
        return out + self._emit(event, response=response)

    def error(self, kind: ErrorKind, message: str) -> bytes:
        """``response.failed`` with the error code Codex branches on (created first if need be)."""
        out = b"" if self._started or self._done else self.start(Usage(0, 0))
        self._done = True
        response = self._snapshot("failed", None)
        response["error"] = {"code": error_code(kind) or "server_error", "message": message}
        return out + self._emit("response.failed", response=response)

    # -- internals

    def _check_open(self) -> None:
        if self._done:
            raise RuntimeError("the stream has already ended")

    def _snapshot(self, status: str, usage: Usage | None) -> dict[str, object]:
        return _response(
            self._response_id,
            self._model,
            self._created_at,
            status,
            list(self._output),
            usage,
            self._request,
        )

    def _emit(self, event_type: str, **fields: object) -> bytes:
        data = {"type": event_type, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return sse_event(data, event_type)

    def _current_id(self) -> str:
        prefix = "rs" if self._open == "reasoning" else "msg"
        return _item_id(prefix, self._response_id, len(self._output))

    def _begin(self, kind: str) -> bytes:
        self._open = kind
        self._text = []
        index = len(self._output)
        item_id = self._current_id()
        if kind == "reasoning":
            reasoning = {"id": item_id, "type": "reasoning", "summary": []}
            part: dict[str, object] = {"type": "summary_text", "text": ""}
            return self._emit("response.output_item.added", output_index=index, item=reasoning) + (
                self._emit(
                    "response.reasoning_summary_part.added",
                    item_id=item_id,
                    output_index=index,
                    summary_index=0,
                    part=part,
                )
            )
        added = _message_item(item_id, [], "in_progress")
        return self._emit("response.output_item.added", output_index=index, item=added) + (
            self._emit(
                "response.content_part.added",
                item_id=item_id,
                output_index=index,
                content_index=0,
                part=_text_part(""),
            )
        )

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        index = len(self._output)
        item_id = self._current_id()
        text = "".join(self._text)
        item: dict[str, object]
        if self._open == "reasoning":
            item = _reasoning_item(item_id, text)
            part: dict[str, object] = {"type": "summary_text", "text": text}
            out = self._emit(
                "response.reasoning_summary_text.done",
                item_id=item_id,
                output_index=index,
                summary_index=0,
                text=text,
            ) + self._emit(
                "response.reasoning_summary_part.done",
                item_id=item_id,
                output_index=index,
                summary_index=0,
                part=part,
            )
        else:
            item = _message_item(item_id, [text], "completed")
            out = self._emit(
                "response.output_text.done",
                item_id=item_id,
                output_index=index,
                content_index=0,
                text=text,
                logprobs=[],
            ) + self._emit(
                "response.content_part.done",
                item_id=item_id,
                output_index=index,
                content_index=0,
                part=_text_part(text),
            )
        self._open = None
        self._output.append(item)
        return out + self._emit("response.output_item.done", output_index=index, item=item)

    def _function_call(self, call: ToolCall) -> bytes:
        index = len(self._output)
        item_id = _item_id("fc", self._response_id, index)
        added = _function_call_item(item_id, call, "", "in_progress")
        done = _function_call_item(item_id, call, call.arguments, "completed")
        self._output.append(done)
        return (
            self._emit("response.output_item.added", output_index=index, item=added)
            + self._emit(
                "response.function_call_arguments.delta",
                item_id=item_id,
                output_index=index,
                delta=call.arguments,
            )
            + self._emit(
                "response.function_call_arguments.done",
                item_id=item_id,
                output_index=index,
                name=call.name,
                arguments=call.arguments,
            )
            + self._emit("response.output_item.done", output_index=index, item=done)
        )


def error_response(
    kind: ErrorKind, message: str, param: str | None = None
) -> tuple[int, dict[str, object]]:
    """HTTP status and OpenAI error body; context length carries ``context_length_exceeded``."""
    return openai_error(kind, message, param, context_param="input")


# -- the dialect -------------------------------------------------------------------------------


class OpenAIResponsesDialect(Dialect):
    """OpenAI Responses behind the server's uniform :class:`Dialect`; the request rides along
    because a Response object repeats its settings back."""

    name = DIALECT

    def parse_request(self, body: object, memo: ParseMemo | None = None) -> NeutralRequest:
        del memo  # Responses' input items are parsed as one list (a memo for it: not yet)
        return parse_request(body)

    def response_body(
        self,
        request: NeutralRequest,
        reply: ParsedReply,
        usage: Usage,
        stop: StopReason,
        response_id: str,
        logprobs: Logprobs,
    ) -> dict[str, object]:
        return response_body(
            reply, usage, stop, request.model, response_id, request=request, logprobs=logprobs
        )

    def stream_encoder(self, request: NeutralRequest, response_id: str) -> StreamEncoder:
        return StreamEncoder(request.model, response_id, request=request)

    def error_response(
        self, kind: ErrorKind, message: str, param: str | None = None
    ) -> tuple[int, dict[str, object]]:
        return error_response(kind, message, param)

    def new_response_id(self) -> str:
        return "resp_" + secrets.token_hex(12)
