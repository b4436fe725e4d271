"""Bad requests through the real server: each is answered in the client's dialect with the status
its SDK expects, the server keeps serving, and the session's tree is left exactly as it was.

Every test first records one good turn, so the request context exists and "unchanged" is a strong
check: a refused request must not add a node, a turn or a branch.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest
from server_clients import (
    DIALECTS,
    PATHS,
    Dialect,
    assert_error_body,
    assert_sdk_error,
    checked,
    minimal_body,
    openai_client,
    raw_request,
    sdk_error_types,
    sdk_post,
    shape,
    status_error,
)

from protocol_adapters._server.config import AdapterConfig
from protocol_adapters._server.sessions import SessionLimits
from protocol_adapters._tokenizer import Vocabulary
from protocol_adapters.testing import Faults


def _drop(key: str) -> Callable[[dict[str, Any]], object]:
    def edit(body: dict[str, Any]) -> object:
        del body[key]
        return body

    return edit


def _set(key: str, value: object) -> Callable[[dict[str, Any]], object]:
    def edit(body: dict[str, Any]) -> object:
        body[key] = value
        return body

    return edit


# (case id, dialect) -> (edit of the minimal body, a word the error message must name)
JSON_CASES: dict[tuple[str, Dialect], tuple[Callable[[dict[str, Any]], object], str]] = {}
for _d in DIALECTS:
    _messages = "input" if _d == "openai_responses" else "messages"
    JSON_CASES[("array", _d)] = (lambda b: [b], "object")
    JSON_CASES[("string", _d)] = (lambda b: "hello", "object")
    JSON_CASES[("model-number", _d)] = (_set("model", 7), "model")
    JSON_CASES[("messages-number", _d)] = (_set(_messages, 42), _messages)
    JSON_CASES[("no-model", _d)] = (_drop("model"), "model")
    JSON_CASES[("no-messages", _d)] = (_drop(_messages), _messages)
    JSON_CASES[("max-tokens-string", _d)] = (
        _set("max_output_tokens" if _d == "openai_responses" else "max_tokens", "64"),
        "max_",
    )
JSON_CASES[("content-number", "anthropic")] = (
    _set("messages", [{"role": "user", "content": 5}]),
    "content",
)
JSON_CASES[("bad-role", "openai_chat")] = (
    _set("messages", [{"role": "wizard", "content": "hi"}]),
    "role",
)
JSON_CASES[("unknown-item", "openai_responses")] = (
    _set("input", [{"type": "no_such_item"}]),
    "no_such_item",
)


@pytest.mark.parametrize(
    ("case", "dialect"), sorted(JSON_CASES), ids=[f"{d}-{c}" for c, d in sorted(JSON_CASES)]
)
async def test_invalid_json_requests_are_400_in_dialect_shape(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary, case: str, dialect: Dialect
) -> None:
    edit, named = JSON_CASES[(case, dialect)]
    async with checked(tokenizer_cache, qwen_vocabulary, dialect) as check:
        body = edit(minimal_body(dialect, "bad"))
        with pytest.raises(sdk_error_types(dialect)) as err:
            await check.client.post(body)
        message = assert_sdk_error(dialect, err.value, "invalid")
        assert named in message
        await check.after_refusal()


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize(
    ("data", "named"),
    [
        (b'{"model": "policy", "messages": [', "not valid JSON"),
        (b"\xff\xfe not utf-8", "not valid JSON"),
        (b"", "empty"),
    ],
    ids=["truncated", "not-utf8", "empty"],
)
async def test_bodies_that_are_not_json_are_400(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary, dialect: Dialect, data: bytes, named: str
) -> None:
    async with checked(tokenizer_cache, qwen_vocabulary, dialect) as check:
        answer = await raw_request(check.stack, PATHS[dialect], data, token=check.token)
        assert named in assert_error_body(dialect, answer.status, answer.body, "invalid")
        await check.after_refusal()


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_oversized_body_is_413(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary, dialect: Dialect
) -> None:
    config = AdapterConfig(max_body_bytes=2048)
    async with checked(tokenizer_cache, qwen_vocabulary, dialect, config) as check:
        body = minimal_body(dialect, "x" * 4096)
        with pytest.raises(sdk_error_types(dialect)) as err:
            await check.client.post(body)
        assert_sdk_error(dialect, err.value, "too_large")
        await check.after_refusal()


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_missing_key_is_401(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary, dialect: Dialect
) -> None:
    async with checked(tokenizer_cache, qwen_vocabulary, dialect) as check:
        data = json.dumps(minimal_body(dialect, "hi")).encode()
        answer = await raw_request(check.stack, PATHS[dialect], data)
        assert "API key" in assert_error_body(dialect, answer.status, answer.body, "auth")
        await check.after_refusal()


async def test_closed_session_is_401(tokenizer_cache: Path, qwen_vocabulary: Vocabulary) -> None:
    async with checked(tokenizer_cache, qwen_vocabulary, "anthropic") as check:
        await check.stack.server.close_session(check.token)
        with pytest.raises(sdk_error_types("anthropic")) as err:
            await check.client.post(minimal_body("anthropic", "hi"))
        assert_sdk_error("anthropic", err.value, "auth")
        assert len(check.session.tree.turns) == 1


@pytest.mark.parametrize(
    ("method", "path", "dialect"),
    [
        ("POST", "/v2/messages", "anthropic"),
        ("GET", "/v1/messages", "anthropic"),
        ("GET", "/v1/nothing-here", "anthropic"),
        ("POST", "/v1/chat/completion", "openai_chat"),
        ("GET", "/v1/responses/resp_123", "openai_responses"),
        ("POST", "/v1/responses/resp_123/cancel", "openai_responses"),
    ],
)
async def test_unknown_path_is_404(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary, method: str, path: str, dialect: Dialect
) -> None:
    """Unknown routes answer 404; under an OpenAI prefix, in OpenAI's shape."""
    async with checked(tokenizer_cache, qwen_vocabulary, dialect) as check:
        answer = await raw_request(check.stack, path, b"{}", token=check.token, method=method)
        assert path in assert_error_body(dialect, answer.status, answer.body, "not_found")
        await check.after_refusal()


async def test_unknown_response_id_through_the_sdk_is_openai_not_found(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    """Nothing is stored (``store: false``): retrieving a response is an OpenAI-shaped 404."""
    async with checked(tokenizer_cache, qwen_vocabulary, "openai_responses") as check:
        async with openai_client(check.stack, check.token) as oai:
            with pytest.raises(openai.NotFoundError) as err:
                await oai.responses.retrieve("resp_123")
        assert err.value.code == "not_found"
        assert_sdk_error("openai_responses", err.value, "not_found")
        await check.after_refusal()


TOO_LONG = re.compile(r"^prompt is too long: (\d+) tokens > (\d+) maximum$")


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_prompt_over_context_limit_is_the_error_that_makes_clients_compact(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary, dialect: Dialect, stream: bool
) -> None:
    """Streamed too (Claude Code always streams): refused before the stream starts, as a plain
    400 the client can act on."""
    limit = 160
    config = AdapterConfig(limits=SessionLimits(context_tokens=limit))
    async with checked(tokenizer_cache, qwen_vocabulary, dialect, config) as check:
        body = minimal_body(dialect, "lorem ipsum " * 200)
        if stream:
            body["stream"] = True
        with pytest.raises(sdk_error_types(dialect)) as err:
            await check.client.post(body)
        message = assert_sdk_error(dialect, err.value, "context")
        if dialect == "anthropic":
            match = TOO_LONG.match(message)
            assert match is not None, message
            # Counting a prompt the session could never serve stops at the limit too, with the
            # same error: its cost is bounded by the limit, never by the body.
            counted = await raw_request(
                check.stack,
                "/v1/messages/count_tokens",
                json.dumps({k: v for k, v in body.items() if k != "stream"}).encode(),
                token=check.token,
            )
            assert counted.status == 400
            refused = TOO_LONG.match(counted.body["error"]["message"])
            assert refused is not None, counted.body
            assert int(refused[1]) > int(refused[2]) == limit - 2
            # SGLang refuses prompt + max_new_tokens >= context: one generated token needs a
            # prompt of at most context - 2 tokens.
            assert int(match[2]) == limit - 2
        else:
            param = "input" if dialect == "openai_responses" else "messages"
            assert status_error(err.value).response.json()["error"]["param"] == param
        await check.after_refusal()


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_session_turn_cap_is_429(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary, dialect: Dialect, stream: bool
) -> None:
    config = AdapterConfig(limits=SessionLimits(max_turns=2))
    async with checked(tokenizer_cache, qwen_vocabulary, dialect, config) as check:
        await check.good()  # the second and last turn allowed
        before = shape(check.session)
        with pytest.raises(sdk_error_types(dialect)) as err:
            await check.client.post({**minimal_body(dialect, "third"), "stream": stream})
        assert "turn limit" in assert_sdk_error(dialect, err.value, "rate")
        assert status_error(err.value).response.headers["retry-after"] == "1"
        assert shape(check.session) == before
        assert len(check.stack.double.requests) == 2
        # The server still serves other sessions.
        other = check.stack.server.sessions.open("another-episode")
        reply = await sdk_post(check.stack, dialect, other.token, minimal_body(dialect, "hi"))
        assert reply == "ok"


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_refused_first_request_leaves_a_fresh_session_empty(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary, dialect: Dialect
) -> None:
    """Nothing to compare against but nothing: not even the request's context root is kept."""
    config = AdapterConfig(limits=SessionLimits(context_tokens=160))
    async with checked(tokenizer_cache, qwen_vocabulary, dialect, config, seed=False) as check:
        with pytest.raises(sdk_error_types(dialect)) as err:
            await check.client.post(minimal_body(dialect, "lorem ipsum " * 200))
        assert_sdk_error(dialect, err.value, "context")
        assert shape(check.session) == (0, 0, 0)
        await check.seed()
        assert shape(check.session)[1] == 1


def _anthropic_results(call_id: str, answered: str) -> dict[str, Any]:
    return {
        "model": "policy",
        "max_tokens": 64,
        "messages": [
            {"role": "user", "content": "list"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": call_id, "name": "Bash", "input": {}}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": answered, "content": "a.py"}],
            },
        ],
    }


def _chat_results(call_id: str, answered: str) -> dict[str, Any]:
    call = {"id": call_id, "type": "function", "function": {"name": "Bash", "arguments": "{}"}}
    return {
        "model": "policy",
        "max_tokens": 64,
        "messages": [
            {"role": "user", "content": "list"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": answered, "content": "a.py"},
        ],
    }


def _responses_results(call_id: str, answered: str) -> dict[str, Any]:
    return {
        "model": "policy",
        "max_output_tokens": 64,
        "input": [
            {"role": "user", "content": "list"},
            {"type": "function_call", "call_id": call_id, "name": "Bash", "arguments": "{}"},
            {"type": "function_call_output", "call_id": answered, "output": "a.py"},
        ],
    }


# What the providers answer, verbatim (OpenAI's "preceeding" included), and the param they name.
ORPHAN_RESULTS: dict[Dialect, tuple[Callable[[str, str], dict[str, Any]], str, str | None]] = {
    "anthropic": (
        _anthropic_results,
        "messages.2.content.0: unexpected `tool_use_id` found in `tool_result` blocks: "
        "toolu_ghost. Each `tool_result` block must have a corresponding `tool_use` block in the "
        "previous message.",
        None,
    ),
    "openai_chat": (
        _chat_results,
        "Invalid parameter: 'tool_call_id' of 'toolu_ghost' not found in 'tool_calls' of previous "
        "message.",
        "messages.[2].tool_call_id",
    ),
    "openai_responses": (
        _responses_results,
        "No tool call found for function call output with call_id toolu_ghost.",
        "input",
    ),
}


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_result_for_a_tool_call_that_does_not_exist_is_refused(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary, dialect: Dialect
) -> None:
    """The real APIs refuse it with a 400; accepting it would train a made-up result as
    context. The matching request is answered, so the check is the id and nothing else."""
    build, message, param = ORPHAN_RESULTS[dialect]
    async with checked(tokenizer_cache, qwen_vocabulary, dialect) as check:
        answer = await raw_request(
            check.stack,
            PATHS[dialect],
            json.dumps(build("toolu_real", "toolu_ghost")).encode(),
            token=check.token,
        )
        assert assert_error_body(dialect, answer.status, answer.body, "invalid") == message
        if dialect != "anthropic":
            assert answer.body["error"]["param"] == param
        await check.after_refusal()
        assert await check.client.post(build("toolu_real", "toolu_real")) == "ok"


async def test_an_anthropic_result_must_answer_the_previous_assistant_message(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    """A call from an earlier turn is not answerable later; system entries in between are."""
    body = _anthropic_results("toolu_1", "toolu_1")
    late = [
        *body["messages"],
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1"}]},
    ]
    noted = [*body["messages"][:2], {"role": "system", "content": "note"}, body["messages"][2]]
    async with checked(tokenizer_cache, qwen_vocabulary, "anthropic") as check:
        answer = await raw_request(
            check.stack,
            PATHS["anthropic"],
            json.dumps({**body, "messages": late}).encode(),
            token=check.token,
        )
        message = assert_error_body("anthropic", answer.status, answer.body, "invalid")
        assert message.startswith("messages.4.content.0: unexpected `tool_use_id`")
        assert await check.client.post({**body, "messages": noted}) == "ok"


async def test_a_chat_tool_message_must_follow_tool_calls(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    body = _chat_results("call_1", "call_1")
    stray = [body["messages"][0], body["messages"][2]]
    async with checked(tokenizer_cache, qwen_vocabulary, "openai_chat") as check:
        answer = await raw_request(
            check.stack,
            PATHS["openai_chat"],
            json.dumps({**body, "messages": stray}).encode(),
            token=check.token,
        )
        message = assert_error_body("openai_chat", answer.status, answer.body, "invalid")
        assert message == (
            "Invalid parameter: messages with role 'tool' must be a response to a preceeding "
            "message with 'tool_calls'."
        )
        assert answer.body["error"]["param"] == "messages.[1].role"
        await check.after_refusal()


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_the_turn_cap_counts_only_calls_the_client_got_a_reply_for(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary, dialect: Dialect
) -> None:
    """Refused requests, failed engine calls and replays of a recorded answer use up no turn:
    an agent whose engine hiccups must not run out of turns it never got."""
    config = AdapterConfig(limits=SessionLimits(max_turns=2), replay_retries=True)
    async with checked(tokenizer_cache, qwen_vocabulary, dialect, config) as check:
        assert check.session.answered == 1
        engine_calls = len(check.stack.double.requests)
        # a refused request
        with pytest.raises(sdk_error_types(dialect)):
            await check.client.post({"model": 7})
        # a failed engine call, twice
        check.stack.double.faults = Faults(http_status=500)
        for _ in range(2):
            with pytest.raises(sdk_error_types(dialect)):
                await check.client.post(minimal_body(dialect, "engine fails"))
        check.stack.double.faults = Faults()
        # a replay: the seed's request again, answered from the record
        assert await check.client.post(minimal_body(dialect, "good request 1")) == "ok"
        assert len(check.stack.double.requests) == engine_calls + 2
        assert (check.session.answered, check.session.pending) == (1, 0)
        await check.good()  # the second and last turn
        with pytest.raises(sdk_error_types(dialect)) as err:
            await check.client.post(minimal_body(dialect, "third"))
        assert "turn limit" in assert_sdk_error(dialect, err.value, "rate")
        assert check.session.answered == 2
