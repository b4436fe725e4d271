"""A generation the engine aborts (SGLang aborts every running request before a weight update,
``finish_reason.type == "abort"``) reaches the client as a retryable error in its dialect, never
as a normal end: a client given the cut-off text as a whole answer would carry on from it.

What the engine produced before the abort is recorded as an aborted turn (kept, never trained);
the client's retry is generated whole and is what the episode trains on.
"""

from __future__ import annotations

import json
from pathlib import Path

import anthropic
import pytest
from server_checks import assert_engine_tokens_trained
from server_clients import (
    DIALECTS,
    PATHS,
    Dialect,
    SdkClient,
    anthropic_client,
    assert_error_body,
    assert_error_shape,
    assert_sdk_error,
    minimal_body,
    openai_client,
    raw_request,
    raw_stream,
    sdk_error_types,
    sse_payloads,
    status_error,
)

from protocol_adapters._tokenizer import Vocabulary
from protocol_adapters.testing import ScriptedReply
from protocol_adapters.testing.stack import LocalStack, local_stack
from trajectory_tree import Exclusion, FinishReason, LossReason, linearize

CUT = ScriptedReply(text="I will now edit the file and then", finish="abort")
WHOLE = ScriptedReply(text="Done: the file is fixed.")


def assert_retry_trained(stack: LocalStack, token: str) -> None:
    """The aborted attempt is kept and excluded; only the whole retry is trained."""
    tree = stack.server.sessions.get(token).tree
    aborted, retried = tree.turns
    assert aborted.finish_reason is FinishReason.ABORT
    assert aborted.output_length > 0
    assert retried.finish_reason is FinishReason.STOP
    lin = linearize(tree)
    assert lin.exclusions == (Exclusion(aborted.id, LossReason.ABORTED, aborted.output_length),)
    assert [s.trained_turns for s in lin.samples] == [(retried.id,)]
    assert_engine_tokens_trained(stack, tree, lin)


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_an_aborted_reply_is_a_retryable_error_not_an_answer(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary, dialect: Dialect
) -> None:
    async with local_stack(
        [CUT, WHOLE], tokenizer_cache=tokenizer_cache, vocabulary=qwen_vocabulary
    ) as stack:
        session = stack.server.sessions.open("abort")
        async with SdkClient(stack, dialect, session.token) as client:
            with pytest.raises(sdk_error_types(dialect)) as err:
                await client.post(minimal_body(dialect, "fix it"))
            message = assert_sdk_error(dialect, err.value, "overloaded")
            assert "aborted" in message
            assert status_error(err.value).response.headers["retry-after"] == "1"
            assert await client.post(minimal_body(dialect, "fix it")) == WHOLE.text
        assert_retry_trained(stack, session.token)
        assert session.answered == 1  # the aborted call did not use up a turn


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_the_official_sdks_retry_it_by_themselves(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary, dialect: Dialect
) -> None:
    """With their default retry policy the SDKs (and the CLIs built on them) retry the error
    transparently: the caller sees only the whole answer."""
    async with local_stack(
        [CUT, WHOLE], tokenizer_cache=tokenizer_cache, vocabulary=qwen_vocabulary
    ) as stack:
        session = stack.server.sessions.open("sdk-retry")
        if dialect == "anthropic":
            async with anthropic_client(stack, session.token, max_retries=2) as api:
                reply = await api.messages.create(**minimal_body(dialect, "fix it"))
            assert reply.content[0].text == WHOLE.text
        else:
            oai = openai_client(stack, session.token, max_retries=2)
            if dialect == "openai_chat":
                completion = await oai.chat.completions.create(**minimal_body(dialect, "fix it"))
                assert completion.choices[0].message.content == WHOLE.text
            else:
                response = await oai.responses.create(**minimal_body(dialect, "fix it"))
                assert response.output_text == WHOLE.text
            await oai.close()
        tree = session.tree
        assert [t.meta.retry_count for t in tree.turns] == [0, 1]  # the SDK's own retry header
        assert_retry_trained(stack, session.token)


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_stream_aborted_before_its_first_token_gets_a_real_status(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary, dialect: Dialect
) -> None:
    nothing = ScriptedReply(text="", finish="abort")
    async with local_stack(
        [nothing, WHOLE], tokenizer_cache=tokenizer_cache, vocabulary=qwen_vocabulary
    ) as stack:
        session = stack.server.sessions.open("abort-first")
        body = minimal_body(dialect, "fix it") | {"stream": True}
        answer = await raw_request(
            stack, PATHS[dialect], json.dumps(body).encode(), token=session.token
        )
        assert "aborted" in assert_error_body(dialect, answer.status, answer.body, "overloaded")
        assert session.tree.turns == []  # nothing was generated, nothing to keep


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_stream_aborted_midway_ends_with_the_dialects_retryable_error_event(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary, dialect: Dialect
) -> None:
    """Once tokens have streamed (200 sent), the stream ends with the in-stream error event of
    an overload. Claude Code retries any error whose text carries ``"type":"overloaded_error"``;
    the OpenAI shapes carry ``server_overloaded``."""
    async with local_stack(
        [CUT, WHOLE], tokenizer_cache=tokenizer_cache, vocabulary=qwen_vocabulary
    ) as stack:
        session = stack.server.sessions.open("abort-midway")
        body = minimal_body(dialect, "fix it") | {"stream": True}
        raw = await raw_stream(stack, dialect, session.token, body)
        payloads = sse_payloads(raw)
        if dialect == "anthropic":
            assert "event: error\n" in raw
            assert '"type":"overloaded_error"' in raw.splitlines()[-2]  # as JSON.stringify has it
            assert_error_shape(dialect, payloads[-1], "overloaded")
            assert not any(p["type"] == "message_stop" for p in payloads)
            streamed = [p for p in payloads if p["type"] == "content_block_delta"]
        elif dialect == "openai_chat":
            assert_error_shape(dialect, payloads[-1], "overloaded")
            assert not any(c["finish_reason"] for p in payloads[:-1] for c in p["choices"])
            streamed = [p for p in payloads[:-1] if p["choices"][0]["delta"].get("content")]
        else:
            failed = payloads[-1]
            assert failed["type"] == "response.failed"
            assert failed["response"]["error"]["code"] == "server_overloaded"
            assert not any(p["type"] == "response.completed" for p in payloads)
            streamed = [p for p in payloads if p["type"] == "response.output_text.delta"]
        assert streamed, "the abort came after text had streamed"
        async with SdkClient(stack, dialect, session.token) as client:
            assert await client.post(minimal_body(dialect, "fix it")) == WHOLE.text
        assert_retry_trained(stack, session.token)


async def test_the_anthropic_sdk_surfaces_the_midstream_abort_as_an_overload(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    """The SDK raises on the ``error`` event with the body; Claude Code's own SDK puts that body,
    ``JSON.stringify``-ed, in the error's message, which its retry rule matches
    (``"type":"overloaded_error"``)."""
    async with local_stack(
        [CUT, WHOLE], tokenizer_cache=tokenizer_cache, vocabulary=qwen_vocabulary
    ) as stack:
        session = stack.server.sessions.open("abort-sdk")
        async with anthropic_client(stack, session.token) as api:
            with pytest.raises(anthropic.APIStatusError) as err:
                async with api.messages.stream(**minimal_body("anthropic", "fix it")) as events:
                    await events.get_final_message()
    assert err.value.body == {
        "type": "error",
        "error": {
            "type": "overloaded_error",
            "message": (
                "the engine aborted this generation (aborted by the script); retry the request"
            ),
        },
    }
