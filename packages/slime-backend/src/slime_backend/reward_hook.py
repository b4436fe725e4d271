"""slime's ``--custom-reward-post-process-path`` hook: GRPO baselines per episode.

slime calls ``post_process_rewards(args, samples)`` once per rollout batch with every sample of
the batch (already flattened) and expects ``(raw_rewards, rewards)``: two lists of floats, one
entry per sample, in order. ``raw_rewards`` is logged; ``rewards`` is what the advantage estimator
consumes. See :mod:`slime_backend._grpo` for the math.

Episodes are told apart by ``rollout_id`` (falling back to ``index``, as slime does) and grouped by
``group_index``; every sample of an episode must carry the same reward and group. An episode with
an ``aborted`` sample is left out of its group's baseline and gets 0: its reward says nothing about
the policy, and its placeholder trains nothing anyway. So is an episode the app graded but that
left nothing to train (its placeholder is ``aborted`` too, its reason ``nothing_trainable: ...``):
it moves no baseline, and its metadata says so.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from ._grpo import EpisodeReward, Normalization, normalized_rewards
from ._slime_api import SlimeSample, episode_key

logger = logging.getLogger(__name__)

ABORTED = "aborted"


def post_process_rewards(
    args: Any, samples: Sequence[SlimeSample]
) -> tuple[list[float], list[float]]:
    """The hook slime calls; ``args`` is slime's parsed namespace."""
    normalization = Normalization.for_slime(
        advantage_estimator=args.advantage_estimator,
        rewards_normalization=args.rewards_normalization,
        grpo_std_normalization=args.grpo_std_normalization,
    )
    raw = _raw_rewards(args, samples)
    episodes = _episodes(samples, raw)
    values = normalized_rewards(list(episodes.values()), normalization)
    excluded = sum(1 for e in episodes.values() if not e.in_baseline)
    logger.info(
        "agent-rl rewards: %d samples, %d episodes in %d groups, %d aborted episodes outside the "
        "baselines (mean subtracted: %s, divided by std: %s)",
        len(samples),
        len(episodes),
        len({e.group for e in episodes.values()}),
        excluded,
        normalization.subtract_mean,
        normalization.divide_by_std,
    )
    return raw, [values[episode_key(s)] for s in samples]


def episode_rewards(args: Any, samples: Sequence[SlimeSample]) -> dict[int, EpisodeReward]:
    """Each episode of ``samples`` once, by its key: its reward, group and whether it is in its
    group's baseline (what this hook normalizes; the dynamic-sampling filter reads the same)."""
    return _episodes(samples, _raw_rewards(args, samples))


def _raw_rewards(args: Any, samples: Sequence[SlimeSample]) -> list[float]:
    return [_reward(s, getattr(args, "reward_key", None)) for s in samples]


def _reward(sample: SlimeSample, reward_key: str | None) -> float:
    reward = sample.reward
    if isinstance(reward, dict):
        if not reward_key:
            raise ValueError(f"sample {sample.index} has a dict reward and no args.reward_key")
        reward = reward[reward_key]
    if isinstance(reward, bool) or not isinstance(reward, int | float):
        raise ValueError(f"sample {sample.index} has no numeric reward ({reward!r})")
    return float(reward)


def _episodes(samples: Sequence[SlimeSample], raw: Sequence[float]) -> dict[int, EpisodeReward]:
    episodes: dict[int, EpisodeReward] = {}
    for sample, reward in zip(samples, raw, strict=True):
        key = episode_key(sample)
        if sample.group_index is None:
            raise ValueError(f"sample {sample.index} has no group_index")
        aborted = sample.status.value == ABORTED
        seen = episodes.get(key)
        if seen is None:
            episodes[key] = EpisodeReward(key, sample.group_index, reward, not aborted)
            continue
        if seen.reward != reward or seen.group != sample.group_index:
            raise ValueError(
                f"samples of episode {key} disagree: reward {seen.reward} vs {reward}, group "
                f"{seen.group} vs {sample.group_index} (one episode has one outcome)"
            )
        if aborted and seen.in_baseline:
            episodes[key] = EpisodeReward(key, seen.group, reward, in_baseline=False)
    return episodes
