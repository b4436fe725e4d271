"""OpenAI Responses dialect (what Codex speaks), checked against the official ``openai`` SDK.

Bodies validate as ``Response``; every streamed event validates against the SDK's
``ResponseStreamEvent`` union; a real SDK client whose HTTP transport hands back our bytes
(httpx2.MockTransport: no server) runs its ``ResponseStreamState`` over them, and the final
response equals the non-streamed body.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from protocol_adapters._dialects import DIALECTS
from protocol_adapters._dialects.opaque import decode_reasoning, encode_reasoning
from protocol_adapters._dialects.openai_responses import (
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
from trajectory_tree import Message, Reasoning, Text, ToolCall, same_message

FIXTURE = Path(__file__).parent.parent / "fixtures" / "requests" / "codex_turn.json"
EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
CREATED = 1_790_000_000

REPLY = Message(
    "assistant",
    (
        Reasoning("**Fixing add**\n\nThe function subtracts; replace `-` with `+`."),
        Text("Found it: `add` subtracts."),
        ToolCall("call_B1", "exec_command", '{"cmd":"sed -i s/a - b/a + b/ mathlib.py"}'),
        ToolCall("call_B2", "exec_command", '{"cmd": "python -m pytest -q", "workdir": "/repo"}'),
    ),
)


def codex_body() -> dict[str, Any]:
    body: dict[str, Any] = json.loads(FIXTURE.read_text())
    return body


def reply_events(message: Message, chunk: int = 6) -> Iterator[ReplyEvent]:
    for block in message.content:
        if isinstance(block, ToolCall):
            yield ToolCallDone(block)
        elif isinstance(block, Reasoning | Text):
            kind = ReasoningDelta if isinstance(block, Reasoning) else TextDelta
            for start in range(0, len(block.text), chunk):
                yield kind(block.text[start : start + chunk])


def encode_stream(message: Message, stop: StopReason, usage: Usage, rid: str = "resp_1") -> bytes:
    encoder = StreamEncoder("policy", rid, created_at=CREATED)
    out = encoder.start(Usage(usage.prompt_tokens, 0))
    for event in reply_events(message):
        out += encoder.event(event)
    return out + encoder.finish(stop, usage)


def sse_payloads(stream: bytes) -> list[dict[str, Any]]:
    payloads = []
    for frame in stream.decode().split("\n\n"):
        if not frame:
            continue
        name, data = frame.split("\n")
        payload: dict[str, Any] = json.loads(data.removeprefix("data: "))
        assert name == f"event: {payload['type']}"
        payloads.append(payload)
    return payloads


def sdk_client(status: int, content: bytes, content_type: str) -> openai.OpenAI:
    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(status, content=content, headers={"content-type": content_type})

    return openai.OpenAI(
        api_key="session-token",
        base_url="http://adapter.test/v1",
        http_client=httpx2.Client(transport=httpx2.MockTransport(handler)),
        max_retries=0,
    )


def codex_echo(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Codex's next-request copy of our output items: keys reordered, statuses dropped."""
    echoed = []
    for item in copy.deepcopy(output):
        item.pop("status", None)
        if item["type"] == "message":
            item["content"] = [{"text": p["text"], "type": p["type"]} for p in item["content"]]
        echoed.append(dict(reversed(list(item.items()))))
    return echoed


# -- parsing -----------------------------------------------------------------------------------


def test_codex_request_normalizes() -> None:
    request = parse_request(codex_body())
    messages = request.prompt.messages
    assert [m.role for m in messages] == [
        "system",
        "system",
        "user",
        "user",
        "assistant",
        "tool",
        "tool",
    ]
    turn = messages[4]
    reasoning = turn.content[0]
    assert isinstance(reasoning, Reasoning)
    assert reasoning.text == "**Running the tests**\n\nI should run the failing test first."
    assert reasoning.encrypted == "gAAAAABo-opaque-provider-token"
    assert turn.tool_calls == (
        ToolCall(
            "call_A1",
            "exec_command",
            '{"cmd":"python -m pytest -q tests/test_math.py","workdir":"/repo"}',
        ),
        ToolCall("call_A2", "exec_command", '{"cmd":"cat mathlib.py"}'),
    )
    assert [m.tool_call_id for m in messages[5:]] == ["call_A1", "call_A2"]
    assert messages[5].plain_text.startswith("Process exited with code 1\n")
    assert [t.name for t in request.prompt.tools] == ["exec_command"]
    assert dict(request.metadata) == {
        "tool_choice": "auto",
        "parallel_tool_calls": "true",
        "reasoning_summary": "auto",
        "store": "false",
        "include": "reasoning.encrypted_content",
        "prompt_cache_key": "0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b",
        "ignored_tools": "web_search",
    }
    assert request.stream


def test_instructions_string_input_and_sampling() -> None:
    request = parse_request(
        {
            "model": "m",
            "instructions": "Be careful.",
            "input": "hello",
            "max_output_tokens": 512,
            "temperature": 1,
            "top_p": 0.9,
            "reasoning": {"effort": "high"},
            "tool_choice": {"type": "function", "name": "exec_command"},
        }
    )
    assert request.prompt.messages == (
        Message.text("system", "Be careful."),
        Message.text("user", "hello"),
    )
    assert (request.sampling.max_tokens, request.sampling.temperature) == (512, 1.0)
    assert request.metadata["reasoning_effort"] == "high"
    assert request.metadata["tool_choice_name"] == "exec_command"


def test_assistant_text_reasoning_and_calls_of_one_turn_form_one_message() -> None:
    body = {
        "model": "m",
        "input": [
            {"role": "user", "content": "go"},
            {
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": "r"}],
            },
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "a"}],
            },
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {
                "type": "function_call_output",
                "call_id": "c1",
                "output": [{"type": "input_text", "text": "o"}],
            },
            {"type": "message", "role": "assistant", "content": "done"},
            {
                "role": "user",
                "content": [{"type": "input_image", "image_url": "data:image/jpeg;base64,AA"}],
            },
        ],
    }
    messages = parse_request(body).prompt.messages
    assert [m.role for m in messages] == ["user", "assistant", "tool", "assistant", "user"]
    assert messages[1].content == (Reasoning("r"), Text("a"), ToolCall("c1", "f", "{}"))
    assert messages[2].content == (Text("o"),)
    assert messages[3].content == (Text("done"),)


def _mutated(path: list[Any], value: Any) -> dict[str, Any]:
    body = codex_body()
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
        (["input"], KeyError, "input: field required"),
        (["input"], 3, "input: expected an array, got number"),
        (["input"], [], "input: must contain at least one item"),
        (["input", 0, "role"], "tool", "input.0.role: unknown role 'tool'"),
        (
            ["input", 0, "type"],
            "web_search_call",
            "input.0.type: unsupported input item type 'web_search_call'",
        ),
        (
            ["input", 0, "content", 0, "type"],
            "input_file",
            "input.0.content.0.type: unsupported content part type 'input_file' here",
        ),
        (
            ["input", 3, "content", 0],
            {"type": "input_image"},
            "input.3.content.0.image_url: field required",
        ),
        (["input", 4, "summary"], KeyError, "input.4.summary: field required"),
        (
            ["input", 4, "summary", 0],
            {"type": "summary_text"},
            "input.4.summary.0.text: field required",
        ),
        (["input", 4, "encrypted_content"], 1, "input.4.encrypted_content: expected a string"),
        (
            ["input", 5, "arguments"],
            {"cmd": "ls"},
            "input.5.arguments: expected a string, got object",
        ),
        (["input", 6, "call_id"], KeyError, "input.6.call_id: field required"),
        (["input", 7, "output"], KeyError, "input.7.output: field required"),
        (["tools", 0, "name"], KeyError, "tools.0.name: field required"),
        (["tools", 0, "parameters"], [], "tools.0.parameters: expected an object, got array"),
        (["tool_choice"], "any", "tool_choice: unknown tool_choice 'any'"),
        (["tool_choice"], {"type": "web_search"}, "tool_choice.type: unsupported tool_choice type"),
        (["reasoning"], {"effort": 3}, "reasoning.effort: expected a string, got number"),
        (["include"], "x", "include: expected an array, got string"),
        (["max_output_tokens"], 0, "max_output_tokens: must be >= 1, got 0"),
        (["previous_response_id"], "resp_1", "previous_response_id: not supported"),
        (["store"], "no", "store: expected a boolean, got string"),
    ],
)
def test_invalid_requests_name_the_path(path: list[Any], value: Any, message: str) -> None:
    with pytest.raises(AdapterError) as caught:
        parse_request(_mutated(path, value))
    assert caught.value.kind is ErrorKind.INVALID_REQUEST
    assert caught.value.message.startswith(message), caught.value.message


# -- responses ---------------------------------------------------------------------------------


def test_response_body_is_an_sdk_response() -> None:
    request = parse_request(codex_body())
    body = response_body(
        ParsedReply(REPLY),
        Usage(7000, 90),
        StopReason.TOOL_USE,
        "policy",
        "resp_abc",
        request=request,
        created_at=CREATED,
    )
    response = Response.model_validate(body)
    assert response.status == "completed"
    assert [item.type for item in response.output] == [
        "reasoning",
        "message",
        "function_call",
        "function_call",
    ]
    reasoning = response.output[0]
    assert reasoning.type == "reasoning"
    assert reasoning.id.startswith("rs_")
    assert [s.text for s in reasoning.summary] == [REPLY.content[0].text]  # type: ignore[union-attr]
    assert reasoning.encrypted_content is not None
    assert decode_reasoning(reasoning.encrypted_content) == REPLY.content[0].text  # type: ignore[union-attr]
    call = response.output[3]
    assert call.type == "function_call"
    assert call.id is not None
    assert call.id.startswith("fc_")
    assert (call.call_id, call.arguments) == (
        "call_B2",
        '{"cmd": "python -m pytest -q", "workdir": "/repo"}',
    )
    assert response.output_text == "Found it: `add` subtracts."
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (7000, 90)
    assert [t.type for t in response.tools] == ["function"]
    assert response.parallel_tool_calls is True


def test_length_stop_is_incomplete() -> None:
    body = response_body(ParsedReply(REPLY), Usage(1, 1), StopReason.MAX_TOKENS, "m", "resp_x")
    response = Response.model_validate(body)
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"


def test_round_trip_through_codex_echo() -> None:
    """Our reply -> body -> Codex's echo in its next request -> the same neutral message."""
    body = response_body(ParsedReply(REPLY), Usage(1, 1), StopReason.TOOL_USE, "m", "resp_rt")
    request = codex_body()
    output: list[dict[str, Any]] = body["output"]  # type: ignore[assignment]
    request["input"] += codex_echo(output)
    request["input"] += [
        {
            "type": "function_call_output",
            "call_id": "call_B1",
            "output": "Process exited with code 0",
        },
        {"type": "function_call_output", "call_id": "call_B2", "output": "2 passed"},
    ]
    messages = parse_request(request).prompt.messages
    assert messages[-3].role == "assistant"
    assert same_message(REPLY, messages[-3])
    assert messages[-3] == REPLY  # exact, not just canonical: Codex echoes arguments verbatim


def test_reasoning_text_survives_a_rewritten_summary() -> None:
    item = {
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "(summary shortened by a client)"}],
        "encrypted_content": encode_reasoning("the full original reasoning"),
    }
    turn = parse_request({"model": "m", "input": [item]}).prompt.messages[0]
    assert turn.content == (Reasoning("the full original reasoning"),)


# -- streaming ---------------------------------------------------------------------------------


def test_stream_events_validate_and_accumulate_to_the_body() -> None:
    usage = Usage(7000, 90)
    stream = encode_stream(REPLY, StopReason.TOOL_USE, usage, "resp_s")
    payloads = sse_payloads(stream)
    assert [p["sequence_number"] for p in payloads] == list(range(len(payloads)))
    for payload in payloads:
        EVENTS.validate_python(payload)
    types = [p["type"] for p in payloads]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed"
    for event_type in (
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
    ):
        assert event_type in types
    assert (
        types.count("response.output_item.added") == types.count("response.output_item.done") == 4
    )

    client = sdk_client(200, stream, "text/event-stream")
    with client.responses.stream(model="policy", input="x") as sdk_stream:
        deltas = "".join(e.delta for e in sdk_stream if e.type == "response.output_text.delta")
        final = sdk_stream.get_final_response()
    assert deltas == "Found it: `add` subtracts."
    expected_body = response_body(
        ParsedReply(REPLY), usage, StopReason.TOOL_USE, "policy", "resp_s", created_at=CREATED
    )
    expected = Response.model_validate(expected_body)
    assert final.model_dump(exclude_none=True, exclude={"output"}) == expected.model_dump(
        exclude_none=True, exclude={"output"}
    )
    assert [i.model_dump(exclude_none=True) for i in final.output] == [
        i.model_dump(exclude_none=True) for i in expected.output
    ]
    # what Codex reads: every output_item.done item, in order, equals the body's output
    done = [p["item"] for p in payloads if p["type"] == "response.output_item.done"]
    assert done == expected_body["output"]


def test_length_stop_streams_response_incomplete() -> None:
    payloads = sse_payloads(encode_stream(REPLY, StopReason.MAX_TOKENS, Usage(1, 1)))
    last = EVENTS.validate_python(payloads[-1])
    assert last.type == "response.incomplete"
    assert last.response.incomplete_details.reason == "max_output_tokens"


@pytest.mark.parametrize(
    ("kind", "code"),
    [
        (ErrorKind.CONTEXT_LENGTH, "context_length_exceeded"),
        (ErrorKind.RATE_LIMITED, "rate_limit_exceeded"),
        (ErrorKind.ENGINE_ERROR, "server_error"),
    ],
)
def test_mid_stream_error_is_response_failed_with_codex_codes(kind: ErrorKind, code: str) -> None:
    encoder = StreamEncoder("m", "resp_f", created_at=CREATED)
    stream = encoder.start(Usage(1, 0)) + encoder.event(TextDelta("par"))
    stream += encoder.error(kind, "it broke")
    payloads = sse_payloads(stream)
    failed = payloads[-1]
    assert failed["type"] == "response.failed"
    assert failed["response"]["status"] == "failed"
    assert failed["response"]["error"] == {"code": code, "message": "it broke"}
    if code != "context_length_exceeded":  # Codex's code; the SDK's Literal lacks it
        EVENTS.validate_python(failed)
    with pytest.raises(RuntimeError, match="already ended"):
        encoder.event(TextDelta("late"))


def test_error_before_start_still_opens_the_response() -> None:
    payloads = sse_payloads(StreamEncoder("m", "resp_g").error(ErrorKind.ENGINE_ERROR, "x"))
    assert [p["type"] for p in payloads] == [
        "response.created",
        "response.in_progress",
        "response.failed",
    ]


# -- the registry ------------------------------------------------------------------------------


def test_registry_echoes_request_settings() -> None:
    dialect = DIALECTS["openai_responses"]
    request = dialect.parse_request(codex_body())
    body = dialect.response_body(
        request, ParsedReply(REPLY), Usage(1, 1), StopReason.TOOL_USE, "r", None
    )
    assert Response.model_validate(body).tools[0].type == "function"
    assert dialect.new_response_id().startswith("resp_")


# -- properties --------------------------------------------------------------------------------

_text = st.text(min_size=1, max_size=30)
_args = st.dictionaries(
    st.text(min_size=1, max_size=6), st.integers() | st.text(max_size=8), max_size=3
)


@st.composite
def replies(draw: st.DrawFn) -> Message:
    """Any interleaving of reasoning, text and calls, adjacent blocks of one kind merged."""
    blocks: list[Reasoning | Text | ToolCall] = []
    for i in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["reasoning", "text", "call"]))
        if kind == "call":
            blocks.append(ToolCall(f"call_{i}", "exec_command", json.dumps(draw(_args))))
        elif blocks and type(blocks[-1]).__name__.lower() == kind:
            continue
        else:
            blocks.append(Reasoning(draw(_text)) if kind == "reasoning" else Text(draw(_text)))
    return Message("assistant", tuple(blocks))


@settings(max_examples=60, deadline=None)
@given(replies())
def test_any_reply_round_trips_and_streams_like_the_body(reply: Message) -> None:
    stop = StopReason.TOOL_USE if reply.tool_calls else StopReason.END_TURN
    usage = Usage(10, 5)
    body = response_body(ParsedReply(reply), usage, stop, "m", "resp_p", created_at=CREATED)
    Response.model_validate(body)
    output: list[dict[str, Any]] = body["output"]  # type: ignore[assignment]
    parsed = parse_request({"model": "m", "input": codex_echo(output)}).prompt.messages
    assert len(parsed) == 1
    assert parsed[0] == reply

    payloads = sse_payloads(encode_stream(reply, stop, usage, "resp_p"))
    for payload in payloads:
        EVENTS.validate_python(payload)
    done = [p["item"] for p in payloads if p["type"] == "response.output_item.done"]
    assert done == output
    assert payloads[-1]["response"] == {**body, "model": "policy"}
