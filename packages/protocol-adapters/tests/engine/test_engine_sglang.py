"""SGLangEngine against the SGLang-wire double over real HTTP on 127.0.0.1."""

from __future__ import annotations

import asyncio
import itertools
import random
import socket
from array import array
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from machine_load import slowdown
from transformers import PreTrainedTokenizerFast

from protocol_adapters._engine import (
    Engine,
    GenerateChunk,
    GenerateRequest,
    RoutingAsk,
    SamplingParams,
    SGLangConfig,
    SGLangEngine,
)
from protocol_adapters._engine.coalesce import MAX_JOINED_TOKENS
from protocol_adapters._engine.ids_json import STRIDE
from protocol_adapters._types import AdapterError, ErrorKind
from protocol_adapters.testing import EngineDouble, Faults, Malformation, ScriptedReply
from protocol_adapters.testing.engine_double import ROUTING_MALFORMATIONS
from trajectory_tree import FinishReason

FIXTURE = Path(__file__).parent.parent / "fixtures" / "small_tokenizer.json"

REPLY = ScriptedReply(
    reasoning="I should list the files first.",
    text="Listing files.",
    tool_calls=[("bash", {"cmd": "ls -la"})],
)


def logprob(position: int, token_id: int) -> float:
    return -(position + 1) / 64 - token_id / 1e6


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_file=str(FIXTURE))  # type: ignore[no-untyped-call]


@pytest.fixture
async def double(tokenizer: Any) -> AsyncIterator[EngineDouble]:
    async with EngineDouble(tokenizer, [REPLY] * 4, logprob=logprob) as running:
        yield running


def request(
    max_new_tokens: int = 256, routing_key: str | None = None, routed: RoutingAsk | None = None
) -> GenerateRequest:
    return GenerateRequest(
        input_ids=(5, 6, 7, 8),
        sampling=SamplingParams(max_new_tokens=max_new_tokens, temperature=0.7, top_p=0.95),
        routing_key=routing_key,
        routed_experts=routed,
    )


def engine_for(url: str, **config: Any) -> SGLangEngine:
    return SGLangEngine(SGLangConfig(base_url=url, **config))


async def collect(engine: SGLangEngine, req: GenerateRequest) -> list[GenerateChunk]:
    return [chunk async for chunk in engine.stream(req)]


async def collect_until_error(
    engine: SGLangEngine, req: GenerateRequest
) -> tuple[list[GenerateChunk], AdapterError]:
    chunks: list[GenerateChunk] = []
    try:
        async for chunk in engine.stream(req):
            chunks.append(chunk)  # noqa: PERF401 (the chunks before the error are the point)
    except AdapterError as error:
        return chunks, error
    raise AssertionError(f"stream ended normally after {len(chunks)} chunks")


def expected(double: EngineDouble, reply: ScriptedReply = REPLY) -> tuple[list[int], list[float]]:
    ids = double.reply_ids(reply)
    return ids, [logprob(i, t) for i, t in enumerate(ids)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# -- the happy paths -------------------------------------------------------------------------------


async def test_generate_returns_the_engines_ids_and_logprobs_exactly(double: EngineDouble) -> None:
    async with engine_for(double.url) as engine:
        assert isinstance(engine, Engine)
        req = request()
        result = await engine.generate(req)
    ids, logprobs = expected(double)
    assert list(result.output_ids) == ids
    assert list(result.output_logprobs) == logprobs
    assert result.finish_reason is FinishReason.STOP
    assert result.matched_stop == ids[-1]
    assert (result.prompt_tokens, result.completion_tokens) == (4, len(ids))
    assert result.weight_version == "default"
    assert result.rid == req.rid
    assert result.to_completion().output_ids == result.output_ids

    sent = double.requests[0]
    assert sent.rid == req.rid
    assert sent.input_ids == (5, 6, 7, 8)
    assert sent.body["return_logprob"] is True
    assert sent.body["logprob_start_len"] == -1
    assert sent.stream is False
    assert sent.sampling_params == {
        "max_new_tokens": 256,
        "temperature": 0.7,
        "top_p": 0.95,
        "top_k": -1,
        "min_p": 0.0,
        "skip_special_tokens": False,
        "spaces_between_special_tokens": False,
        "no_stop_trim": True,
    }


@pytest.mark.parametrize(
    ("incremental", "per_chunk"), [(False, 1), (False, 3), (True, 1), (True, 4)]
)
async def test_stream_yields_only_new_tokens_whatever_the_server_mode(
    tokenizer: Any, incremental: bool, per_chunk: int, caplog: pytest.LogCaptureFixture
) -> None:
    async with (
        EngineDouble(
            tokenizer,
            [REPLY],
            logprob=logprob,
            incremental_streaming=incremental,
            tokens_per_chunk=per_chunk,
        ) as double,
        engine_for(double.url) as engine,
    ):
        chunks = await collect(engine, request())
    ids, logprobs = expected(double)
    assert [t for c in chunks for t in c.output_ids] == ids
    assert [lp for c in chunks for lp in c.output_logprobs] == logprobs
    assert all(c.output_ids for c in chunks)  # events a read held together may be joined
    assert [c.finish_reason for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1].finish_reason is FinishReason.STOP
    assert [c.completion_tokens for c in chunks][-1] == len(ids)
    assert double.requests[0].stream is True
    assert double.aborts == []
    cumulative_warnings = [r for r in caplog.records if "cumulatively" in r.getMessage()]
    events = -(-len(ids) // per_chunk)
    assert len(cumulative_warnings) == (0 if incremental or events == 1 else 1)


async def test_events_one_read_holds_are_joined_into_few_chunks(tokenizer: Any) -> None:
    """An engine that ran ahead of the reader (the whole stream in one write): the tokens come
    out joined, exactly and in order, at most MAX_JOINED_TOKENS to a chunk."""
    long_reply = ScriptedReply(text="word " * 300)
    async with (
        EngineDouble(
            tokenizer,
            [long_reply],
            logprob=logprob,
            incremental_streaming=True,
            chunks_per_write=10_000,
        ) as double,
        engine_for(double.url) as engine,
    ):
        chunks = await collect(engine, request(max_new_tokens=1000))
    ids, logprobs = expected(double, long_reply)
    assert [t for c in chunks for t in c.output_ids] == ids
    assert [lp for c in chunks for lp in c.output_logprobs] == logprobs
    assert len(chunks) < len(ids) // 10
    assert all(0 < len(c.output_ids) <= MAX_JOINED_TOKENS for c in chunks)
    assert [c.completion_tokens for c in chunks] == list(
        itertools.accumulate(len(c.output_ids) for c in chunks)
    )
    assert [c.finish_reason for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1].finish_reason is FinishReason.STOP
    assert double.aborts == []


async def test_a_bad_event_after_good_ones_in_one_read_keeps_the_good_ones(
    tokenizer: Any,
) -> None:
    """The chunks before a malformed event of the same read are handed on before the error, as
    when each event came in a read of its own: the turn records what the engine did produce."""
    async with (
        EngineDouble(
            tokenizer,
            [REPLY],
            logprob=logprob,
            incremental_streaming=True,
            chunks_per_write=10_000,
            faults=Faults(malformed=Malformation.ROUTING_NEGATIVE),
        ) as double,
        engine_for(double.url) as engine,
    ):
        req = request(routed=RoutingAsk(2, 3, 2))
        chunks, error = await collect_until_error(engine, req)
    ids, _ = expected(double)
    assert [t for c in chunks for t in c.output_ids] == ids[:-1]
    assert MALFORMED_DETAIL[Malformation.ROUTING_NEGATIVE] in error.message
    assert double.aborts == [req.rid]


async def test_max_new_tokens_ends_with_length(double: EngineDouble) -> None:
    async with engine_for(double.url) as engine:
        result = await engine.generate(request(max_new_tokens=7))
        chunks = await collect(engine, request(max_new_tokens=7))
    ids, _ = expected(double)
    assert list(result.output_ids) == ids[:7]
    assert result.finish_reason is FinishReason.LENGTH
    assert [t for c in chunks for t in c.output_ids] == ids[:7]
    assert chunks[-1].finish_reason is FinishReason.LENGTH


async def test_routing_header_and_fresh_rids(double: EngineDouble) -> None:
    async with engine_for(double.url) as engine:
        await engine.generate(request(routing_key="session-abc"))
        await collect(engine, request(routing_key="session-abc"))
        await engine.generate(request())
    headers = [r.headers for r in double.requests]
    assert [h.get("x-smg-routing-key") for h in headers] == ["session-abc", "session-abc", None]
    assert len({r.rid for r in double.requests}) == 3


async def test_a_custom_routing_header_name(double: EngineDouble) -> None:
    async with engine_for(double.url, routing_header="X-Session") as engine:
        await engine.generate(request(routing_key="k"))
    assert double.requests[0].headers["x-session"] == "k"


async def test_script_abort_is_a_result_not_an_error(tokenizer: Any) -> None:
    aborted = ScriptedReply(text="partial", finish="abort")
    async with EngineDouble(tokenizer, [aborted]) as double, engine_for(double.url) as engine:
        result = await engine.generate(request())
    assert result.finish_reason is FinishReason.ABORT
    assert result.abort_message == "aborted by the script"
    assert list(result.output_ids) == double.reply_ids(aborted)


async def test_explicit_abort_reaches_the_engine(double: EngineDouble) -> None:
    async with engine_for(double.url) as engine:
        await engine.abort("some-rid")
    assert double.aborts == ["some-rid"]


async def test_structured_output_and_top_logprobs_reach_the_engine(tokenizer: Any) -> None:
    schema = '{"properties":{"title":{"type":"string"}},"type":"object"}'
    titled = ScriptedReply(text='{"title": "Fix the parser"}')
    req = GenerateRequest(
        (5, 6), SamplingParams(max_new_tokens=64, json_schema=schema), top_logprobs=2
    )
    async with (
        EngineDouble(tokenizer, [titled] * 2, logprob=logprob) as double,
        engine_for(double.url) as engine,
    ):
        result = await engine.generate(req)
        streamed = await collect(engine, req)
    sent = double.requests[0]
    assert sent.sampling_params["json_schema"] == schema
    assert sent.top_logprobs == 2
    ids, logprobs = expected(double, titled)
    for tops in (result.top_logprobs, tuple(t for c in streamed for t in c.top_logprobs)):
        assert len(tops) == len(ids)
        assert [top[0] for top in tops] == list(zip(ids, logprobs, strict=True))
        assert all(len(top) == 2 for top in tops)


async def test_context_length_is_read_from_server_info(tokenizer: Any) -> None:
    async with (
        EngineDouble(tokenizer, [], context_length=12288) as double,
        engine_for(double.url) as engine,
    ):
        assert await engine.context_length() == 12288
        double.report_context_length = False  # only max_req_input_len carries it then
        assert await engine.context_length() == 12288


async def test_context_length_from_a_release_before_the_server_info_rename() -> None:
    """Older SGLang answers only ``/get_server_info``: a 404 on ``/server_info`` is not fatal."""

    async def old_info(request: web.Request) -> web.StreamResponse:
        return web.json_response({"context_length": None, "max_req_input_len": 2047})

    app = web.Application()
    app.router.add_get("/get_server_info", old_info)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        async with engine_for(f"http://{host}:{port}") as engine:
            assert await engine.context_length() == 2048
    finally:
        await runner.cleanup()


async def test_context_length_of_an_engine_that_is_down_is_overloaded() -> None:
    async with engine_for(f"http://127.0.0.1:{free_port()}", connect_timeout=1.0) as engine:
        with pytest.raises(AdapterError) as caught:
            await engine.context_length()
    assert caught.value.kind is ErrorKind.OVERLOADED


# -- failures --------------------------------------------------------------------------------------


async def test_engine_down_is_overloaded_without_waiting() -> None:
    async with engine_for(f"http://127.0.0.1:{free_port()}") as engine:
        with pytest.raises(AdapterError) as generate_error:
            await engine.generate(request())
        with pytest.raises(AdapterError) as stream_error:
            await collect(engine, request())
    for error in (generate_error.value, stream_error.value):
        assert error.kind is ErrorKind.OVERLOADED
        assert "unreachable" in error.message


@pytest.mark.parametrize("streaming", [False, True])
async def test_http_500_is_an_engine_error_with_the_engines_message(
    double: EngineDouble, streaming: bool
) -> None:
    double.faults = Faults(http_status=500, error_message="CUDA error: an illegal memory access")
    async with engine_for(double.url) as engine:
        with pytest.raises(AdapterError) as caught:
            await (collect(engine, request()) if streaming else engine.generate(request()))
    assert caught.value.kind is ErrorKind.ENGINE_ERROR
    assert "HTTP 500" in caught.value.message
    assert "CUDA error: an illegal memory access" in caught.value.message
    assert double.aborts == []  # the engine never started it


@pytest.mark.parametrize(
    ("status", "kind"),
    [(400, ErrorKind.INVALID_REQUEST), (429, ErrorKind.RATE_LIMITED), (503, ErrorKind.OVERLOADED)],
)
async def test_other_statuses(double: EngineDouble, status: int, kind: ErrorKind) -> None:
    double.faults = Faults(http_status=status, error_message="nope")
    async with engine_for(double.url) as engine:
        with pytest.raises(AdapterError) as caught:
            await engine.generate(request())
    assert caught.value.kind is kind


@pytest.mark.parametrize("streaming", [False, True])
async def test_context_overflow_is_context_length(tokenizer: Any, streaming: bool) -> None:
    async with (
        EngineDouble(tokenizer, [REPLY], context_length=4) as double,
        engine_for(double.url) as engine,
    ):
        with pytest.raises(AdapterError) as caught:
            await (collect(engine, request()) if streaming else engine.generate(request()))
    assert caught.value.kind is ErrorKind.CONTEXT_LENGTH
    assert "longer than the model's context length" in caught.value.message


MALFORMED_DETAIL = {
    Malformation.NOT_JSON: "not JSON",
    Malformation.MISSING_LOGPROBS: "output_token_logprobs is missing",
    Malformation.COUNT_MISMATCH: "completion_tokens=",
    Malformation.NULL_LOGPROB: "has logprob None",
    Malformation.BAD_TOKEN_ID: "has token id '",
    Malformation.WRONG_RID: "meta_info.id is 'someone-else'",
    Malformation.ROUTING_COUNT: "meta_info.routed_experts holds 35 expert ids, not 36",
    Malformation.ROUTING_NEGATIVE: "meta_info.routed_experts holds a negative expert id",
    Malformation.ROUTING_BAD_BASE64: "meta_info.routed_experts is not base64",
    Malformation.ROUTING_UNASKED: "meta_info.routed_experts is present but was not asked for",
}


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("how", list(Malformation))
async def test_malformed_answers_are_engine_errors_naming_the_field(
    double: EngineDouble, how: Malformation, streaming: bool
) -> None:
    double.faults = Faults(malformed=how)
    asked = how in ROUTING_MALFORMATIONS and how is not Malformation.ROUTING_UNASKED
    async with engine_for(double.url) as engine:
        req = request(max_new_tokens=5, routed=RoutingAsk(2, 3, 2) if asked else None)
        with pytest.raises(AdapterError) as caught:
            await (collect(engine, req) if streaming else engine.generate(req))
    assert caught.value.kind is ErrorKind.ENGINE_ERROR
    assert req.rid in caught.value.message
    assert MALFORMED_DETAIL[how] in caught.value.message
    # a broken stream may leave the generation running: it is aborted; a whole answer is over
    assert double.aborts == ([req.rid] if streaming else [])


async def test_request_timeout_aborts_the_generation(tokenizer: Any) -> None:
    async with (
        EngineDouble(tokenizer, [REPLY], faults=Faults(hang=True)) as double,
        engine_for(double.url, request_timeout=0.3) as engine,
    ):
        req = request()
        with pytest.raises(AdapterError) as caught:
            await engine.generate(req)
        assert caught.value.kind is ErrorKind.TIMEOUT
        assert "request timeout" in caught.value.message
        assert double.aborts == [req.rid]


async def test_stream_idle_timeout_aborts_the_generation(tokenizer: Any) -> None:
    idle = 0.3 * slowdown()  # the first token comes within it, on a busy machine too
    async with (
        EngineDouble(tokenizer, [REPLY], faults=Faults(chunk_delay=max(5.0, 10 * idle))) as double,
        engine_for(double.url, stream_idle_timeout=idle) as engine,
    ):
        req = request()
        chunks, error = await collect_until_error(engine, req)
        assert error.kind is ErrorKind.TIMEOUT
        assert "idle" in error.message
        assert len(chunks) == 1  # the first token arrived, then the engine stalled
        assert double.aborts == [req.rid]


async def test_cancelling_a_stream_mid_way_aborts_and_reraises(tokenizer: Any) -> None:
    async with (
        EngineDouble(tokenizer, [REPLY], faults=Faults(chunk_delay=0.05)) as double,
        engine_for(double.url) as engine,
    ):
        req = request()
        first = asyncio.Event()

        async def consume() -> None:
            async for _ in engine.stream(req):
                first.set()

        task = asyncio.create_task(consume())
        await first.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert double.aborts == [req.rid]


async def test_cancelling_a_generate_aborts_and_reraises(tokenizer: Any) -> None:
    async with (
        EngineDouble(tokenizer, [REPLY], faults=Faults(hang=True)) as double,
        engine_for(double.url) as engine,
    ):
        req = request()
        task = asyncio.create_task(engine.generate(req))
        while not double.requests:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert double.aborts == [req.rid]


async def test_leaving_a_stream_early_aborts_it(tokenizer: Any) -> None:
    async with (
        EngineDouble(tokenizer, [REPLY], faults=Faults(chunk_delay=0.02)) as double,
        engine_for(double.url) as engine,
    ):
        req = request()
        stream = engine.stream(req)
        async for _ in stream:
            break
        await stream.aclose()  # type: ignore[attr-defined]
        assert double.aborts == [req.rid]


@pytest.mark.parametrize("streaming", [False, True])
async def test_dropped_connection_is_an_engine_error(double: EngineDouble, streaming: bool) -> None:
    double.faults = Faults(drop_after_chunks=2 if streaming else 0)
    async with engine_for(double.url) as engine:
        req = request()
        with pytest.raises(AdapterError) as caught:
            await (collect(engine, req) if streaming else engine.generate(req))
    assert caught.value.kind is ErrorKind.ENGINE_ERROR
    assert req.rid in caught.value.message
    assert double.aborts == [req.rid]  # the engine may still be generating: stop it


async def test_closing_the_engine_aborts_generations_still_running(tokenizer: Any) -> None:
    async with EngineDouble(tokenizer, [REPLY] * 2, faults=Faults(hang=True)) as double:
        engine = engine_for(double.url)
        generating = asyncio.create_task(engine.generate(request()))
        streaming = asyncio.create_task(collect(engine, request()))
        while len(double.requests) < 2:
            await asyncio.sleep(0.01)
        await engine.aclose()
        assert sorted(double.aborts) == sorted(r.rid for r in double.requests)
        result = await generating  # the engine finished it as aborted before the pool closed
        assert result.finish_reason is FinishReason.ABORT
        chunks = await streaming
        assert chunks[-1].finish_reason is FinishReason.ABORT


async def test_a_closed_engine_refuses_calls(double: EngineDouble) -> None:
    engine = engine_for(double.url)
    await engine.aclose()
    with pytest.raises(RuntimeError, match="closed"):
        await engine.generate(request())


# -- pooling and concurrency -----------------------------------------------------------------------


async def test_one_pooled_connection_serves_100_sequential_calls(tokenizer: Any) -> None:
    async with (
        EngineDouble(tokenizer, lambda ids: ScriptedReply(text="ok")) as double,
        engine_for(double.url) as engine,
    ):
        for _ in range(50):
            await engine.generate(request())
            await collect(engine, request())
    assert len(double.requests) == 100
    assert double.connection_count == 1


async def test_200_concurrent_generations_each_get_their_own_answer(tokenizer: Any) -> None:
    def answer(input_ids: Any) -> ScriptedReply:
        return ScriptedReply(text=f"request {input_ids[0]} answered")

    async with (
        EngineDouble(tokenizer, answer, logprob=logprob) as double,
        engine_for(double.url) as engine,
    ):
        requests = [
            GenerateRequest(input_ids=(n, 1, 2), sampling=SamplingParams(max_new_tokens=64))
            for n in range(200)
        ]
        results = await asyncio.gather(*(engine.generate(r) for r in requests))
    assert len({r.rid for r in results}) == 200
    for n, (req, result) in enumerate(zip(requests, results, strict=True)):
        ids = double.reply_ids(answer((n,)))
        assert result.rid == req.rid
        assert list(result.output_ids) == ids
        assert list(result.output_logprobs) == [logprob(i, t) for i, t in enumerate(ids)]
    assert double.connection_count <= 200


async def test_streams_return_their_connection_to_the_pool(tokenizer: Any) -> None:
    """The body's end may come after ``[DONE]``; the client waits for it (boundedly)."""
    async with (
        EngineDouble(
            tokenizer, lambda ids: ScriptedReply(text="ok"), faults=Faults(linger_after_done=0.05)
        ) as double,
        engine_for(double.url, abort_timeout=1.0) as engine,
    ):
        for _ in range(5):
            chunks = await collect(engine, request())
            assert chunks[-1].finish_reason is FinishReason.STOP
        assert double.connection_count == 1
        double.faults = Faults(linger_after_done=3.0)  # longer than the drain allows
        chunks = await collect(engine, request())
        assert chunks[-1].finish_reason is FinishReason.STOP
        assert double.aborts == []


async def test_a_growing_session_sends_every_id_and_encodes_only_the_new_ones(
    double: EngineDouble,
) -> None:
    """Three calls of one session, each prompt extending the last (the third streamed), one of
    another session between them: the engine receives every prompt exactly, and the session's
    later prompts reuse the text of the ids it already sent."""
    rng = random.Random(3)
    first = array("i", (rng.randrange(1, 400) for _ in range(3 * STRIDE + 10)))
    second = array("i", first)
    second.extend(rng.randrange(1, 400) for _ in range(STRIDE + 50))
    third = array("i", second)
    third.extend(rng.randrange(1, 400) for _ in range(20))
    other = array("i", (rng.randrange(1, 400) for _ in range(2 * STRIDE)))
    sampling = SamplingParams(max_new_tokens=8)
    async with engine_for(double.url) as engine:
        await engine.generate(GenerateRequest(first, sampling, routing_key="a"))
        await engine.generate(GenerateRequest(other, sampling, routing_key="b"))
        await engine.generate(GenerateRequest(second, sampling, routing_key="a"))
        await collect(engine, GenerateRequest(third, sampling, routing_key="a"))
        assert engine._ids_json.reused_ids == 3 * STRIDE + 4 * STRIDE
    sent = [list(r.input_ids) for r in double.requests]
    assert sent == [first.tolist(), other.tolist(), second.tolist(), third.tolist()]
