"""Per-episode group normalization: the math, against slime's own formula where they must agree."""

from __future__ import annotations

import math
import random
import statistics
from types import SimpleNamespace
from typing import Any

import pytest
from episode_kit import Recorder, base_sample, fan_out
from hypothesis import given, settings
from hypothesis import strategies as st

from slime_backend import ConversionOptions, EpisodeOutcome, episode_samples
from slime_backend._grpo import EPSILON, EpisodeReward, Normalization, normalized_rewards
from slime_backend.reward_hook import post_process_rewards
from slime_backend.testing import StandInSample

Status = StandInSample.Status
ESTIMATORS = ["grpo", "gspo", "cispo", "reinforce_plus_plus_baseline", "reinforce_plus_plus", "ppo"]


def slime_args(
    estimator: str = "grpo",
    *,
    std: bool = True,
    normalize: bool = True,
    reward_key: str | None = None,
    **more: Any,
) -> SimpleNamespace:
    """The ``args`` fields the hook reads, named as slime's parser names them."""
    return SimpleNamespace(
        advantage_estimator=estimator,
        rewards_normalization=normalize,
        grpo_std_normalization=std,
        reward_key=reward_key,
        **more,
    )


def slime_default(args: SimpleNamespace, rewards: list[float]) -> list[float]:
    """slime's built-in ``_post_process_rewards`` at the pinned commit, restated in Python:
    rows by *position* when the count is exactly n_samples_per_prompt * rollout_batch_size,
    otherwise the whole batch as one row; torch's std is the sample std (n - 1)."""
    if not (
        args.rewards_normalization
        and args.advantage_estimator in ("grpo", "gspo", "cispo", "reinforce_plus_plus_baseline")
    ):
        return list(rewards)
    n = args.n_samples_per_prompt
    rows = (
        [rewards[i : i + n] for i in range(0, len(rewards), n)]
        if len(rewards) == n * args.rollout_batch_size
        else [rewards]
    )
    out: list[float] = []
    for row in rows:
        mean = statistics.fmean(row)
        centered = [r - mean for r in row]
        if args.advantage_estimator in ("grpo", "gspo", "cispo") and args.grpo_std_normalization:
            std = statistics.stdev(row)
            centered = [c / (std + 1e-6) for c in centered]
        out.extend(centered)
    return out


def sample(
    episode: int, group: int, reward: float, status: Any = Status.COMPLETED
) -> StandInSample:
    return StandInSample(
        index=episode, rollout_id=episode, group_index=group, reward=reward, status=status
    )


def test_uneven_fan_out_counts_each_episode_once() -> None:
    """slime issue #2230: episode 0 has three samples, episode 1 one; both are one vote."""
    batch = [sample(0, 0, 1.0)] * 3 + [sample(1, 0, 0.0)] + [sample(2, 1, 1.0), sample(3, 1, 1.0)]
    args = slime_args(n_samples_per_prompt=2, rollout_batch_size=2)
    raw, rewards = post_process_rewards(args, batch)
    assert raw == [1.0, 1.0, 1.0, 0.0, 1.0, 1.0]
    half = 0.5 / (math.sqrt(0.5) + EPSILON)  # mean 0.5, sample std sqrt(0.5)
    assert rewards == pytest.approx([half, half, half, -half, 0.0, 0.0])
    # slime's default sees 6 samples, not 2 * 2, and pools the whole batch into one group:
    # the 3-sample episode drags the baseline, and group 1's equal rewards stop being neutral.
    default = slime_default(args, raw)
    assert default[4] != pytest.approx(0.0)
    assert default[3] != pytest.approx(rewards[3])


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize(("std", "normalize"), [(True, True), (False, True), (True, False)])
def test_without_fan_out_it_is_exactly_slimes_normalization(
    estimator: str, std: bool, normalize: bool
) -> None:
    rng = random.Random(f"{estimator}{std}{normalize}")
    groups, n = 5, 4
    rewards = [
        float(rng.choice([0, 1])) if rng.random() < 0.7 else rng.random() for _ in range(n * groups)
    ]
    batch = [sample(i, i // n, r) for i, r in enumerate(rewards)]
    args = slime_args(
        estimator, std=std, normalize=normalize, n_samples_per_prompt=n, rollout_batch_size=groups
    )
    raw, ours = post_process_rewards(args, batch)
    assert raw == rewards
    assert ours == pytest.approx(slime_default(args, rewards), abs=1e-9)


def test_aborted_episodes_stay_out_of_the_baseline_and_get_zero() -> None:
    batch = [sample(0, 0, 1.0), sample(1, 0, 0.0), sample(2, 0, 0.0, Status.ABORTED)]
    _, rewards = post_process_rewards(slime_args(), batch)
    half = 0.5 / (math.sqrt(0.5) + EPSILON)
    assert rewards == pytest.approx([half, -half, 0.0])


def test_a_group_with_one_counted_episode_gets_zero_not_nan() -> None:
    batch = [sample(0, 0, 1.0), sample(1, 0, 0.0, Status.ABORTED), sample(2, 1, 0.3)]
    _, rewards = post_process_rewards(slime_args(), batch)
    assert rewards == [0.0, 0.0, 0.0]


def test_reinforce_plus_plus_baseline_subtracts_the_mean_only() -> None:
    batch = [sample(0, 0, 3.0), sample(0, 0, 3.0), sample(1, 0, 1.0)]
    _, rewards = post_process_rewards(slime_args("reinforce_plus_plus_baseline"), batch)
    assert rewards == [1.0, 1.0, -1.0]


@pytest.mark.parametrize(
    "args", [slime_args("ppo"), slime_args("reinforce_plus_plus"), slime_args(normalize=False)]
)
def test_estimators_slime_does_not_normalize_get_raw_rewards(args: SimpleNamespace) -> None:
    batch = [sample(0, 0, 3.0), sample(1, 0, 1.0), sample(2, 0, 0.0, Status.ABORTED)]
    raw, rewards = post_process_rewards(args, batch)
    assert raw == rewards == [3.0, 1.0, 0.0]


def test_reward_key_selects_from_dict_rewards() -> None:
    a, b = sample(0, 0, 0.0), sample(1, 0, 0.0)
    a.reward, b.reward = {"solved": 1.0, "style": 0.2}, {"solved": 0.0, "style": 0.9}
    raw, _ = post_process_rewards(slime_args(reward_key="solved"), [a, b])
    assert raw == [1.0, 0.0]


def _forget_ids(batch: list[StandInSample]) -> None:
    for s in batch:
        s.rollout_id = s.index = None


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda s: setattr(s[0], "reward", None), "no numeric reward"),
        (lambda s: setattr(s[0], "reward", {"solved": 1.0}), "no args.reward_key"),
        (lambda s: setattr(s[1], "reward", 0.5), "disagree"),
        (lambda s: setattr(s[1], "group_index", 9), "disagree"),
        (lambda s: setattr(s[0], "group_index", None), "no group_index"),
        (_forget_ids, "neither rollout_id nor index"),
    ],
)
def test_inconsistent_batches_are_refused(mutate: Any, message: str) -> None:
    batch = [sample(0, 0, 1.0), sample(0, 0, 1.0), sample(1, 0, 0.0)]
    mutate(batch)
    with pytest.raises(ValueError, match=message):
        post_process_rewards(slime_args(), batch)


def test_the_hook_reads_converted_episodes_and_placeholders() -> None:
    """End to end: three episodes of one prompt as the conversion emits them."""
    options = ConversionOptions()

    def episode(index: int, outcome: EpisodeOutcome) -> list[StandInSample]:
        tree = fan_out(Recorder(seed=index)).tree
        base = base_sample(index=index, group_index=0)
        return episode_samples(tree, base, outcome, options, sample_class=StandInSample)

    batch = [
        *episode(0, EpisodeOutcome(1.0)),
        *episode(1, EpisodeOutcome(0.0)),
        *episode(2, EpisodeOutcome.aborted("grader crashed")),
    ]
    assert len(batch) == 3 + 3 + 1
    _, rewards = post_process_rewards(slime_args(), batch)
    half = 0.5 / (math.sqrt(0.5) + EPSILON)
    assert rewards == pytest.approx([half] * 3 + [-half] * 3 + [0.0])


# -- properties of the math ------------------------------------------------------------------

episodes = st.lists(
    st.tuples(
        st.integers(0, 3),  # group
        st.sampled_from([0.0, 1.0, 0.5, -2.0, 3.25]),  # reward
        st.booleans(),  # in the baseline
        st.integers(1, 4),  # samples of the episode
    ),
    min_size=1,
    max_size=16,
)
normalizations = st.sampled_from(
    [Normalization(True, True), Normalization(True, False), Normalization(False, False)]
)


@settings(max_examples=300, deadline=None)
@given(episodes, normalizations, st.randoms(use_true_random=False))
def test_fan_out_and_order_do_not_change_any_advantage(
    spec: list[tuple[int, float, bool, int]], norm: Normalization, rng: random.Random
) -> None:
    one_each = [EpisodeReward(i, g, r, counted) for i, (g, r, counted, _) in enumerate(spec)]
    expected = normalized_rewards(one_each, norm)
    batch = [
        sample(i, g, r, Status.COMPLETED if counted else Status.ABORTED)
        for i, (g, r, counted, k) in enumerate(spec)
        for _ in range(k)
    ]
    rng.shuffle(batch)
    args = slime_args(
        "grpo" if norm.subtract_mean else "ppo", std=norm.divide_by_std, normalize=True
    )
    _, rewards = post_process_rewards(args, batch)
    assert rewards == [expected[s.rollout_id] for s in batch]  # type: ignore[index]


@settings(max_examples=300, deadline=None)
@given(episodes)
def test_counted_advantages_are_centered_and_scaled_per_group(
    spec: list[tuple[int, float, bool, int]],
) -> None:
    rewards = [EpisodeReward(i, g, r, counted) for i, (g, r, counted, _) in enumerate(spec)]
    values = normalized_rewards(rewards, Normalization(True, True))
    for group in {e.group for e in rewards}:
        counted = [e for e in rewards if e.group == group and e.in_baseline]
        advantages = [values[e.episode] for e in counted]
        if advantages:
            assert math.fsum(advantages) == pytest.approx(0.0, abs=1e-9)
        spread = statistics.stdev([e.reward for e in counted]) if len(counted) > 1 else 0.0
        if spread > 0:
            assert statistics.stdev(advantages) == pytest.approx(spread / (spread + EPSILON))
    assert all(values[e.episode] == 0.0 for e in rewards if not e.in_baseline)


def test_an_episode_listed_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="twice"):
        normalized_rewards(
            [EpisodeReward(1, 0, 1.0), EpisodeReward(1, 0, 1.0)], Normalization(True, True)
        )
