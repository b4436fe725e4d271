"""DAPO's dynamic sampling under fan-out: a group is judged by its episodes, each counted once.

slime hands the filter one group's generate results: lists of samples from our generate function
(one per branch of the episode), plain samples from another. These are converted episodes
(``episode_samples``), aborted placeholders and untrainable ones included. Inside slime's own
rollout code the filter is exercised by ``test_slime_rollout.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from episode_kit import Recorder, base_sample, fan_out, system, user

from slime_backend import ConversionOptions, EpisodeOutcome, episode_samples
from slime_backend._fan_out import FAN_OUT_AWARE, check_slime_args
from slime_backend.dynamic_filter import (
    check_reward_nonzero_std,
    check_reward_nonzero_std_with_fallback,
)
from slime_backend.testing import StandInFilterOutput, StandInSample
from trajectory_tree import LengthMode

CONTRACT = json.loads(
    (Path(__file__).resolve().parent / "data" / "slime_contract.json").read_text()
)
ARGS = SimpleNamespace(reward_key=None)


def episode(
    index: int, outcome: EpisodeOutcome, *, branches: bool = True, **options: Any
) -> list[StandInSample]:
    """One converted episode of group 0: a fan-out (several samples) or a single turn."""
    rec = fan_out(Recorder(seed=index)) if branches else Recorder(seed=index)
    if not branches:
        rec.turn([system("s"), user("task")], "x" * 50)
    return episode_samples(
        rec.tree,
        base_sample(index=index, group_index=0),
        outcome,
        ConversionOptions(**options),
        sample_class=StandInSample,
    )


def group(*rewards: float) -> list[list[StandInSample]]:
    return [episode(i, EpisodeOutcome(r)) for i, r in enumerate(rewards)]


def test_the_episodes_are_lists_of_several_samples() -> None:
    assert all(len(result) > 1 for result in group(1.0, 0.0))


@pytest.mark.parametrize(
    ("rewards", "keep", "reason"),
    [
        ((1.0, 1.0, 1.0, 1.0), False, "zero_std_1.0"),
        ((0.0, 0.0, 0.0, 0.0), False, "zero_std_0.0"),
        ((1.0, 0.0, 0.0, 0.0), True, None),
        ((0.5, 0.5, 0.5000001, 0.5), False, "zero_std_0.5"),  # within slime's 1e-6
        ((0.25, 0.25, 0.26, 0.25), True, None),
    ],
)
def test_a_group_is_dropped_when_its_episodes_all_earned_the_same_reward(
    rewards: tuple[float, ...], keep: bool, reason: str | None
) -> None:
    output = check_reward_nonzero_std(ARGS, group(*rewards))
    assert isinstance(output, StandInFilterOutput)  # slime's DynamicFilterOutput inside slime
    assert (output.keep, output.reason, output.keep_when_insufficient) == (keep, reason, False)


def test_each_episode_counts_once_however_many_samples_it_returned() -> None:
    """Two episodes at 1.0 with five samples each, two at 0.0 with one: counted by sample the
    spread would still be non-zero, but a group 1, 1, 1 (by episode) must be dropped whatever
    the number of samples, and 1, 0 kept."""
    many = [episode(i, EpisodeOutcome(1.0)) for i in range(3)]
    assert sum(len(r) for r in many) > 3
    assert not check_reward_nonzero_std(ARGS, many).keep
    one = [episode(9, EpisodeOutcome(0.0), branches=False)]
    assert len(one[0]) == 1
    assert check_reward_nonzero_std(ARGS, [*many, *one]).keep


def test_plain_samples_are_one_episode_each() -> None:
    """Another generate function's results (one sample each) are read the same way."""
    plain = [StandInSample(index=i, group_index=0, reward=r) for i, r in enumerate([1.0, 1.0])]
    assert not check_reward_nonzero_std(ARGS, plain).keep
    mixed = [*plain, StandInSample(index=2, group_index=0, reward=0.0)]
    assert check_reward_nonzero_std(ARGS, mixed).keep
    assert check_reward_nonzero_std(ARGS, [*group(1.0, 1.0), mixed[2]]).keep


def test_dict_rewards_are_read_with_slimes_reward_key() -> None:
    samples = [
        StandInSample(index=i, group_index=0, reward={"acc": r}) for i, r in enumerate([1, 0])
    ]
    assert check_reward_nonzero_std(SimpleNamespace(reward_key="acc"), samples).keep


def test_a_group_with_an_aborted_episode_is_kept_for_the_gates_to_count() -> None:
    """Its placeholder does not crash the filter; the rest earned the same reward, but dropping
    the group would hide the abort from the silent-failure gates, which see kept groups only."""
    results = [*group(1.0, 1.0, 1.0), episode(3, EpisodeOutcome.aborted("sandbox: boot failed"))]
    assert results[3][0].status is StandInSample.Status.ABORTED
    assert len(results[3]) == 1
    output = check_reward_nonzero_std(ARGS, results)
    assert (output.keep, output.reason) == (True, None)


def test_a_group_of_aborted_episodes_only_is_kept() -> None:
    results = [episode(i, EpisodeOutcome.aborted("engine: down")) for i in range(4)]
    assert check_reward_nonzero_std(ARGS, results).keep


def test_an_episode_with_nothing_to_train_is_outside_the_spread_and_keeps_its_group() -> None:
    """Graded 1.0 but every sample dropped by the length limit: an aborted placeholder (reward
    0.0, like any) whose record keeps 1.0. Neither value joins the spread; the group is kept."""
    dropped = episode(
        3, EpisodeOutcome(1.0), branches=False, max_sample_tokens=10, length_mode=LengthMode.DROP
    )
    assert dropped[0].metadata["agent_rl"]["episode"]["reward"] == 1.0
    assert check_reward_nonzero_std(ARGS, [*group(0.0, 0.0, 0.0), dropped]).keep


def test_the_fallback_variant_lets_slime_keep_a_rejected_group_to_fill_the_batch() -> None:
    output = check_reward_nonzero_std_with_fallback(ARGS, group(1.0, 1.0))
    assert (output.keep, output.reason, output.keep_when_insufficient) == (
        False,
        "zero_std_1.0",
        True,
    )


def test_both_filters_are_marked_and_pass_the_generate_functions_check() -> None:
    for function in (check_reward_nonzero_std, check_reward_nonzero_std_with_fallback):
        assert getattr(function, FAN_OUT_AWARE) is True
        path = f"slime_backend.dynamic_filter.{function.__name__}"
        check_slime_args(_wired(dynamic_sampling_filter_path=path))


def _wired(**values: object) -> SimpleNamespace:
    return SimpleNamespace(
        custom_reward_post_process_path="slime_backend.reward_hook.post_process_rewards",
        rollout_sample_filter_path="slime_backend.gate_hook.check_rollout_batch",
        **values,
    )


def test_the_stand_in_output_has_slimes_fields_in_order() -> None:
    fields = list(StandInFilterOutput.__dataclass_fields__)
    assert fields == CONTRACT["dynamic_filter_output"]
    assert StandInFilterOutput(keep=True) == StandInFilterOutput(True, None, False)
