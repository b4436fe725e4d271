"""A client that goes away mid-stream: the generation is aborted on the engine, the tokens it had
produced are recorded as an aborted turn (kept, never trained), and the session carries on."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest

from protocol_adapters.testing import Faults, ScriptedReply
from protocol_adapters.testing.stack import local_stack
from protocol_adapters.tokenizer import Vocabulary
from trajectory_tree import Exclusion, FinishReason, LossReason, linearize

from .server_checks import assert_engine_tokens_trained
from .server_clients import DIALECTS, PATHS, Dialect, SdkClient, minimal_body

LONG = ScriptedReply(text=" ".join(f"step {i}: keep going." for i in range(40)))
SCRIPT = [LONG, ScriptedReply(text="ok")]
# A marker of the first text delta in each dialect's stream.
FIRST_TEXT = {
    "anthropic": b'"text_delta"',
    "openai_chat": b'"content":',
    "openai_responses": b"response.output_text.delta",
}


async def read_until_text_then_disconnect(url: str, token: str, body: bytes, marker: bytes) -> int:
    """Stream a request, read events until the first text delta, then drop the connection.
    Returns how many bytes were read."""
    read = b""
    async with aiohttp.ClientSession() as http:
        response = await http.post(
            url,
            data=body,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        assert response.status == 200
        assert response.content_type == "text/event-stream"
        while marker not in read:
            chunk = await response.content.readany()
            assert chunk, "stream ended before any text"
            read += chunk
        response.close()  # closes the TCP connection, not just this response
    return len(read)


async def eventually(condition: object, what: str, seconds: float = 3.0) -> None:
    assert callable(condition)
    async with asyncio.timeout(seconds):
        while not condition():
            await asyncio.sleep(0.01)
    assert condition(), what


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_disconnect_aborts_records_an_aborted_turn_and_the_session_carries_on(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary, dialect: Dialect
) -> None:
    async with local_stack(
        SCRIPT,
        tokenizer_cache=tokenizer_cache,
        vocabulary=qwen_vocabulary,
        faults=Faults(chunk_delay=0.02),
    ) as stack:
        double = stack.double
        session = stack.server.sessions.open(f"disconnect-{dialect}")
        body = minimal_body(dialect, "Work through the steps.", max_tokens=512)
        await read_until_text_then_disconnect(
            stack.server.url + PATHS[dialect],
            session.token,
            json.dumps({**body, "stream": True}).encode(),
            FIRST_TEXT[dialect],
        )
        rid = double.requests[0].rid
        await eventually(lambda: rid in double.aborts, "the engine got /abort_request")
        await eventually(lambda: len(session.tree.turns) == 1, "the partial turn was recorded")
        assert double.disconnects in ([], [rid])  # it saw the abort, or the connection go
        assert session.in_flight == set()

        aborted = session.tree.turns[0]
        assert aborted.meta.request_id == rid
        assert aborted.finish_reason is FinishReason.ABORT
        full = double.reply_ids(LONG)
        assert 0 < aborted.output_length < len(full)
        # What was recorded is exactly what the engine had sent: a prefix of the reply.
        assert list(session.tree.output_ids(aborted)) == full[: aborted.output_length]
        assert list(aborted.output_logprobs) == [-0.125] * aborted.output_length

        # The agent retries the same request; it is generated afresh on the same prefix.
        double.faults = Faults()
        async with SdkClient(stack, dialect, session.token) as client:
            assert await client.post(body) == "ok"
        tree = session.tree
        assert len(tree.turns) == 2
        retry = tree.turns[1]
        assert retry.finish_reason is FinishReason.STOP
        assert list(tree.prompt_ids(retry)) == list(tree.prompt_ids(aborted))
        parent = tree.node(aborted.node).parent
        assert parent is not None
        assert tree.node(retry.node).parent is parent
        assert stack.renderer.stats.full_renders == 0

        lin = linearize(tree)
        assert len(lin.samples) == 1
        assert lin.samples[0].trained_turns == (retry.id,)
        assert lin.exclusions == (Exclusion(aborted.id, LossReason.ABORTED, aborted.output_length),)
        assert_engine_tokens_trained(stack, tree, lin)
