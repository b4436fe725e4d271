"""A client that goes away mid-stream: the generation is aborted on the engine, the tokens it had
produced are recorded as an aborted turn (kept, never trained), and the session carries on."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from machine_load import slowdown
from server_checks import assert_engine_tokens_trained
from server_clients import DIALECTS, PATHS, Dialect, SdkClient, minimal_body

from protocol_adapters._dialects import DIALECTS as DIALECTS_BY_NAME
from protocol_adapters._parsing.select import ReplyParser
from protocol_adapters._server.ports import reply_parsers
from protocol_adapters._server.turn import TurnRunner
from protocol_adapters._tokenizer import Vocabulary
from protocol_adapters._types import ParsedReply, TextDelta
from protocol_adapters.testing import Faults, ScriptedReply
from protocol_adapters.testing.stack import local_stack
from trajectory_tree import Exclusion, FinishReason, LossReason, linearize

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
    """Waits for ``condition()`` for ``seconds`` of an idle machine (longer on a busy one)."""
    assert callable(condition)
    async with asyncio.timeout(seconds * slowdown()):
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


async def test_client_gone_while_the_last_events_are_written_still_records_the_turn(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    """The engine has finished; only the events the parser held back until the end remain to be
    written (here: a tool call cut off by ``max_tokens``, released as text). A client gone at
    that moment (its handler cancelled, or its socket closed) must not make the whole
    generation vanish: the turn is recorded, as aborted like any turn the client did not get."""
    reply = ScriptedReply(text="Checking.", tool_calls=[("Bash", {"command": "ls -la /repo"})])
    async with local_stack(
        [reply], tokenizer_cache=tokenizer_cache, vocabulary=qwen_vocabulary
    ) as stack:
        session = stack.server.sessions.open("gone-at-the-end")
        ids = stack.double.reply_ids(reply)
        cut = ids.index(qwen_vocabulary.token_id("<tool_call>")) + 4  # inside the call's JSON
        body = {**minimal_body("anthropic", "List the repo.", max_tokens=cut), "stream": True}
        request = DIALECTS_BY_NAME["anthropic"].parse_request(body)
        items = stack.server.runner.stream(session, request, {})
        seen: list[object] = []
        async for item in items:
            seen.append(item)
            if isinstance(item, TextDelta) and "<tool_call>" in item.text:
                break  # the writer fails here: the client is gone
        await items.aclose()

        assert len(stack.double.requests) == 1
        assert stack.double.requests[0].sampling_params["max_new_tokens"] == cut
        [turn] = session.tree.turns
        assert turn.finish_reason is FinishReason.ABORT
        assert list(session.tree.output_ids(turn)) == ids[:cut]
        assert turn.meta.malformed_tool_calls == 1
        lin = linearize(session.tree)
        assert lin.exclusions == (Exclusion(turn.id, LossReason.ABORTED, cut),)


class HeldParser:
    """The real parser, but ``parse_ids`` waits (in its worker thread) until released: a
    window in which the engine has answered and the turn is not recorded yet."""

    def __init__(self, inner: ReplyParser) -> None:
        self.inner = inner
        self.parsing = threading.Event()
        self.release = threading.Event()

    def stream(self) -> Any:
        return self.inner.stream()

    def parse_text(self, text: str) -> ParsedReply:
        return self.inner.parse_text(text)

    def parse_ids(self, output_ids: Sequence[int], vocabulary: Vocabulary) -> ParsedReply:
        self.parsing.set()
        self.release.wait(5)
        return self.inner.parse_ids(output_ids, vocabulary)


async def test_non_streaming_client_gone_after_the_engine_answered_still_records_the_turn(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    """A non-streaming handler cancelled (client disconnect) while the finished reply is being
    parsed: the engine's output is recorded as an aborted turn, not dropped."""
    reply = ScriptedReply(text="All done.")
    async with local_stack(
        [reply], tokenizer_cache=tokenizer_cache, vocabulary=qwen_vocabulary
    ) as stack:
        held = HeldParser(reply_parsers()([]))
        runner = TurnRunner(
            stack.server.config,
            stack.server.engine,
            stack.renderer,
            qwen_vocabulary,
            lambda _: held,
            stack.server.workers,
        )
        session = stack.server.sessions.open("gone-while-parsing")
        request = DIALECTS_BY_NAME["anthropic"].parse_request(minimal_body("anthropic", "Finish."))
        call = asyncio.ensure_future(runner.run(session, request, {}))
        await eventually(held.parsing.is_set, "the engine answered and parsing began")
        call.cancel()
        held.release.set()
        with pytest.raises(asyncio.CancelledError):
            await call

        [turn] = session.tree.turns
        assert turn.finish_reason is FinishReason.ABORT
        assert list(session.tree.output_ids(turn)) == stack.double.reply_ids(reply)
        assert turn.meta.request_id == stack.double.requests[0].rid
        lin = linearize(session.tree)
        assert lin.samples == ()
        assert lin.exclusions == (Exclusion(turn.id, LossReason.ABORTED, turn.output_length),)
