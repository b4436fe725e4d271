"""Anthropic Messages dialect, checked against the official ``anthropic`` SDK's own models.

Bodies are validated with ``anthropic.types.Message``; streams are decoded and accumulated by a
real SDK client whose HTTP transport hands back our bytes (httpx2.MockTransport: no server, the
SDK's real SSE decoder and accumulator), and each event is validated against
``RawMessageStreamEvent``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message as SdkMessage
from anthropic.types import RawMessageStreamEvent
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from protocol_adapters._dialects import DIALECTS
from protocol_adapters._dialects.anthropic import (
    RAW_ARGUMENTS_KEY,
    StreamEncoder,
    parse_request,
    response_body,
)
from protocol_adapters._dialects.opaque import thinking_signature
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

FIXTURE = Path(__file__).parent.parent / "fixtures" / "requests" / "claude_code_turn.json"
EVENTS = TypeAdapter(RawMessageStreamEvent)


def claude_code_body() -> dict[str, Any]:
    body: dict[str, Any] = json.loads(FIXTURE.read_text())
    return body


def reply_events(message: Message, chunk: int = 4) -> Iterator[ReplyEvent]:
    """The events a parser would emit for ``message``: text in small pieces, calls whole."""
    for block in message.content:
        if isinstance(block, ToolCall):
            yield ToolCallDone(block)
        elif isinstance(block, Reasoning | Text):
            kind = ReasoningDelta if isinstance(block, Reasoning) else TextDelta
            for start in range(0, len(block.text), chunk):
                yield kind(block.text[start : start + chunk])


def encode_stream(message: Message, stop: StopReason, usage: Usage, rid: str) -> bytes:
    encoder = StreamEncoder("policy", rid)
    out = encoder.start(Usage(usage.prompt_tokens, 0))
    for event in reply_events(message):
        out += encoder.event(event)
    return out + encoder.finish(stop, usage)


def sdk_client(status: int, content: bytes, content_type: str) -> anthropic.Anthropic:
    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(status, content=content, headers={"content-type": content_type})

    transport = httpx2.MockTransport(handler)
    return anthropic.Anthropic(
        api_key="session-token",
        base_url="http://adapter.test",
        http_client=httpx2.Client(transport=transport),
        max_retries=0,
    )


def sse_payloads(stream: bytes) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for frame in stream.decode().split("\n\n"):
        if not frame:
            continue
        name, data = frame.split("\n")
        assert name.startswith("event: ")
        assert data.startswith("data: ")
        payload = json.loads(data[len("data: ") :])
        assert payload["type"] == name[len("event: ") :]
        events.append((name[len("event: ") :], payload))
    return events


def schema_order_echo(body: dict[str, Any], key_order: dict[str, list[str]]) -> list[Any]:
    """What Claude Code sends back: the blocks, tool inputs re-serialized in schema key order."""
    echoed = []
    for original in body["content"]:
        block = copy.deepcopy(original)
        if block["type"] == "tool_use":
            order = key_order.get(block["name"], [])
            ordered = sorted(block["input"], key=lambda k: order.index(k) if k in order else 99)
            block["input"] = json.loads(
                json.dumps({k: block["input"][k] for k in ordered}, separators=(",", ":"))
            )
        echoed.append(block)
    return echoed


REPLY = Message(
    "assistant",
    (
        Reasoning("The bug is in add: it subtracts. Fix it, then rerun the tests."),
        Text("`add` subtracts instead of adding; fixing it."),
        ToolCall(
            "toolu_02X",
            "Bash",
            '{"description": "Fix add", "command": "sed -i \'s/a - b/a + b/\' mathlib.py"}',
        ),
        ToolCall("toolu_02Y", "Read", '{ "file_path" : "/repo/mathlib.py", "limit": 20 }'),
    ),
)


# -- parsing -----------------------------------------------------------------------------------


def test_claude_code_request_normalizes() -> None:
    request = parse_request(claude_code_body())
    messages = request.prompt.messages
    assert request.dialect == "anthropic"
    assert request.model == "policy"
    assert request.stream
    assert [m.role for m in messages] == [
        "system",
        "user",
        "system",
        "assistant",
        "tool",
        "tool",
        "user",
    ]
    assert messages[0].content == (
        Text("You are Claude Code, Anthropic's official CLI for Claude."),
        Text(
            "You are an interactive CLI tool that helps users with software engineering tasks."
            "\n\n# Tone and style\nBe concise."
        ),
    )
    assert messages[2].plain_text.startswith("<env>")
    assistant = messages[3]
    thinking = assistant.content[0]
    assert isinstance(thinking, Reasoning)
    assert thinking.signature == "c2lnbmF0dXJlLWZyb20tYS1wcmV2aW91cy10dXJu"
    assert assistant.tool_calls == (
        ToolCall(
            "toolu_01A",
            "Bash",
            '{"command":"python -m pytest -q tests/test_math.py",'
            '"description":"Run the failing tests"}',
        ),
        ToolCall("toolu_01B", "Read", '{"file_path":"/repo/mathlib.py"}'),
    )
    # parallel results stay in completion order; the reminder text follows as a user message
    assert [m.tool_call_id for m in messages[4:6]] == ["toolu_01B", "toolu_01A"]
    assert messages[4].content == (Text("     1\tdef add(a, b):\n     2\t    return a - b\n"),)
    assert messages[5].is_error
    assert not messages[4].is_error
    assert messages[6].plain_text.startswith("<system-reminder>The TodoWrite")
    assert [t.name for t in request.prompt.tools] == ["Bash", "Read"]
    # The schema reaches the template as the client sent it: its own key order, compact.
    sent_schema = claude_code_body()["tools"][0]["input_schema"]
    assert request.prompt.tools[0].parameters == json.dumps(
        sent_schema, separators=(",", ":"), ensure_ascii=False
    )
    assert list(json.loads(request.prompt.tools[0].parameters)) == list(sent_schema)
    assert request.sampling.max_tokens == 128000
    assert dict(request.metadata) == {
        "thinking": "adaptive",
        "user_id": "user_0f3a_account__session_7c1e2b",
        "effort": "high",
        "ignored_fields": "context_management",  # output_config is read (effort, format)
    }
    assert request.sampling.json_schema is None


def test_sampling_tool_choice_and_thinking_budget() -> None:
    body = claude_code_body()
    body.update(
        temperature=0.7,
        top_p=0.95,
        top_k=20,
        stop_sequences=["</done>"],
        tool_choice={"type": "tool", "name": "Bash", "disable_parallel_tool_use": True},
        thinking={"type": "enabled", "budget_tokens": 4096},
    )
    body["tools"].append({"type": "web_search_20250305", "name": "web_search", "max_uses": 3})
    request = parse_request(body)
    sampling = request.sampling
    assert (sampling.temperature, sampling.top_p, sampling.top_k) == (0.7, 0.95, 20)
    assert sampling.stop == ("</done>",)
    assert request.metadata["tool_choice"] == "tool"
    assert request.metadata["tool_choice_name"] == "Bash"
    assert request.metadata["parallel_tool_calls"] == "false"
    assert request.metadata["thinking"] == "enabled"
    assert request.metadata["thinking_budget"] == "4096"
    assert request.metadata["ignored_tools"] == "web_search_20250305:web_search"
    assert [t.name for t in request.prompt.tools] == ["Bash", "Read"]


def test_images_redacted_thinking_and_string_content() -> None:
    body = {
        "model": "m",
        "messages": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0K"},
                    },
                    {"type": "image", "source": {"type": "url", "url": "https://x.test/a.png"}},
                ],
            },
            {
                "role": "assistant",
                "content": [{"type": "redacted_thinking", "data": "EncryptedBlob=="}],
            },
            {"role": "user", "content": "plain"},
        ],
    }
    messages = parse_request(body).prompt.messages
    assert messages[0].content == (
        Media("image/png", "data:image/png;base64,iVBORw0K"),
        Media("image", "https://x.test/a.png"),
    )
    redacted = messages[1].content[0]
    assert isinstance(redacted, Reasoning)
    assert (redacted.text, redacted.encrypted) == ("", "EncryptedBlob==")
    assert messages[2] == Message.text("user", "plain")
    assert parse_request(body).sampling.max_tokens is None  # count_tokens bodies have none


def _mutated(path: list[Any], value: Any) -> dict[str, Any]:
    body = claude_code_body()
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
        (["model"], 3, "model: expected a string, got number"),
        (["messages"], {}, "messages: expected an array, got object"),
        (["messages"], [], "messages: must contain at least one message"),
        (["messages", 0, "role"], "tool", "messages.0.role: unknown role 'tool'"),
        (["messages", 0, "content"], KeyError, "messages.0.content: field required"),
        (
            ["messages", 0, "content", 1, "type"],
            "foo",
            "messages.0.content.1.type: unknown block type 'foo' in a user message",
        ),
        (
            ["messages", 0, "content", 1, "text"],
            None,
            "messages.0.content.1.text: expected a string",
        ),
        (
            ["messages", 2, "content", 0, "type"],
            "image",
            "messages.2.content.0.type: unknown block type 'image' in an assistant message",
        ),
        (
            ["messages", 2, "content", 2, "input"],
            "ls",
            "messages.2.content.2.input: expected an object, got string",
        ),
        (["messages", 2, "content", 3, "id"], KeyError, "messages.2.content.3.id: field required"),
        (
            ["messages", 3, "content", 0, "tool_use_id"],
            KeyError,
            "messages.3.content.0.tool_use_id: field required",
        ),
        (
            ["messages", 3, "content", 1, "content", 0, "type"],
            "tool_use",
            "messages.3.content.1.content.0.type: unknown block type 'tool_use' in a tool_result",
        ),
        (
            ["messages", 3, "content", 1, "is_error"],
            "yes",
            "messages.3.content.1.is_error: expected a boolean",
        ),
        (
            ["messages", 1, "content"],
            [{"type": "image"}],
            "messages.1.content.0.type: expected 'text' here",
        ),
        (["system"], [{"type": "text"}], "system.0.text: field required"),
        (["max_tokens"], 0, "max_tokens: must be >= 1, got 0"),
        (["max_tokens"], True, "max_tokens: expected an integer, got boolean"),
        (["temperature"], "hot", "temperature: expected a finite number, got string"),
        (["stop_sequences"], ["a", 1], "stop_sequences.1: expected a string, got number"),
        (["stream"], "yes", "stream: expected a boolean, got string"),
        (["tools", 0, "input_schema"], KeyError, "tools.0.input_schema: field required"),
        (["tools", 1, "name"], KeyError, "tools.1.name: field required"),
        (["tool_choice"], {"type": "maybe"}, "tool_choice.type: unknown tool_choice type 'maybe'"),
        (["tool_choice"], {"type": "tool"}, "tool_choice.name: field required"),
        (["thinking"], {"type": "on"}, "thinking.type: unknown thinking type 'on'"),
        (["thinking"], {"type": "enabled"}, "thinking.budget_tokens: field required"),
        (["metadata"], {"user_id": 7}, "metadata.user_id: expected a string, got number"),
        (
            ["messages", 0, "content", 0],
            {"type": "image", "source": {"type": "file", "file_id": "f"}},
            "messages.0.content.0.source.type: unsupported image source type 'file'",
        ),
    ],
)
def test_invalid_requests_name_the_path(path: list[Any], value: Any, message: str) -> None:
    with pytest.raises(AdapterError) as caught:
        parse_request(_mutated(path, value))
    assert caught.value.kind is ErrorKind.INVALID_REQUEST
    assert caught.value.message.startswith(message), caught.value.message


def test_body_must_be_an_object() -> None:
    with pytest.raises(AdapterError, match="body: expected an object, got array"):
        parse_request([])


# -- responses ---------------------------------------------------------------------------------


def test_response_body_is_an_sdk_message() -> None:
    usage = Usage(prompt_tokens=5123, completion_tokens=87)
    body = response_body(ParsedReply(REPLY), usage, StopReason.TOOL_USE, "policy", "msg_1")
    message = SdkMessage.model_validate(body)
    assert [b.type for b in message.content] == ["thinking", "text", "tool_use", "tool_use"]
    thinking = message.content[0]
    assert thinking.type == "thinking"
    assert thinking.signature == thinking_signature(thinking.thinking)
    tool = message.content[2]
    assert tool.type == "tool_use"
    assert tool.input == {"description": "Fix add", "command": "sed -i 's/a - b/a + b/' mathlib.py"}
    assert message.stop_reason == "tool_use"
    assert (message.usage.input_tokens, message.usage.output_tokens) == (5123, 87)
    assert message.usage.cache_read_input_tokens == 0


@pytest.mark.parametrize("arguments", ['{"a": ', "[1, 2]", '"text"', '{"x": NaN}'])
def test_non_object_arguments_travel_raw_and_come_back(arguments: str) -> None:
    reply = Message("assistant", (ToolCall("toolu_9", "Bash", arguments),))
    body = response_body(ParsedReply(reply), Usage(1, 1), StopReason.TOOL_USE, "m", "msg_2")
    SdkMessage.model_validate(body)
    content: list[Any] = body["content"]  # type: ignore[assignment]
    assert content[0]["input"] == {RAW_ARGUMENTS_KEY: arguments}
    echoed = parse_request({"model": "m", "messages": [{"role": "assistant", "content": content}]})
    assert echoed.prompt.messages[0] == reply


def test_round_trip_through_claude_code_echo() -> None:
    """Our reply -> body -> Claude Code's echo (schema key order, compact) -> same message."""
    usage = Usage(900, 120)
    body = response_body(ParsedReply(REPLY), usage, StopReason.TOOL_USE, "policy", "msg_3")
    request = claude_code_body()
    request["messages"].append(
        {
            "role": "assistant",
            "content": schema_order_echo(
                body, {"Bash": ["command", "timeout", "description"], "Read": ["file_path"]}
            ),
        }
    )
    request["messages"].append(
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_02Y", "content": "1\tdef add"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_02X",
                    "content": "",
                    "cache_control": {"type": "ephemeral"},
                },
            ],
        }
    )
    messages = parse_request(request).prompt.messages
    echoed = messages[-3]
    assert echoed.role == "assistant"
    assert same_message(REPLY, echoed)
    assert [m.tool_call_id for m in messages[-2:]] == ["toolu_02Y", "toolu_02X"]


# -- streaming ---------------------------------------------------------------------------------


def test_stream_grammar_and_sdk_accumulation_equal_the_body() -> None:
    usage = Usage(5123, 87)
    stream = encode_stream(REPLY, StopReason.TOOL_USE, usage, "msg_4")
    events = sse_payloads(stream)
    names = [name for name, _ in events]
    assert names[:2] == ["message_start", "ping"]
    assert names[-2:] == ["message_delta", "message_stop"]
    for name, payload in events:
        if name != "ping":
            EVENTS.validate_python(payload)
    start = events[0][1]
    assert start["message"]["usage"]["input_tokens"] == 5123
    deltas = [p["delta"]["type"] for n, p in events if n == "content_block_delta"]
    assert "signature_delta" in deltas
    assert "input_json_delta" in deltas

    client = sdk_client(200, stream, "text/event-stream")
    with client.messages.stream(
        model="policy", max_tokens=100, messages=[{"role": "user", "content": "x"}]
    ) as sdk_stream:
        final = sdk_stream.get_final_message()
    expected = SdkMessage.model_validate(
        response_body(ParsedReply(REPLY), usage, StopReason.TOOL_USE, "policy", "msg_4")
    )
    assert final.model_dump(exclude_none=True, exclude={"content"}) == expected.model_dump(
        exclude_none=True, exclude={"content"}
    )
    got = [b.model_dump(exclude_none=True, exclude={"parsed_output"}) for b in final.content]
    assert got == [b.model_dump(exclude_none=True) for b in expected.content]


def test_stream_of_text_only_reply_ends_turn() -> None:
    reply = Message("assistant", (Text("All tests pass now."),))
    stream = encode_stream(reply, StopReason.END_TURN, Usage(10, 5), "msg_5")
    client = sdk_client(200, stream, "text/event-stream")
    with client.messages.stream(
        model="policy", max_tokens=100, messages=[{"role": "user", "content": "x"}]
    ) as sdk_stream:
        assert sdk_stream.get_final_text() == "All tests pass now."
        assert sdk_stream.get_final_message().stop_reason == "end_turn"


def test_events_after_finish_are_refused() -> None:
    encoder = StreamEncoder("m", "msg_6")
    encoder.start(Usage(1, 0))
    encoder.finish(StopReason.END_TURN, Usage(1, 1))
    with pytest.raises(RuntimeError, match="already ended"):
        encoder.event(TextDelta("late"))


def test_mid_stream_error_is_raised_by_the_sdk() -> None:
    encoder = StreamEncoder("m", "msg_7")
    stream = encoder.start(Usage(3, 0)) + encoder.event(TextDelta("partial"))
    stream += encoder.error(ErrorKind.OVERLOADED, "engine overloaded")
    client = sdk_client(200, stream, "text/event-stream")
    with (
        pytest.raises(anthropic.APIStatusError) as caught,
        client.messages.stream(
            model="m", max_tokens=10, messages=[{"role": "user", "content": "x"}]
        ) as sdk_stream,
    ):
        sdk_stream.get_final_message()
    body: Any = caught.value.body
    assert body["error"] == {"type": "overloaded_error", "message": "engine overloaded"}


# -- the registry ------------------------------------------------------------------------------


def test_registry_wraps_the_module() -> None:
    dialect = DIALECTS["anthropic"]
    request = dialect.parse_request(claude_code_body())
    body = dialect.response_body(
        request, ParsedReply(REPLY), Usage(1, 2), StopReason.TOOL_USE, "m1", None
    )
    assert body["model"] == "policy"
    assert dialect.new_response_id().startswith("msg_")
    encoder = dialect.stream_encoder(request, "m2")
    assert encoder.start(Usage(1, 0)).startswith(b"event: message_start\n")


# -- properties --------------------------------------------------------------------------------

_json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**6), 10**6), st.text(max_size=12)
)
_arguments = st.dictionaries(st.text(min_size=1, max_size=8), _json_scalars, max_size=4)
_text = st.text(min_size=1, max_size=40)


@st.composite
def replies(draw: st.DrawFn) -> Message:
    blocks: list[Reasoning | Text | ToolCall] = []
    if draw(st.booleans()):
        blocks.append(Reasoning(draw(_text)))
    if draw(st.booleans()):
        blocks.append(Text(draw(_text)))
    for i in range(draw(st.integers(0, 3))):
        args = draw(_arguments)
        spaced = json.dumps(args, indent=draw(st.sampled_from([None, 1])))
        blocks.append(ToolCall(f"toolu_{i}", draw(st.sampled_from(["Bash", "Read"])), spaced))
    if not blocks:
        blocks.append(Text(draw(_text)))
    return Message("assistant", tuple(blocks))


@settings(max_examples=60, deadline=None)
@given(replies())
def test_any_reply_round_trips_and_streams_like_the_body(reply: Message) -> None:
    usage = Usage(100, 20)
    stop = StopReason.TOOL_USE if reply.tool_calls else StopReason.END_TURN
    body = response_body(ParsedReply(reply), usage, stop, "m", "msg_p")
    SdkMessage.model_validate(body)
    content: list[Any] = body["content"]  # type: ignore[assignment]
    echo = json.loads(json.dumps(content, sort_keys=True))
    request = parse_request({"model": "m", "messages": [{"role": "assistant", "content": echo}]})
    assert same_message(reply, request.prompt.messages[0])

    snapshot = None
    json_bufs: dict[int, bytes] = {}
    for name, payload in sse_payloads(encode_stream(reply, stop, usage, "msg_p")):
        if name == "ping":
            continue
        event = EVENTS.validate_python(payload)
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=json_bufs)
    assert snapshot is not None
    streamed = [
        b.model_dump(exclude_none=True, exclude={"parsed_output"}) for b in snapshot.content
    ]
    assert streamed == SdkMessage.model_validate(body).model_dump(exclude_none=True)["content"]
