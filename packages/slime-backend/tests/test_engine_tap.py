"""The engine tap between the adapter and slime's router, over the real SGLang client and the
engine double (SGLang's wire): routing keys swapped, engine faults told from request faults."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from protocol_adapters import (
    AdapterError,
    ErrorKind,
    GenerateRequest,
    SamplingParams,
    SGLangConfig,
    SGLangEngine,
    Vocabulary,
)
from protocol_adapters.testing import EngineDouble, Faults, ScriptedReply
from protocol_adapters.testing.stack import VocabularyTokenizer
from slime_backend._engine_tap import EngineTap

REPLIES = {"ok": ScriptedReply(text="fine"), "abort": ScriptedReply(text="cut", finish="abort")}
NEXT: dict[str, str] = {}
"""Which of :data:`REPLIES` the double gives next."""


@pytest.fixture
async def stack(
    qwen_vocabulary: Vocabulary,
) -> AsyncIterator[tuple[EngineDouble, EngineTap]]:
    NEXT["reply"] = "ok"
    double = EngineDouble(
        VocabularyTokenizer(qwen_vocabulary), lambda _: REPLIES[NEXT["reply"]], context_length=64
    )
    async with double, SGLangEngine(SGLangConfig(base_url=double.url, connect_timeout=1)) as sg:
        yield double, EngineTap(sg)


def request(routing_key: str, length: int = 4) -> GenerateRequest:
    return GenerateRequest(tuple(range(1, length + 1)), SamplingParams(8), routing_key=routing_key)


async def test_a_registered_session_keeps_its_routing_key_and_counts_engine_faults(
    stack: tuple[EngineDouble, EngineTap],
) -> None:
    double, tap = stack
    record = tap.register("slime-session-1")
    await tap.generate(request("slime-session-1"))
    chunks = [c async for c in tap.stream(request("slime-session-1"))]
    assert chunks[-1].finish_reason is not None
    assert [r.headers["x-smg-routing-key"] for r in double.requests] == ["slime-session-1"] * 2
    assert (record.calls, record.failures, record.last_call_failed) == (2, 0, False)

    double.faults = Faults(http_status=500, error_message="CUDA error")
    with pytest.raises(AdapterError):
        await tap.generate(request("slime-session-1"))
    assert record.last_call_failed
    assert "CUDA error" in record.last_failure

    double.faults = Faults()
    NEXT["reply"] = "abort"
    async for _ in tap.stream(request("slime-session-1")):
        pass
    assert record.failures == 2
    assert record.last_failure.startswith("the engine aborted the generation")

    NEXT["reply"] = "ok"
    await tap.generate(request("slime-session-1"))
    # The agent got its answer after all; the failures stay counted.
    assert (record.last_call_failed, record.failures) == (False, 2)


async def test_a_refused_request_is_not_an_engine_fault(
    stack: tuple[EngineDouble, EngineTap],
) -> None:
    _, tap = stack
    record = tap.register("k")
    record.failed("earlier outage")
    with pytest.raises(AdapterError) as raised:
        await tap.generate(request("k", length=100))  # over the double's 64-token context
    assert raised.value.kind is not ErrorKind.ENGINE_ERROR
    assert not record.last_call_failed
    assert record.failures == 1


async def test_unregistered_calls_pass_through_untouched(
    stack: tuple[EngineDouble, EngineTap],
) -> None:
    double, tap = stack
    record = tap.register("k")
    tap.release("k")
    await tap.generate(request("k"))
    assert double.requests[-1].headers["x-smg-routing-key"] == "k"
    assert record.calls == 0
    assert await tap.context_length() == 64


async def test_an_episode_is_held_to_its_generation_budget_across_concurrent_calls(
    stack: tuple[EngineDouble, EngineTap],
) -> None:
    """Each call's cap is cut to what the episode has left (calls still generating count at
    their caps); with nothing left a call is refused as rate-limited before the engine."""
    double, tap = stack
    REPLIES["long"] = ScriptedReply(text="word " * 40)
    NEXT["reply"] = "long"
    record = tap.register("budgeted", max_new_tokens=20)
    await tap.generate(request("budgeted"))  # 8 of 20
    streaming = tap.stream(request("budgeted"))
    first = await anext(streaming)  # reserves 8 while it generates
    assert first.output_ids
    await tap.generate(request("budgeted"))  # only 20 - 8 - 8 = 4 left
    async for _ in streaming:
        pass
    assert [r.sampling_params["max_new_tokens"] for r in double.requests] == [8, 8, 4]
    assert (record.generated, record.reserved, record.calls) == (20, 0, 3)
    with pytest.raises(AdapterError, match="generation budget is used up") as raised:
        await tap.generate(request("budgeted"))
    assert raised.value.kind is ErrorKind.RATE_LIMITED
    with pytest.raises(AdapterError, match="generation budget is used up"):
        async for _ in tap.stream(request("budgeted")):
            pass
    assert len(double.requests) == 3
    assert (record.failures, record.calls) == (0, 3)
    unbudgeted = tap.register("free")
    await tap.generate(request("free"))
    assert (unbudgeted.generated, double.requests[-1].sampling_params["max_new_tokens"]) == (8, 8)
