"""The check's recording proxy: answers pass through unchanged, and what the engine generated is
read back from its own bytes, whether it streamed cumulatively, incrementally or not at all."""

from __future__ import annotations

import pytest

from protocol_adapters import (
    AdapterError,
    GenerateRequest,
    SamplingParams,
    SGLangConfig,
    SGLangEngine,
    Vocabulary,
)
from protocol_adapters.testing import EngineDouble, ScriptedReply
from protocol_adapters.testing.stack import VocabularyTokenizer
from swe_rl.engine_recorder import EngineRecorder


@pytest.mark.parametrize("incremental", [True, False], ids=["incremental", "cumulative"])
async def test_every_generation_is_recorded_as_the_engine_sent_it(
    qwen_vocabulary: Vocabulary, incremental: bool
) -> None:
    reply = ScriptedReply(text="The fix is in calc.py.")
    tokenizer = VocabularyTokenizer(qwen_vocabulary)
    double = EngineDouble(
        tokenizer,
        lambda _: reply,
        logprob=lambda position, token: -0.5 - position / 64,
        incremental_streaming=incremental,
    )
    async with double, EngineRecorder(double.url) as recorder:
        direct = SGLangEngine(SGLangConfig(base_url=double.url))
        proxied = SGLangEngine(SGLangConfig(base_url=recorder.url))
        async with direct, proxied as engine:
            assert await engine.context_length() == await direct.context_length()
            sampling = SamplingParams(max_new_tokens=64)
            whole = await engine.generate(GenerateRequest((1, 2, 3), sampling))
            ids: list[int] = []
            logprobs: list[float] = []
            async for chunk in engine.stream(GenerateRequest((4, 5), sampling)):
                ids.extend(chunk.output_ids)
                logprobs.extend(chunk.output_logprobs)
            cut = await engine.generate(GenerateRequest((6,), SamplingParams(max_new_tokens=3)))
    first, streamed, short = recorder.replies()
    assert (first.input_ids, first.output_ids) == ((1, 2, 3), tuple(whole.output_ids))
    assert first.logprobs == tuple(whole.output_logprobs)
    assert (streamed.input_ids, streamed.output_ids, streamed.logprobs) == (
        (4, 5),
        tuple(ids),
        tuple(logprobs),
    )
    assert streamed.finish == first.finish == "stop"
    assert (len(short.output_ids), short.finish) == (3, "length")
    assert tuple(cut.output_ids) == short.output_ids
    assert [r.sampling_params["max_new_tokens"] for r in double.requests] == [64, 64, 3]


async def test_an_engine_that_is_gone_is_a_502_naming_it() -> None:
    recorder = EngineRecorder("http://127.0.0.1:9")
    async with recorder, SGLangEngine(SGLangConfig(base_url=recorder.url)) as engine:
        with pytest.raises(AdapterError, match=r"502.*the engine did not answer"):
            await engine.context_length()
    assert recorder.replies() == []
