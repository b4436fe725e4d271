"""Our hooks inside slime's real rollout code: a training step's rollout, gates that stop it.

slime's ``generate_rollout`` (``slime/rollout/sglang_rollout.py`` at the pinned commit, read from
the slime checkout ``AGENT_RL_SLIME_CHECKOUT`` names, as the contract checkout tests do, and
skipped without one; ``slime_rollout.py`` says what stands in for the GPU stack) drives our
generate function on its own loop thread, calls our dynamic-sampling filter on each finished
group and our gate hook on the finished batch. Real parts otherwise as in ``test_generate.py``:
the adapter, the Qwen3 tokenizer and template, the SGLang client, the ``anthropic`` SDK as the
agent's client, the engine double on the test's loop.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from rollout_kit import AgentModel
from slime_rollout import CHECKOUT, SlimeRollout, TaskSource, rollout_args

from protocol_adapters import Vocabulary
from protocol_adapters.testing import EngineDouble
from protocol_adapters.testing.stack import VocabularyTokenizer
from slime_backend import (
    NAMESPACE,
    AgentSettings,
    BackendSettings,
    ConfigError,
    ConversionOptions,
    EpisodeSettings,
    GateConfig,
    SilentFailureAlarm,
)
from slime_backend.testing import StandInSample
from trajectory_tree import LengthMode

pytestmark = [
    pytest.mark.slime_checkout,
    pytest.mark.skipif(
        not CHECKOUT,
        reason="runs slime's rollout code: set AGENT_RL_SLIME_CHECKOUT to a slime checkout",
    ),
]

OUR_FILTER = "slime_backend.dynamic_filter.check_reward_nonzero_std"


def logprob(position: int, token: int) -> float:
    return -((position * 7 + token) % 50) / 16 - 0.001


def settings(**changes: Any) -> BackendSettings:
    return BackendSettings(
        EpisodeSettings("app_rollout.generate", wall_clock_s=60.0, max_turns=20, grace_s=30.0),
        AgentSettings("scripted"),
        **changes,
    )


@pytest.fixture
async def model(qwen_vocabulary: Vocabulary) -> AsyncIterator[tuple[EngineDouble, AgentModel]]:
    agent = AgentModel(qwen_vocabulary)
    async with EngineDouble(
        VocabularyTokenizer(qwen_vocabulary), agent, logprob=logprob, incremental_streaming=True
    ) as double:
        agent.double = double
        yield double, agent


@pytest.fixture
async def slime() -> AsyncIterator[SlimeRollout]:
    rollout = SlimeRollout()
    yield rollout
    await asyncio.to_thread(rollout.close)


async def step(slime: SlimeRollout, args: Any, source: TaskSource) -> Any:
    """One training step's rollout, as slime's RolloutManager asks for it (rollout id 0); slime
    blocks its caller on its own loop thread, so the test's loop stays free for the engine."""
    return await asyncio.to_thread(slime.generate_rollout, args, 0, source)


def results_of(output: Any) -> list[list[StandInSample]]:
    return [result for group in output.samples for result in group]


async def test_a_step_runs_through_slimes_rollout_with_the_gates_passing(
    model: tuple[EngineDouble, AgentModel], slime: SlimeRollout, qwen_checkpoint: Path
) -> None:
    double, _ = model
    args = rollout_args(double.url, qwen_checkpoint, settings(), n_samples_per_prompt=2)
    payloads = [[{"reward": 1.0}, {"reward": 0.0, "subagent": True}]]
    output = await step(slime, args, TaskSource(args, payloads))
    assert len(output.samples) == args.rollout_batch_size
    assert all(len(group) == 2 for group in output.samples)
    for result in results_of(output):
        assert isinstance(result, list)  # one generate call, one list: fan-out
        record = result[0].metadata[NAMESPACE]
        assert len(result) == (2 if record["episode"]["reward"] == 0.0 else 1)
        gates = record["gates"]
        assert not any(mark["tripped"] for mark in gates.values())
        assert gates["zero_trainable"]["episodes"] == 4
    assert output.metrics == {}


async def test_a_step_that_would_train_nothing_stops_inside_slimes_rollout(
    model: tuple[EngineDouble, AgentModel], slime: SlimeRollout, qwen_checkpoint: Path
) -> None:
    """Every episode graded, every sample longer than the length limit and dropped: the gates
    raise out of slime's generate_rollout, so the step never trains, and the alarm says why."""
    double, _ = model
    drop = ConversionOptions(max_sample_tokens=10, length_mode=LengthMode.DROP)
    args = rollout_args(double.url, qwen_checkpoint, settings(conversion=drop))
    with pytest.raises(SilentFailureAlarm) as raised:
        await step(slime, args, TaskSource(args, [[{"reward": 1.0}]]))
    tripped = {r.name: r for r in raised.value.report.tripped}
    assert set(tripped) == {"zero_trainable", "length_drops"}
    assert tripped["zero_trainable"].causes == (("nothing_trainable", 8),)
    assert "length_drop: every trained token was past the sample length limit" in (
        tripped["zero_trainable"].example
    )
    assert "length_drops: 8/8 episodes (100%) > limit 20%" in str(raised.value)


async def test_a_step_whose_episodes_abort_stops_inside_slimes_rollout(
    slime: SlimeRollout, qwen_checkpoint: Path
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens here once the probe closes
    args = rollout_args(f"http://127.0.0.1:{port}", qwen_checkpoint, settings())
    with pytest.raises(SilentFailureAlarm) as raised:
        await step(slime, args, TaskSource(args, [[{"reward": 1.0}]]))
    tripped = {r.name: r for r in raised.value.report.tripped}
    assert set(tripped) == {"zero_trainable", "aborts"}
    assert (tripped["aborts"].offending, tripped["aborts"].episodes) == (8, 8)
    assert f"router at http://127.0.0.1:{port} did not answer" in tripped["aborts"].example


async def test_fail_step_false_lets_the_step_train_and_says_so(
    model: tuple[EngineDouble, AgentModel],
    slime: SlimeRollout,
    qwen_checkpoint: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    double, _ = model
    drop = ConversionOptions(max_sample_tokens=10, length_mode=LengthMode.DROP)
    gates = GateConfig(fail_step=False)
    args = rollout_args(double.url, qwen_checkpoint, settings(conversion=drop, gates=gates))
    with caplog.at_level(logging.WARNING, logger="slime_backend"):
        output = await step(slime, args, TaskSource(args, [[{"reward": 1.0}]]))
    marks = results_of(output)[0][0].metadata[NAMESPACE]["gates"]
    assert marks["zero_trainable"]["tripped"]
    assert "SILENT-FAILURE GATE TRIPPED" in caplog.text
    assert "fail_step = false, so this step trains anyway" in caplog.text


async def test_the_fan_out_filter_drops_groups_of_equal_rewards_in_slimes_rollout(
    model: tuple[EngineDouble, AgentModel], slime: SlimeRollout, qwen_checkpoint: Path
) -> None:
    """slime samples two prompts for a batch of one. The first to finish (all rewards 1.0) is
    dropped through slime's call_dynamic_filter, which counts it in its metrics by our reason
    (our filter returns slime's own DynamicFilterOutput); the second (1.0 and 0.0) fills the
    batch."""
    double, _ = model
    args = rollout_args(
        double.url,
        qwen_checkpoint,
        settings(),
        rollout_batch_size=1,
        over_sampling_batch_size=2,
        n_samples_per_prompt=2,
        dynamic_sampling_filter_path=OUR_FILTER,
    )
    payloads = [
        [{"reward": 1.0}, {"reward": 1.0, "subagent": True}],
        [{"reward": 1.0, "sleep_s": 4.0}, {"reward": 0.0, "sleep_s": 4.0}],
    ]
    output = await step(slime, args, TaskSource(args, payloads))
    assert output.metrics == {"rollout/dynamic_filter/drop_zero_std_1.0": 1}
    ((first, second),) = output.samples
    rewards = {first[0].reward, second[0].reward}
    assert rewards == {1.0, 0.0}


async def test_slimes_own_filter_is_refused_at_the_first_generate_call(
    model: tuple[EngineDouble, AgentModel], slime: SlimeRollout, qwen_checkpoint: Path
) -> None:
    """A run launched without SlimeRunner (slime's own script) with slime's DAPO filter: the
    generate function refuses it by name before any episode runs, and slime's rollout fails."""
    double, _ = model
    slime.load_filters()  # slime imports the filter before it starts the rollout
    path = "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std"
    args = rollout_args(double.url, qwen_checkpoint, settings(), dynamic_sampling_filter_path=path)
    with pytest.raises(ConfigError, match=r"^args\.dynamic_sampling_filter_path: .*crashes"):
        await step(slime, args, TaskSource(args, [[{"reward": 1.0}]]))
    assert double.requests == []


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"group_rm": True}, r"^args\.group_rm: slime's --group-rm is not supported"),
        ({"partial_rollout": True}, r"^args\.partial_rollout: slime's --partial-rollout"),
        ({"rollout_sample_filter_path": None}, r"^args\.rollout_sample_filter_path: .*gate_hook"),
    ],
)
async def test_what_cannot_be_served_is_refused_inside_slimes_rollout(
    model: tuple[EngineDouble, AgentModel],
    slime: SlimeRollout,
    qwen_checkpoint: Path,
    change: dict[str, object],
    message: str,
) -> None:
    double, _ = model
    args = rollout_args(double.url, qwen_checkpoint, settings(), **change)
    with pytest.raises(ConfigError, match=message):
        await step(slime, args, TaskSource(args, [[{"reward": 1.0}]]))
    assert double.requests == []


async def test_slimes_own_filter_does_crash_on_our_results(slime: SlimeRollout) -> None:
    """Why it is refused: slime's check_reward_nonzero_std reads each result as a sample."""
    filters = slime.load_filters()
    group = [[StandInSample(index=0, group_index=0, reward=1.0)]]
    with pytest.raises(AttributeError, match="'list' object has no attribute 'get_reward_value'"):
        filters.check_reward_nonzero_std(object(), group)
