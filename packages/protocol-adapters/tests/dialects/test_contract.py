"""What every dialect must do, stated once and run for each of the three through its official SDK.

The driver (``dialect_drivers``) speaks its dialect the way its real client does (Claude Code,
a Chat Completions agent, Codex) and reads replies back into the facts all dialects share. Per
dialect here: a tool round trip, streamed and not (the calls and the answer as the client reads
them, usage that is the engine's count, the echo routing back onto the recorded reply, and a tree
that trains exactly the engine's tokens); an unknown session token refused with 401 in the
dialect's shape; and every error kind as the status, body and exception its SDK expects. What
only one dialect has stays in its own files (``test_dialect_*``: its wire against its SDK's
models; ``test_server_*``: its particular clients' habits through the server).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import openai
import pytest
from anthropic.types.shared import ErrorResponse
from dialect_drivers import DRIVERS, Driver, parts_of
from server_checks import assert_engine_tokens_trained
from server_clients import (
    DIALECTS,
    OPENAI_ERRORS,
    Dialect,
    Kind,
    assert_error_body,
    assert_sdk_error,
    checked,
    sdk_error_types,
)

from protocol_adapters._dialects import anthropic as anthropic_dialect
from protocol_adapters._dialects import openai_chat, openai_responses
from protocol_adapters._tokenizer import Vocabulary
from protocol_adapters._types import ErrorKind
from protocol_adapters.testing.stack import local_stack
from trajectory_tree import LossReason, Reasoning, linearize


@pytest.fixture(params=DIALECTS)
def driver(request: pytest.FixtureRequest) -> type[Driver]:
    dialect: Dialect = request.param
    return DRIVERS[dialect]


# -- a tool round trip -------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_a_tool_round_trip_trains_exactly_the_engines_tokens(
    driver: type[Driver], tokenizer_cache: Path, qwen_vocabulary: Vocabulary, stream: bool
) -> None:
    """Reasoning, text and two parallel calls; the client echoes the reply and answers both
    calls; then a plain answer. The client reads what the model wrote, the usage is the engine's,
    and the echo continues the recorded branch: one sample, trained on the engine's own tokens."""
    calls_turn, answer_turn = driver.script
    async with local_stack(
        driver.script,
        tokenizer_cache=tokenizer_cache,
        vocabulary=qwen_vocabulary,
        config=driver.config,
    ) as stack:
        session = stack.server.sessions.open(driver.session)
        async with driver(stack, session.token) as client:
            first = await client.ask(stream=stream)
            client.answer()
            second = await client.ask(stream=stream)

        # What the client read.
        assert first.stop == driver.stops[0]
        assert first.parts == parts_of(calls_turn)
        assert first.reasoning == [calls_turn.reasoning]
        assert first.text == calls_turn.text
        assert [(c.name, c.arguments) for c in first.calls] == [
            (name, dict(arguments)) for name, arguments in calls_turn.tool_calls
        ]
        assert len({c.id for c in first.calls}) == 2
        assert second.stop == driver.stops[1]
        assert second.parts == parts_of(answer_turn)
        assert second.reasoning == [r for r in [answer_turn.reasoning] if r is not None]
        assert second.text == answer_turn.text
        assert second.calls == []

        # What the server recorded and reported.
        tree = session.tree
        assert len(tree.turns) == 2
        for turn, reply, sent in zip(
            tree.turns, (first, second), stack.double.requests, strict=True
        ):
            assert turn.meta.request_id == sent.rid
            assert reply.input_tokens == len(sent.input_ids) > 0
            assert reply.output_tokens == turn.output_length > 0
            if reply.total_tokens is not None:
                assert reply.total_tokens == len(sent.input_ids) + turn.output_length
        assert len(tree.turns[0].reply.tool_calls) == 2
        # The echo routed onto the recorded turn: the tree kept what the model produced, and the
        # second prompt starts with the first prompt and reply verbatim.
        echoed = tree.request_messages(tree.turns[1])[-1 - len(first.calls)]
        assert echoed.role == "assistant"
        assert isinstance(echoed.content[0], Reasoning)
        assert stack.double.requests[1].input_ids[: tree.turns[0].prompt_length] == tuple(
            stack.double.requests[0].input_ids
        )
        first_ids = list(tree.prompt_ids(tree.turns[0])) + list(tree.output_ids(tree.turns[0]))
        assert list(stack.double.requests[1].input_ids[: len(first_ids)]) == first_ids
        lin = linearize(tree)
        assert len(lin.samples) == 1, "the echo must continue the same branch"
        assert_engine_tokens_trained(stack, tree, lin)
        reasons = {s.reason for s in lin.samples[0].spans}
        assert LossReason.TOOL_OUTPUT in reasons
        assert LossReason.RERENDERED_HISTORY not in reasons
        assert all(t.rerendered is None for t in tree.turns)
        assert stack.renderer.stats.full_renders == 0
        assert lin.exclusions == ()


# -- refusals ----------------------------------------------------------------------------------


async def test_an_unknown_session_token_is_401_in_the_dialects_shape(
    driver: type[Driver], tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    """Refused before the engine sees anything; the tree of the session that exists is left
    as it was, and it is served next."""
    async with checked(tokenizer_cache, qwen_vocabulary, driver.dialect) as check:
        async with driver(check.stack, "sess-unknown") as stranger:
            with pytest.raises(sdk_error_types(driver.dialect)) as err:
                await stranger.ask(stream=False)
        assert "session" in assert_sdk_error(driver.dialect, err.value, "auth")
        await check.after_refusal()


ERROR_KINDS: dict[Kind, ErrorKind] = {
    "invalid": ErrorKind.INVALID_REQUEST,
    "context": ErrorKind.CONTEXT_LENGTH,
    "auth": ErrorKind.AUTHENTICATION,
    "not_found": ErrorKind.NOT_FOUND,
    "too_large": ErrorKind.REQUEST_TOO_LARGE,
    "rate": ErrorKind.RATE_LIMITED,
    "api": ErrorKind.ENGINE_ERROR,
    "overloaded": ErrorKind.OVERLOADED,
    "timeout": ErrorKind.TIMEOUT,
}
# Each dialect's error module, a message in its provider's wording, and the param a context
# error names.
ERROR_RESPONSES = {
    "anthropic": anthropic_dialect.error_response,
    "openai_chat": openai_chat.error_response,
    "openai_responses": openai_responses.error_response,
}
ERROR_MESSAGES: dict[Dialect, str] = {
    "anthropic": "prompt is too long: 140000 tokens > 131072 maximum",
    "openai_chat": "This model's maximum context length is 131072 tokens; you requested 140000.",
    "openai_responses": "went wrong",
}
CONTEXT_PARAMS: dict[Dialect, str | None] = {
    "anthropic": None,
    "openai_chat": "messages",
    "openai_responses": "input",
}


def sdk_exception(dialect: Dialect, status: int, body: object) -> Exception:
    """What the dialect's SDK raises for this answer (a real client over a transport that hands
    back these bytes: no server)."""

    def handler(request: httpx2.Request) -> httpx2.Response:
        headers = {"content-type": "application/json"}
        return httpx2.Response(status, content=json.dumps(body).encode(), headers=headers)

    http = httpx2.Client(transport=httpx2.MockTransport(handler))
    question: Any = [{"role": "user", "content": "x"}]
    if dialect == "anthropic":
        claude = anthropic.Anthropic(
            api_key="session-token", base_url="http://adapter.test", http_client=http, max_retries=0
        )
        with pytest.raises(anthropic.APIStatusError) as caught:
            claude.messages.create(model="m", max_tokens=1, messages=question)
        return caught.value
    oai = openai.OpenAI(
        api_key="session-token", base_url="http://adapter.test/v1", http_client=http, max_retries=0
    )
    if dialect == "openai_chat":
        with pytest.raises(openai.APIStatusError) as raised:
            oai.chat.completions.create(model="m", messages=question)
        return raised.value
    with pytest.raises(openai.APIStatusError) as raised:
        oai.responses.create(model="m", input="x")
    return raised.value


@pytest.mark.parametrize("kind", list(ERROR_KINDS))
def test_every_error_kind_is_the_status_body_and_exception_the_sdk_expects(
    driver: type[Driver], kind: Kind
) -> None:
    dialect = driver.dialect
    message = ERROR_MESSAGES[dialect]
    status, body = ERROR_RESPONSES[dialect](ERROR_KINDS[kind], message)
    assert assert_error_body(dialect, status, body, kind) == message
    exc = sdk_exception(dialect, status, body)
    assert assert_sdk_error(dialect, exc, kind) == message
    if dialect == "anthropic":
        assert isinstance(exc, anthropic.APIStatusError)
        assert exc.status_code == status
        assert message in str(exc)
        if kind != "too_large":  # documented by Anthropic, absent from the SDK union
            ErrorResponse.model_validate(body)
        return
    assert isinstance(exc, openai.APIStatusError)
    assert exc.status_code == status
    assert exc.code == OPENAI_ERRORS[kind][2]
    assert exc.message == f"Error code: {status} - {message}"
    assert exc.param == (CONTEXT_PARAMS[dialect] if kind == "context" else None)
