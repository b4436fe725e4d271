"""Rewards for the samples of one episode.

An episode of an agent with sub-agents or compactions yields several samples but one outcome. How
that outcome reaches the samples is a modelling choice, so it is a policy:

- ``FULL`` (default): every sample gets the whole reward and the episode's ``rollout_id``, so a
  trainer that normalizes per rollout counts the episode once.
- ``SPLIT``: the reward is divided evenly between the samples.
- ``FINAL_BRANCH``: only the sample holding the episode's last trained turn is kept, training
  every turn on its path; tokens only the other samples would have trained are listed as
  excluded (``not_final_branch``).
"""

from __future__ import annotations

import dataclasses
from array import array
from enum import StrEnum

from ._linearize import Exclusion, Linearization, Sample
from ._reasons import LossReason


class RewardPolicy(StrEnum):
    FULL = "full"
    SPLIT = "split"
    FINAL_BRANCH = "final_branch"


def assign_reward(
    linearization: Linearization,
    reward: float,
    *,
    rollout_id: str,
    policy: RewardPolicy = RewardPolicy.FULL,
) -> Linearization:
    """Attach ``reward`` and ``rollout_id`` to the samples according to ``policy``."""
    policy = RewardPolicy(policy)  # a plain "split" must not silently mean FULL
    samples = linearization.samples
    exclusions = list(linearization.exclusions)
    if not samples:
        return linearization
    if policy is RewardPolicy.FINAL_BRANCH:
        last = max(samples, key=lambda s: max(s.trained_turns))
        final = _train_shared_turns(last)
        for sample in samples:
            if sample is not last:
                exclusions.extend(
                    Exclusion(s.turn, LossReason.NOT_FINAL_BRANCH, len(s))
                    for s in sample.spans
                    if s.trained and s.turn is not None and s.turn not in final.trained_turns
                )
        samples = (dataclasses.replace(final, index=0),)
    share = reward / len(samples) if policy is RewardPolicy.SPLIT else reward
    rewarded = tuple(dataclasses.replace(s, reward=share, rollout_id=rollout_id) for s in samples)
    return Linearization(rewarded, tuple(exclusions))


def _train_shared_turns(sample: Sample) -> Sample:
    """``sample`` training its turns that were trained in the samples the policy drops."""
    spans = tuple(
        dataclasses.replace(s, reason=LossReason.GENERATED)
        if s.reason is LossReason.TRAINED_IN_OTHER_SAMPLE
        else s
        for s in sample.spans
    )
    mask = array("B", sample.loss_mask)
    trained = [s for s in spans if s.trained]
    for span in trained:
        mask[span.start : span.end] = array("B", b"\x01" * len(span))
    return dataclasses.replace(
        sample,
        loss_mask=mask,
        spans=spans,
        prompt_length=trained[0].start,
        trained_turns=tuple(dict.fromkeys(s.turn for s in trained if s.turn is not None)),
    )
