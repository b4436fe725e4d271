"""With a recorder, every answered model call's timing says what the adapter added before and
after the engine; the engine's own time is never counted as the adapter's, refused calls are not
recorded, and a stream the client leaves early is still aborted on the engine."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import anthropic
import pytest

from protocol_adapters._bridge.renderer import Renderer
from protocol_adapters._engine import SGLangConfig, SGLangEngine
from protocol_adapters._server.config import AdapterConfig
from protocol_adapters._server.ports import reply_parsers
from protocol_adapters._server.runner import AdapterServer
from protocol_adapters._server.timing import TimedEngine, TurnTimings
from protocol_adapters._template.template import qwen3_template
from protocol_adapters._tokenizer import Vocabulary
from protocol_adapters.testing import EngineDouble, Faults, ScriptedReply
from protocol_adapters.testing.stack import VocabularyTokenizer

LATENCY = 0.3
REPLY = ScriptedReply(text=" ".join(f"word{i}" for i in range(40)))


@asynccontextmanager
async def timed_server(
    vocabulary: Vocabulary, timings: TurnTimings | None, faults: Faults
) -> AsyncIterator[tuple[AdapterServer, EngineDouble]]:
    async with (
        EngineDouble(VocabularyTokenizer(vocabulary), lambda ids: REPLY, faults=faults) as double,
        SGLangEngine(SGLangConfig(double.url)) as engine,
        AdapterServer(
            AdapterConfig(),
            engine,
            Renderer(vocabulary, qwen3_template()),
            vocabulary,
            reply_parsers(),
            timings=timings,
        ) as server,
    ):
        yield server, double


@pytest.mark.parametrize("stream", [False, True])
async def test_each_answered_call_is_timed_around_the_engine(
    qwen_vocabulary: Vocabulary, stream: bool
) -> None:
    timings = TurnTimings()
    async with timed_server(qwen_vocabulary, timings, Faults(latency=LATENCY)) as (server, _):
        token = server.sessions.open("timed").token
        async with anthropic.AsyncAnthropic(
            base_url=server.url, api_key=token, max_retries=0
        ) as client:
            for turn in range(3):
                body: anthropic.types.MessageParam = {"role": "user", "content": f"turn {turn}"}
                if stream:
                    async with client.messages.stream(
                        model="p", max_tokens=128, messages=[body]
                    ) as events:
                        await events.get_final_message()
                else:
                    await client.messages.create(model="p", max_tokens=128, messages=[body])
            with pytest.raises(anthropic.BadRequestError):  # refused: never reaches the engine
                await client.messages.create(model="p", max_tokens=128, messages=[])
    assert len(timings.turns) == 3
    for timing in timings.turns:
        assert (timing.dialect, timing.stream) == ("anthropic", stream)
        assert timing.received <= timing.body_read <= timing.engine_called
        assert timing.engine_called <= timing.engine_done <= timing.flushed
        assert timing.engine_done - timing.engine_called >= LATENCY  # the engine's, not ours
        total = timing.flushed - timing.received
        assert timing.added == pytest.approx(total - (timing.engine_done - timing.engine_called))
        assert timing.processing == pytest.approx(timing.added - timing.reading_body)


async def test_without_a_recorder_the_engine_is_not_wrapped(qwen_vocabulary: Vocabulary) -> None:
    async with timed_server(qwen_vocabulary, None, Faults()) as (server, _):
        assert server.timings is None
        assert not isinstance(server.runner._engine, TimedEngine)


async def test_a_timed_stream_left_early_is_still_aborted_on_the_engine(
    qwen_vocabulary: Vocabulary,
) -> None:
    timings = TurnTimings()
    faults = Faults(chunk_delay=0.05)
    async with timed_server(qwen_vocabulary, timings, faults) as (server, double):
        token = server.sessions.open("left").token
        body = {
            "model": "p",
            "max_tokens": 128,
            "stream": True,
            "messages": [{"role": "user", "content": "go"}],
        }
        async with aiohttp.ClientSession() as http:
            response = await http.post(
                f"{server.url}/v1/messages", json=body, headers={"x-api-key": token}
            )
            assert response.status == 200
            await response.content.readany()
            response.close()
        for _ in range(100):
            if double.aborts:
                break
            await asyncio.sleep(0.03)
    assert double.aborts == [double.requests[0].rid]
    assert list(timings.turns) == []  # not answered: not timed


async def test_a_body_that_arrives_slowly_is_timed_as_reading_it(
    qwen_vocabulary: Vocabulary,
) -> None:
    timings = TurnTimings()
    pause = 0.3
    body = json.dumps(
        {"model": "p", "max_tokens": 16, "messages": [{"role": "user", "content": "slowly"}]}
    ).encode()

    async def in_two_parts() -> AsyncIterator[bytes]:
        yield body[:10]
        await asyncio.sleep(pause)  # a relay or a client that is slow to send the rest
        yield body[10:]

    async with timed_server(qwen_vocabulary, timings, Faults()) as (server, _):
        token = server.sessions.open("slow").token
        headers = {"x-api-key": token, "content-type": "application/json"}
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{server.url}/v1/messages", data=in_two_parts(), headers=headers) as r,
        ):
            assert r.status == 200, await r.text()
    (timing,) = timings.turns
    assert timing.reading_body >= pause
    assert timing.before_engine - timing.reading_body == pytest.approx(
        timing.engine_called - timing.body_read
    )
