"""Group-relative reward normalization computed over episodes, not over samples.

slime's built-in normalization (``RolloutManager._post_process_rewards``) reshapes the batch's
rewards by position into rows of ``n_samples_per_prompt``, and when the count does not match
(any episode returned several samples) it normalizes the whole batch as one group. With agents
that fan out into sub-agents and compactions, that baseline is neither per prompt nor per episode
(slime issue #2230): an episode with five branches weighs five times in its group's mean.

Here each episode counts once in its group's statistics, whatever its number of samples, and its
normalized value is broadcast to all of them. Which estimators normalize, and how, follows slime:

- ``grpo``, ``gspo``, ``cispo``: subtract the group mean; with ``grpo_std_normalization`` also
  divide by the group's sample standard deviation (n - 1 in the denominator, torch's default)
  plus ``1e-6``.
- ``reinforce_plus_plus_baseline``: subtract the group mean only.
- ``ppo``, ``reinforce_plus_plus``, or ``--disable-rewards-normalization``: rewards unchanged.

Two deliberate differences: a group with one counted episode gets advantage 0 (slime's torch code
yields NaN for the standard deviation of one value), and the arithmetic is double precision (slime
uses float32).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

EPSILON = 1e-6
"""Added to the standard deviation before dividing, as slime does."""

STD_ESTIMATORS = frozenset({"grpo", "gspo", "cispo"})
"""Estimators slime divides by the group's standard deviation (when std normalization is on)."""

MEAN_ESTIMATORS = STD_ESTIMATORS | {"reinforce_plus_plus_baseline"}
"""Estimators slime subtracts the group mean for (when rewards normalization is on)."""


@dataclass(frozen=True, slots=True)
class Normalization:
    subtract_mean: bool
    divide_by_std: bool
    epsilon: float = EPSILON

    @classmethod
    def for_slime(
        cls, *, advantage_estimator: str, rewards_normalization: bool, grpo_std_normalization: bool
    ) -> Normalization:
        """What slime itself would do for these ``args`` values."""
        mean = rewards_normalization and advantage_estimator in MEAN_ESTIMATORS
        std = mean and grpo_std_normalization and advantage_estimator in STD_ESTIMATORS
        return cls(subtract_mean=mean, divide_by_std=std)


@dataclass(frozen=True, slots=True)
class EpisodeReward:
    """One episode's reward. An episode outside the baseline (aborted: its reward means nothing
    about the policy) neither moves its group's statistics nor gets an advantage (0)."""

    episode: int
    group: int
    reward: float
    in_baseline: bool = True


def normalized_rewards(
    episodes: Sequence[EpisodeReward], normalization: Normalization
) -> dict[int, float]:
    """The value slime trains each episode's samples with, by episode."""
    groups: dict[int, list[EpisodeReward]] = {}
    for episode in episodes:
        groups.setdefault(episode.group, []).append(episode)
    if len({e.episode for e in episodes}) != len(episodes):
        raise ValueError("an episode appears twice")
    if not normalization.subtract_mean:
        return {e.episode: e.reward for e in episodes}
    values: dict[int, float] = {}
    for members in groups.values():
        counted = [e.reward for e in members if e.in_baseline]
        mean = math.fsum(counted) / len(counted) if counted else 0.0
        divisor = 1.0
        if normalization.divide_by_std:
            divisor = sample_std(counted, mean) + normalization.epsilon
        for e in members:
            values[e.episode] = (e.reward - mean) / divisor if e.in_baseline else 0.0
    return values


def sample_std(values: Sequence[float], mean: float) -> float:
    """The sample standard deviation (n - 1), 0 for fewer than two values."""
    if len(values) < 2:
        return 0.0
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))
