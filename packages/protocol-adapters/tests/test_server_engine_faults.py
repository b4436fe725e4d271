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
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
from yarl import URL

from protocol_adapters.engine import SGLangConfig
from protocol_adapters.testing import Faults, Malformation
from protocol_adapters.tokenizer import Vocabulary
from trajectory_tree import FinishReason

from .server_clients import (
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
)

FAST = {"request_timeout": 0.5, "stream_idle_timeout": 0.5, "abort_timeout": 1.0}


def closed_port() -> int:
    """A local port nothing listens on (bound once by us, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@asynccontextmanager
async def relay(port: int, target: str) -> AsyncIterator[None]:
    """A TCP relay from ``port`` to ``target``: the engine coming back at the address the
    adapter was configured with, as after an engine restart."""
    upstream = URL(target)
    writers: set[asyncio.StreamWriter] = set()

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(upstream.host, upstream.port)
        writers.update((writer, up_writer))
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    server = await asyncio.start_server(connect, "127.0.0.1", port)
    try:
        yield
    finally:
        server.close()
        for writer in writers:
            writer.close()
        await server.wait_closed()


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_engine_down_is_overloaded_and_served_once_it_is_back(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary, dialect: Dialect
) -> None:
    port = closed_port()
    engine_url = f"http://127.0.0.1:{port}"
    async with checked(
        tokenizer_cache,
        qwen_vocabulary,
        dialect,
        seed=False,
        engine_config=lambda _: SGLangConfig(base_url=engine_url, connect_timeout=1.0),
    ) as check:
        async with relay(port, check.stack.double.url):
            await check.seed()
        with pytest.raises(sdk_error_types(dialect)) as err:
            await check.client.post(minimal_body(dialect, "engine is down"))
        message = assert_sdk_error(dialect, err.value, "overloaded")
        assert "unreachable" in message
        assert err.value.response.headers["retry-after"] == "1"
        assert check.stack.double.aborts == []
        async with relay(port, check.stack.double.url):
            await check.after_refusal()


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_engine_timeout_is_504_and_the_generation_is_aborted(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary, dialect: Dialect
) -> None:
    async with checked(
        tokenizer_cache,
        qwen_vocabulary,
        dialect,
        engine_config=lambda url: SGLangConfig(base_url=url, **FAST),
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
        engine_config=lambda url: SGLangConfig(base_url=url, **FAST),
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
