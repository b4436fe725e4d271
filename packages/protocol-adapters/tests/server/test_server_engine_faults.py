"""Engine failures through the real server and the real SGLang client: down, hanging, erroring,
answering garbage. Each reaches the agent in its dialect's error shape (so its SDK retries or
fails as it would against the provider), a hanging generation is aborted on the engine, the
session's tree is left exactly as it was, and the next request is served.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from machine_load import slowdown
from server_clients import (
    DIALECTS,
    PATHS,
    Dialect,
    Kind,
    assert_error_body,
    assert_sdk_error,
    checked,
    minimal_body,
    raw_request,
    sdk_error_types,
    status_error,
)
from yarl import URL

from protocol_adapters._engine import SGLangConfig
from protocol_adapters._tokenizer import Vocabulary
from protocol_adapters.testing import Faults, Malformation
from trajectory_tree import FinishReason


def fast(url: str) -> SGLangConfig:
    """Short engine deadlines, so timeouts and stalls show within a test: an idle machine's,
    x slowdown(), as the good requests before and after a fault must fit in them too."""
    busy = slowdown()
    return SGLangConfig(
        base_url=url,
        request_timeout=0.5 * busy,
        stream_idle_timeout=0.5 * busy,
        abort_timeout=1.0 * busy,
    )


def closed_port() -> int:
    """A local port nothing listens on (bound once by us, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class Relay:
    """A TCP relay from a fixed local port to the engine double: the engine going away and
    coming back at the address the adapter was configured with, as across an engine restart."""

    def __init__(self) -> None:
        self.port = closed_port()
        self._target: URL | None = None
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    def config(self, double_url: str) -> SGLangConfig:
        """The adapter's engine config: the relay's address, forwarding to ``double_url``."""
        self._target = URL(double_url)
        return SGLangConfig(base_url=f"http://127.0.0.1:{self.port}", connect_timeout=1.0)

    async def up(self) -> None:
        self._server = await asyncio.start_server(self._connect, "127.0.0.1", self.port)

    async def down(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for writer in self._writers:
            writer.close()
        await self._server.wait_closed()
        self._server = None

    async def _connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._target is not None
        up_reader, up_writer = await asyncio.open_connection(self._target.host, self._target.port)
        self._writers.update((writer, up_writer))
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_engine_down_is_overloaded_and_served_once_it_is_back(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary, dialect: Dialect
) -> None:
    relay = Relay()
    await relay.up()  # the adapter learns the engine's context length when it starts
    try:
        async with checked(
            tokenizer_cache, qwen_vocabulary, dialect, seed=False, engine_config=relay.config
        ) as check:
            await check.seed()
            await relay.down()
            with pytest.raises(sdk_error_types(dialect)) as err:
                await check.client.post(minimal_body(dialect, "engine is down"))
            message = assert_sdk_error(dialect, err.value, "overloaded")
            assert "unreachable" in message
            assert status_error(err.value).response.headers["retry-after"] == "1"
            assert check.stack.double.aborts == []
            await relay.up()
            await check.after_refusal()
    finally:
        await relay.down()


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_engine_timeout_is_504_and_the_generation_is_aborted(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary, dialect: Dialect
) -> None:
    async with checked(
        tokenizer_cache,
        qwen_vocabulary,
        dialect,
        engine_config=fast,
    ) as check:
        double = check.stack.double
        double.faults = Faults(hang=True)
        with pytest.raises(sdk_error_types(dialect)) as err:
            await check.client.post(minimal_body(dialect, "hang"))
        assert "timed out" in assert_sdk_error(dialect, err.value, "timeout")
        assert double.aborts == [double.requests[-1].rid]
        assert check.session.in_flight == set()
        double.faults = Faults()
        await check.after_refusal(engine_calls=1)


ENGINE_ANSWERS: dict[str, tuple[Faults, Kind, str]] = {
    "http-500": (Faults(http_status=500), "api", "HTTP 500"),
    "http-503": (Faults(http_status=503), "overloaded", "HTTP 503"),
    "not-json": (Faults(malformed=Malformation.NOT_JSON), "api", "malformed"),
    "no-logprobs": (Faults(malformed=Malformation.MISSING_LOGPROBS), "api", "malformed"),
    "count-mismatch": (Faults(malformed=Malformation.COUNT_MISMATCH), "api", "malformed"),
    "dropped": (Faults(drop_after_chunks=0), "api", "connection to the engine lost"),
}


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("case", sorted(ENGINE_ANSWERS))
async def test_bad_engine_answers_are_errors_in_dialect_shape(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary, dialect: Dialect, case: str
) -> None:
    faults, kind, named = ENGINE_ANSWERS[case]
    async with checked(tokenizer_cache, qwen_vocabulary, dialect) as check:
        check.stack.double.faults = faults
        with pytest.raises(sdk_error_types(dialect)) as err:
            await check.client.post(minimal_body(dialect, case))
        assert named in assert_sdk_error(dialect, err.value, kind)
        check.stack.double.faults = Faults()
        await check.after_refusal(engine_calls=1)


async def drain(events: AsyncIterator[object]) -> None:
    async for _ in events:
        pass


STREAM_FAULTS: dict[str, tuple[Faults, Kind, str]] = {
    "http-500": (Faults(http_status=500), "api", "HTTP 500"),
    "hang": (Faults(hang=True), "timeout", "timed out"),
}


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("case", sorted(STREAM_FAULTS))
async def test_engine_failure_before_the_first_token_of_a_stream_is_an_http_error(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary, dialect: Dialect, case: str
) -> None:
    """A streamed request whose engine fails before producing anything gets a real HTTP status
    in the dialect's shape (not a 200 and an error event): that is what clients retry on."""
    faults, kind, named = STREAM_FAULTS[case]
    async with checked(
        tokenizer_cache,
        qwen_vocabulary,
        dialect,
        engine_config=fast,
    ) as check:
        double = check.stack.double
        double.faults = faults
        body = minimal_body(dialect, "streamed") | {"stream": True}
        answer = await raw_request(
            check.stack, PATHS[dialect], json.dumps(body).encode(), token=check.token
        )
        assert named in assert_error_body(dialect, answer.status, answer.body, kind)
        if case == "hang":
            assert double.aborts == [double.requests[-1].rid]
        double.faults = Faults()
        await check.after_refusal(engine_calls=1)


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_engine_failure_mid_stream_ends_it_with_the_dialects_error_event(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary, dialect: Dialect
) -> None:
    """Once tokens have streamed (200 sent), a lost engine connection ends the stream with the
    dialect's in-stream error, and the partial output is kept as an aborted turn."""
    async with checked(tokenizer_cache, qwen_vocabulary, dialect) as check:
        double = check.stack.double
        double.faults = Faults(drop_after_chunks=2)
        body = minimal_body(dialect, "streamed") | {"stream": True}
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                check.stack.server.url + PATHS[dialect],
                json=body,
                headers={"Authorization": f"Bearer {check.token}"},
            ) as response,
        ):
            assert response.status == 200
            text = await response.text()
        assert "connection to the engine lost" in text
        if dialect == "anthropic":
            assert "event: error" in text
        elif dialect == "openai_responses":
            assert "response.failed" in text
        last = check.session.tree.turns[-1]
        assert last.finish_reason is FinishReason.ABORT
        assert last.output_length == 2 * double.tokens_per_chunk
