"""A weight update in the middle of an episode, through the real generate path.

The engine double aborts the episode's running generation to load version ``"1"`` (SGLang's
abort-mode update, what slime does between rollout steps under asynchronous training). The
adapter records the partial output as an aborted turn and answers the agent with a retryable
error; the agent's SDK retries and the episode goes on under the new weights. With slime's
routing replay on, every call captures routing. What slime gets must show: the episode is not
lost, the aborted prefix trains nothing, the sample's versions span both, its routing rows are
the engine's, and a staleness policy of span 0 masks the turns of the old weights.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import numpy
import pytest
from rollout_kit import (
    AgentModel,
    base_group,
    engine_outputs,
    scripted_episode,
)

from protocol_adapters import Vocabulary
from protocol_adapters.testing import EngineDouble, Faults, ScriptedReply
from protocol_adapters.testing.stack import VocabularyTokenizer
from slime_backend import (
    AgentSettings,
    BackendSettings,
    ConversionOptions,
    EpisodeSettings,
    GateConfig,
    StaleAction,
    StalenessPolicy,
)
from slime_backend.gate_hook import check_rollout_batch
from slime_backend.generate import make_generate
from slime_backend.testing import StandInSample, slime_args, slime_sampling_params

LAYERS, TOPK = 3, 2
STALE_TEXT = "These words come from the old weights and are cut off by the update. " * 4


def logprob(position: int, token: int) -> float:
    return -((position * 7 + token) % 50) / 16 - 0.001


@pytest.fixture
async def engine(qwen_vocabulary: Vocabulary) -> AsyncIterator[tuple[EngineDouble, AgentModel]]:
    agent = AgentModel(qwen_vocabulary)

    def script(input_ids: Sequence[int]) -> ScriptedReply:
        reply = agent(input_ids)
        if len(double.requests) == 2:  # the call the update will abort says something else
            return ScriptedReply(text=STALE_TEXT, tool_calls=reply.tool_calls)
        return reply

    async with EngineDouble(
        VocabularyTokenizer(qwen_vocabulary),
        script,
        logprob=logprob,
        incremental_streaming=True,
        routed_layers=LAYERS,
        routed_topk=TOPK,
    ) as double:
        agent.double = double
        yield double, agent


async def episode_across_an_update(
    double: EngineDouble, checkpoint: Path, policy: StalenessPolicy
) -> tuple[list[StandInSample], Any]:
    """One episode; its second call is aborted by ``update_weights("1", mode="abort")``."""
    settings = BackendSettings(
        EpisodeSettings("rollout_kit.generate", wall_clock_s=60.0, max_turns=20, grace_s=30.0),
        AgentSettings("scripted"),
        conversion=ConversionOptions(staleness=policy),
        gates=GateConfig(fail_step=False),
    )
    args = slime_args(
        double.url,
        checkpoint,
        settings,
        use_rollout_routing_replay=True,
        num_layers=LAYERS,
        moe_router_topk=TOPK,
    )
    generate = make_generate(scripted_episode, sample_class=StandInSample)
    (base,) = base_group(0, 1, 0, [{"reward": 1.0, "retries": 2, "stream": True}])
    base.session_id = "across-an-update"
    double.faults = Faults(chunk_delay=0.03)  # slow enough to be caught mid-stream
    try:
        running = asyncio.create_task(generate(args, base, slime_sampling_params(args)))
        async with asyncio.timeout(30):
            while len(double.requests) < 2:
                await asyncio.sleep(0.01)
            await double.wait_for_tokens(3)
        await double.update_weights("1", mode="abort")
        double.faults = Faults()
        samples = await running
    finally:
        await generate.aclose()
    return samples, args


@pytest.mark.parametrize("span", [1, 0])
async def test_an_update_mid_episode_loses_nothing_and_trains_no_aborted_token(
    engine: tuple[EngineDouble, AgentModel], qwen_checkpoint: Path, span: int
) -> None:
    double, agent = engine
    policy = StalenessPolicy(span, StaleAction.MASK)
    samples, args = await episode_across_an_update(double, qwen_checkpoint, policy)

    (sample,) = samples
    assert sample.status is StandInSample.Status.COMPLETED  # the SDK retried: not lost
    episode = sample.metadata["agent_rl"]["episode"]
    assert episode["reward"] == 1.0
    assert double.weight_updates == [("1", "abort")]
    assert episode["aborted_turns"] == 1
    (aborted,) = [e for e in episode["exclusions"] if e["reason"] == "aborted"]

    # The aborted call's output is on a branch of its own that trains nothing; the retry of
    # the same prompt is what the sample trains, whole, with the engine's logprobs.
    record = sample.metadata["agent_rl"]["sample"]
    assert aborted["turn"] not in record["trained_turns"] + record["context_turns"]
    stale_ids = double.reply_ids(ScriptedReply(text=STALE_TEXT))[:3]
    assert not any(sample.tokens[i : i + 3] == stale_ids for i in range(len(sample.tokens) - 2))
    assert_trained_runs_are_the_engines(sample, double, agent)

    # Versions: the first call on the old weights, the retry and the last call on the new.
    assert episode["weights"]["versions"] == ["default", "1"]
    assert sample.rollout_routed_experts is not None
    mask = sample.loss_mask
    assert mask is not None
    first_output = len(engine_outputs(double, agent)[min(agent.replies, key=len)][0])
    if span == 1:
        assert sample.weight_versions == ["default", "1", "1"]
        assert record["versions"] == {
            "oldest": "default",
            "newest": "1",
            "span": 1,
            "max_lag": 1,
            "runs": 3,
        }
        assert mask[:first_output] == [1] * first_output
    else:  # the old weights' turn is masked: the sample trains only version "1"
        assert sample.weight_versions == ["1", "1"]
        assert record["stale_turns"] == [0]
        assert record["versions"]["span"] == record["versions"]["max_lag"] == 0
        assert mask[:first_output] == [0] * first_output
        assert record["masked_tokens"]["stale_weight_version"] == first_output
    assert sum(mask) == record["trained_tokens"] > 0

    # Routing replay: one row per token but the last, each the engine's for that position.
    experts = sample.rollout_routed_experts
    assert isinstance(experts, numpy.ndarray)
    assert experts.dtype == numpy.int32
    assert experts.shape == (len(sample.tokens) - 1, LAYERS, TOPK)
    expected = numpy.frombuffer(double.expected_routing(sample.tokens, 0), dtype=numpy.int32)
    assert experts.tolist() == expected.reshape(-1, LAYERS, TOPK).tolist()
    assert episode["routing"]["refused"] == []

    # The rollout's metrics: one sample, spanning both versions unless masked.
    check_rollout_batch(args, [[samples]])
    metrics = sample.metadata["agent_rl"]["weight_versions"]
    assert metrics["newest"] == "1"
    assert metrics["multi_version_share"] == (1.0 if span == 1 else 0.0)
    assert metrics["lag_histogram"] == ({"1": 1} if span == 1 else {"0": 1})
    assert sample.metadata["agent_rl"]["gates"]["routing_missing"]["offending"] == 0


def assert_trained_runs_are_the_engines(
    sample: StandInSample, double: EngineDouble, agent: AgentModel
) -> None:
    """Every run of trained tokens is the output the engine finished for the prompt before it
    (the retry's, never the aborted call's), with its logprobs."""
    outputs = engine_outputs(double, agent)
    mask, logprobs = sample.loss_mask, sample.rollout_log_probs
    assert mask is not None
    assert logprobs is not None
    start = len(sample.tokens) - sample.response_length
    position, runs = 0, 0
    while position < len(mask):
        if not mask[position]:
            position += 1
            continue
        end = position
        while end < len(mask) and mask[end]:
            end += 1
        ids, engine_logprobs = outputs[tuple(sample.tokens[: start + position])]
        assert sample.tokens[start + position : start + end] == ids
        assert logprobs[position:end] == engine_logprobs
        position, runs = end, runs + 1
    assert runs >= 2
