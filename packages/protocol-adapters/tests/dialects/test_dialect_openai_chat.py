"""OpenAI Chat Completions dialect, checked against the official ``openai`` SDK's own models.

Bodies validate as ``ChatCompletion``; streams are decoded by a real SDK client whose HTTP
transport hands back our bytes (httpx2.MockTransport: no server), each chunk validates as
``ChatCompletionChunk``, and ``ChatCompletionStreamState`` accumulates them into the same
completion as the non-streamed body.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx2
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from protocol_adapters._dialects import DIALECTS
from protocol_adapters._dialects.openai_chat import (
    StreamEncoder,
    parse_request,
    response_body,
)
from protocol_adapters._types import (
    AdapterError,
    ErrorKind,
    ParsedReply,
    ReasoningDelta,
    ReplyEvent,
    StopReason,
    TextDelta,
    ToolCallDone,
    Usage,
)
from trajectory_tree import Media, Message, Reasoning, Text, ToolCall, same_message

CREATED = 1_790_000_000

REPLY = Message(
    "assistant",
    (
        Reasoning("The test fails because add subtracts."),
        Text("Fixing `add`."),
        ToolCall("call_1", "exec_command", '{"cmd": "sed -i s/-/+/ mathlib.py"}'),
        ToolCall("call_2", "exec_command", '{"cmd":"pytest -q"}'),
    ),
)


def chat_body() -> dict[str, Any]:
    return {
        "model": "policy",
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_completion_tokens": 4096,
        "temperature": 0.6,
        "top_p": 0.95,
        "stop": "<|end|>",
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "exec_command",
                    "description": "Run a shell command.",
                    "parameters": {
                        "type": "object",
                        "properties": {"cmd": {"type": "string"}},
                        "required": ["cmd"],
                    },
                },
            }
        ],
        "messages": [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Fix the test."},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}},
                ],
            },
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "Run the tests first.",
                "tool_calls": [
                    {
                        "id": "call_0",
                        "type": "function",
                        "function": {"name": "exec_command", "arguments": '{"cmd": "pytest"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_0", "content": "1 failed"},
        ],
    }


def reply_events(message: Message, chunk: int = 5) -> Iterator[ReplyEvent]:
    for block in message.content:
        if isinstance(block, ToolCall):
            yield ToolCallDone(block)
        elif isinstance(block, Reasoning | Text):
            kind = ReasoningDelta if isinstance(block, Reasoning) else TextDelta
            for start in range(0, len(block.text), chunk):
                yield kind(block.text[start : start + chunk])


def encode_stream(
    message: Message, stop: StopReason, usage: Usage, *, include_usage: bool = True
) -> bytes:
    encoder = StreamEncoder("policy", "chatcmpl-1", include_usage=include_usage, created=CREATED)
    out = encoder.start(Usage(usage.prompt_tokens, 0))
    for event in reply_events(message):
        out += encoder.event(event)
    return out + encoder.finish(stop, usage)


def sdk_client(status: int, content: bytes, content_type: str) -> openai.OpenAI:
    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(status, content=content, headers={"content-type": content_type})

    return openai.OpenAI(
        api_key="session-token",
        base_url="http://adapter.test/v1",
        http_client=httpx2.Client(transport=httpx2.MockTransport(handler)),
        max_retries=0,
    )


def data_lines(stream: bytes) -> list[str]:
    frames = [f for f in stream.decode().split("\n\n") if f]
    for frame in frames:
        assert frame.startswith("data: ")
        assert "\n" not in frame
    return [f[len("data: ") :] for f in frames]


# -- parsing -----------------------------------------------------------------------------------


def test_chat_request_normalizes() -> None:
    request = parse_request(chat_body())
    messages = request.prompt.messages
    assert [m.role for m in messages] == ["system", "system", "user", "assistant", "tool"]
    assert messages[2].content == (
        Text("Fix the test."),
        Media("image/png", "data:image/png;base64,iVBO"),
    )
    assert messages[3].content == (
        Reasoning("Run the tests first."),
        ToolCall("call_0", "exec_command", '{"cmd": "pytest"}'),  # arguments kept verbatim
    )
    assert messages[4] == Message("tool", (Text("1 failed"),), tool_call_id="call_0")
    assert request.prompt.tools[0].parameters == (
        '{"type":"object","properties":{"cmd":{"type":"string"}},"required":["cmd"]}'
    )
    sampling = request.sampling
    assert (sampling.max_tokens, sampling.temperature, sampling.top_p) == (4096, 0.6, 0.95)
    assert sampling.stop == ("<|end|>",)
    assert dict(request.metadata) == {
        "tool_choice": "auto",
        "parallel_tool_calls": "true",
        "include_usage": "true",
    }


def test_max_tokens_alias_stop_list_and_ignored_tools() -> None:
    body = chat_body()
    del body["max_completion_tokens"]
    body.update(
        max_tokens=77, stop=["a", "b"], tool_choice={"type": "function", "function": {"name": "x"}}
    )
    body["tools"].append({"type": "custom", "custom": {"name": "apply_patch"}})
    request = parse_request(body)
    assert request.sampling.max_tokens == 77
    assert request.sampling.stop == ("a", "b")
    assert request.metadata["tool_choice_name"] == "x"
    assert request.metadata["ignored_tools"] == "custom"


def _mutated(path: list[Any], value: Any) -> dict[str, Any]:
    body = chat_body()
    target: Any = body
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return body


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (["model"], KeyError, "model: field required"),
        (["messages"], [], "messages: must contain at least one message"),
        (["messages", 0, "role"], "function", "messages.0.role: unknown role 'function'"),
        (["messages", 0, "content"], 5, "messages.0.content: expected an array, got number"),
        (
            ["messages", 2, "content", 1, "type"],
            "input_audio",
            "messages.2.content.1.type: unsupported content part type 'input_audio' here",
        ),
        (
            ["messages", 1, "content", 0],
            {"type": "image_url", "image_url": {"url": "x"}},
            "messages.1.content.0.type: unsupported content part type 'image_url' here",
        ),
        (
            ["messages", 2, "content", 1, "image_url"],
            {},
            "messages.2.content.1.image_url.url: field required",
        ),
        (
            ["messages", 3, "tool_calls", 0, "function", "arguments"],
            {"cmd": "pytest"},
            "messages.3.tool_calls.0.function.arguments: expected a string, got object",
        ),
        (
            ["messages", 3, "tool_calls", 0, "id"],
            KeyError,
            "messages.3.tool_calls.0.id: field required",
        ),
        (
            ["messages", 3, "tool_calls", 0, "type"],
            "custom",
            "messages.3.tool_calls.0.type: unsupported",
        ),
        (["messages", 3, "function_call"], {"name": "f"}, "messages.3.function_call: legacy"),
        (["messages", 4, "tool_call_id"], KeyError, "messages.4.tool_call_id: field required"),
        (["tools", 0, "function", "name"], KeyError, "tools.0.function.name: field required"),
        (["tools", 0, "type"], KeyError, "tools.0.type: field required"),
        (["tool_choice"], "sometimes", "tool_choice: unknown tool_choice 'sometimes'"),
        (["stop"], [1], "stop.0: expected a string, got number"),
        (["n"], 2, "n: only one choice per request is supported, got 2"),
        (
            ["stream_options"],
            {"include_usage": "yes"},
            "stream_options.include_usage: expected a boolean",
        ),
        (["max_completion_tokens"], -1, "max_completion_tokens: must be >= 1, got -1"),
        (["functions"], [], "functions: not supported"),
    ],
)
def test_invalid_requests_name_the_path(path: list[Any], value: Any, message: str) -> None:
    with pytest.raises(AdapterError) as caught:
        parse_request(_mutated(path, value))
    assert caught.value.kind is ErrorKind.INVALID_REQUEST
    assert caught.value.message.startswith(message), caught.value.message


# -- responses ---------------------------------------------------------------------------------


def test_response_body_is_an_sdk_completion() -> None:
    body = response_body(
        ParsedReply(REPLY),
        Usage(300, 40),
        StopReason.TOOL_USE,
        "policy",
        "chatcmpl-1",
        created=CREATED,
    )
    completion = ChatCompletion.model_validate(body)
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Fixing `add`."
    assert [
        c.function.arguments for c in choice.message.tool_calls or [] if c.type == "function"
    ] == [
        '{"cmd": "sed -i s/-/+/ mathlib.py"}',
        '{"cmd":"pytest -q"}',
    ]
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.total_tokens) == (300, 340)
    assert choice.message.model_extra == {
        "reasoning_content": "The test fails because add subtracts."
    }


@pytest.mark.parametrize(
    ("stop", "finish"),
    [
        (StopReason.END_TURN, "stop"),
        (StopReason.TOOL_USE, "tool_calls"),
        (StopReason.MAX_TOKENS, "length"),
    ],
)
def test_finish_reasons(stop: StopReason, finish: str) -> None:
    body = response_body(ParsedReply(REPLY), Usage(1, 1), stop, "m", "c", created=CREATED)
    assert ChatCompletion.model_validate(body).choices[0].finish_reason == finish


def test_round_trip_through_the_client_echo() -> None:
    body = response_body(
        ParsedReply(REPLY), Usage(1, 1), StopReason.TOOL_USE, "m", "c", created=CREATED
    )
    completion = ChatCompletion.model_validate(body)
    echo = completion.choices[0].message.model_dump(exclude_none=True)
    request = chat_body()
    request["messages"] += [echo, {"role": "tool", "tool_call_id": "call_1", "content": "ok"}]
    assert same_message(REPLY, parse_request(request).prompt.messages[-2])
    echo.pop("reasoning_content")  # most chat clients drop it: still the same message
    request["messages"][-2] = echo
    assert same_message(REPLY, parse_request(request).prompt.messages[-2])


# -- streaming ---------------------------------------------------------------------------------


def test_stream_chunks_validate_and_accumulate_to_the_body() -> None:
    usage = Usage(300, 40)
    stream = encode_stream(REPLY, StopReason.TOOL_USE, usage)
    lines = data_lines(stream)
    assert lines[-1] == "[DONE]"
    chunks = [ChatCompletionChunk.model_validate(json.loads(line)) for line in lines[:-1]]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 40
    assert chunks[-2].choices[0].finish_reason == "tool_calls"

    client = sdk_client(200, stream, "text/event-stream")
    with client.chat.completions.stream(
        model="policy", messages=[{"role": "user", "content": "x"}]
    ) as s:
        final = s.get_final_completion()
    expected = ChatCompletion.model_validate(
        response_body(
            ParsedReply(REPLY), usage, StopReason.TOOL_USE, "policy", "chatcmpl-1", created=CREATED
        )
    )
    got_message = final.choices[0].message
    want_message = expected.choices[0].message
    assert got_message.content == want_message.content
    assert got_message.tool_calls is not None
    assert [(c.id, c.function.name, c.function.arguments) for c in got_message.tool_calls] == [
        (c.id, c.function.name, c.function.arguments)
        for c in want_message.tool_calls or []
        if c.type == "function"
    ]
    assert (got_message.model_extra or {}).get("reasoning_content") == (
        want_message.model_extra or {}
    ).get("reasoning_content")
    assert final.usage == expected.usage
    assert final.choices[0].finish_reason == "tool_calls"


def test_reasoning_content_streams_as_deltas() -> None:
    stream = encode_stream(REPLY, StopReason.TOOL_USE, Usage(1, 1), include_usage=False)
    chunks = [
        ChatCompletionChunk.model_validate(json.loads(line)) for line in data_lines(stream)[:-1]
    ]
    reasoning = "".join(
        (c.choices[0].delta.model_extra or {}).get("reasoning_content", "")
        for c in chunks
        if c.choices
    )
    assert reasoning == "The test fails because add subtracts."
    assert all("usage" not in json.loads(line) for line in data_lines(stream)[:-1])


def test_mid_stream_error_is_raised_by_the_sdk() -> None:
    encoder = StreamEncoder("m", "chatcmpl-2", created=CREATED)
    stream = encoder.start(Usage(1, 0)) + encoder.event(TextDelta("par"))
    stream += encoder.error(ErrorKind.ENGINE_ERROR, "engine went away")
    client = sdk_client(200, stream, "text/event-stream")
    with pytest.raises(openai.APIError, match="engine went away"):
        for _ in client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], stream=True
        ):
            pass


# -- the registry ------------------------------------------------------------------------------


def test_registry_reads_include_usage_from_the_request() -> None:
    dialect = DIALECTS["openai_chat"]
    request = dialect.parse_request(chat_body())
    encoder = dialect.stream_encoder(request, "chatcmpl-3")
    encoder.start(Usage(1, 0))
    assert b'"usage":{"prompt_tokens":1' in encoder.finish(StopReason.END_TURN, Usage(1, 2))


# -- properties --------------------------------------------------------------------------------

_text = st.text(min_size=1, max_size=30)
_args = st.dictionaries(
    st.text(min_size=1, max_size=6), st.integers() | st.text(max_size=8), max_size=3
)


@st.composite
def replies(draw: st.DrawFn) -> Message:
    """Replies in the block order Chat Completions can express: reasoning, text, calls."""
    blocks: list[Reasoning | Text | ToolCall] = []
    if draw(st.booleans()):
        blocks.append(Reasoning(draw(_text)))
    if draw(st.booleans()):
        blocks.append(Text(draw(_text)))
    calls = draw(st.lists(_args, max_size=3))
    blocks.extend(
        ToolCall(f"call_{i}", "exec_command", json.dumps(args)) for i, args in enumerate(calls)
    )
    return Message("assistant", tuple(blocks) or (Text(draw(_text)),))


@settings(max_examples=60, deadline=None)
@given(replies())
def test_any_reply_round_trips_and_streams_like_the_body(reply: Message) -> None:
    stop = StopReason.TOOL_USE if reply.tool_calls else StopReason.END_TURN
    usage = Usage(10, 5)
    body = response_body(ParsedReply(reply), usage, stop, "policy", "chatcmpl-1", created=CREATED)
    expected = ChatCompletion.model_validate(body)
    echo = expected.choices[0].message.model_dump(exclude_none=True)
    parsed = parse_request({"model": "m", "messages": [echo]}).prompt.messages[0]
    assert same_message(reply, parsed)

    state: ChatCompletionStreamState[None] = ChatCompletionStreamState()
    for line in data_lines(encode_stream(reply, stop, usage))[:-1]:
        state.handle_chunk(ChatCompletionChunk.model_validate(json.loads(line)))
    final = state.get_final_completion()
    got, want = final.choices[0].message, expected.choices[0].message
    assert got.content == want.content
    assert [(c.id, c.function.name, c.function.arguments) for c in got.tool_calls or []] == [
        (c.id, c.function.name, c.function.arguments)
        for c in want.tool_calls or []
        if c.type == "function"
    ]
    assert final.choices[0].finish_reason == expected.choices[0].finish_reason
    assert final.usage == expected.usage
