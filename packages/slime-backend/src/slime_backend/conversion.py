"""One episode's session tree and outcome -> the slime samples the generate function returns.

Each trajectory-tree sample (one per branch: main agent, sub-agents, compaction restarts) becomes
one slime ``Sample``:

- ``tokens`` are the branch's tokens verbatim. The response region starts at the sample's first
  trained token (trajectory-tree's ``prompt_length``): the first token the engine generated *for
  this sample*. Everything after it is response, tool outputs and template scaffold included, with
  ``loss_mask`` 0 wherever the engine did not generate the token for this sample. Generated tokens
  before that point were trained in another sample and are plain context here.
- ``rollout_log_probs`` covers the response region like ``loss_mask``: the engine's logprob where
  the mask is 1, ``0.0`` where it is 0 (slime's own convention for non-generated tokens; a masked
  position never reaches the loss, and 0.0 keeps its importance ratios finite).
- ``rollout_id`` is the base sample's ``index`` on every sample of the episode, so slime's loss
  reducer and data-parallel schedule count the episode once; ``index``, ``group_index``,
  ``prompt``, ``label`` and ``session_id`` are the base sample's.
- ``reward`` is the episode's reward on every sample (GRPO normalization happens per episode in
  :mod:`slime_backend.reward_hook`); ``status`` is ``truncated`` when the length limit cut the
  sample, the engine hit ``max_new_tokens`` on its last trained turn, or a budget cut the episode.
- ``metadata`` is the task payload verbatim plus our provenance under ``"agent_rl"``.

An episode that yields nothing to train (aborted, or no generated token survived) still returns
one sample, a placeholder slime trains nothing from: an empty list breaks slime's rollout logging,
and a missing episode shifts its fixed number of rollouts per training step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from trajectory_tree import (
    FinishReason,
    LengthLimit,
    LengthMode,
    RewardPolicy,
    Sample,
    SessionTree,
    assign_reward,
    linearize,
    summarize,
)

from .episode import EpisodeOutcome, EpisodeStatus, JsonValue
from .provenance import episode_record, sample_record
from .slime_api import NAMESPACE
from .typed_config import FieldError

PLACEHOLDER_TOKENS = (0, 0)
"""Tokens of the placeholder an untrainable episode returns: one prompt and one response token,
never trained (loss mask 0, ``remove_sample``). Id 0 exists in every vocabulary."""


class ConversionError(ValueError):
    """The episode's data cannot become slime samples (the generate function aborts it)."""


@dataclass(frozen=True, slots=True)
class ConversionOptions:
    """How a session tree is cut into samples.

    ``max_sample_tokens`` caps one sample's length (``length_mode`` truncates or drops it; the
    tokens lost are recorded as exclusions). ``reward_policy`` is trajectory-tree's: ``full`` (every
    sample gets the episode's reward) or ``final_branch`` (only the branch holding the last trained
    turn is kept). ``split`` is refused: the GRPO hook broadcasts one advantage per episode, and
    dividing the reward by the number of branches would shrink it for agents that fan out.
    """

    max_sample_tokens: int | None = None
    length_mode: LengthMode = LengthMode.TRUNCATE
    reward_policy: RewardPolicy = RewardPolicy.FULL

    def __post_init__(self) -> None:
        if self.max_sample_tokens is not None and self.max_sample_tokens <= 1:
            raise FieldError("max_sample_tokens", "must be at least 2 (a prompt and a response)")
        if RewardPolicy(self.reward_policy) is RewardPolicy.SPLIT:
            raise FieldError(
                "reward_policy",
                "'split' is not supported: the advantage is normalized per episode and "
                "broadcast to its samples; use 'full' or 'final_branch'",
            )

    @property
    def limit(self) -> LengthLimit | None:
        if self.max_sample_tokens is None:
            return None
        return LengthLimit(self.max_sample_tokens, self.length_mode)


def episode_samples(
    tree: SessionTree,
    base: Any,
    outcome: EpisodeOutcome,
    options: ConversionOptions,
    *,
    sample_class: type[Any],
    decode: Callable[[Sequence[int]], str] | None = None,
) -> list[Any]:
    """The samples slime gets for one episode (never an empty list).

    ``base`` is the sample slime passed to the generate function; it is not modified.
    ``sample_class`` is ``slime.utils.types.Sample`` (see :func:`slime_api.sample_class`) or a
    stand-in with the same fields. ``decode`` fills the human-readable ``response`` field.
    """
    rollout_id = base.index
    if rollout_id is None:
        raise ConversionError("the base sample has no index (slime's data source always sets one)")
    if NAMESPACE in (base.metadata or {}):
        raise ConversionError(f"the task payload already has a {NAMESPACE!r} key")
    linearization = assign_reward(
        linearize(tree, limit=options.limit),
        outcome.reward,
        rollout_id=str(rollout_id),
        policy=options.reward_policy,
    )
    aborted = outcome.status is EpisodeStatus.ABORTED
    emitted = () if aborted else linearization.samples
    episode = episode_record(
        tree,
        linearization,
        summarize(tree, linearization),
        outcome,
        rollout_id=rollout_id,
        samples=len(emitted),
        trained_tokens=sum(s.trained_tokens for s in emitted),
    )

    def metadata(record: dict[str, JsonValue]) -> dict[Any, Any]:
        return {**(base.metadata or {}), NAMESPACE: {"episode": episode, "sample": record}}

    if not emitted:
        reason = outcome.reason if aborted else "no generated token survived linearization"
        return [_placeholder(base, sample_class, rollout_id, metadata({"placeholder": reason}))]
    return [
        _slime_sample(tree, s, base, outcome, sample_class, rollout_id, metadata, decode)
        for s in emitted
    ]


def _slime_sample(
    tree: SessionTree,
    sample: Sample,
    base: Any,
    outcome: EpisodeOutcome,
    sample_class: type[Any],
    rollout_id: int,
    metadata: Callable[[dict[str, JsonValue]], dict[Any, Any]],
    decode: Callable[[Sequence[int]], str] | None,
) -> Any:
    tokens = sample.tokens.tolist()
    response = tokens[sample.prompt_length :]
    mask, logprobs = _response_region(sample)
    truncated_by = _truncated_by(tree, sample, outcome)
    status = sample_class.Status.TRUNCATED if truncated_by else sample_class.Status.COMPLETED
    return sample_class(
        group_index=base.group_index,
        index=base.index,
        rollout_id=rollout_id,
        prompt=base.prompt,
        label=base.label,
        session_id=base.session_id,
        tokens=tokens,
        response=decode(response) if decode else "",
        response_length=len(response),
        loss_mask=mask,
        rollout_log_probs=logprobs,
        weight_versions=[
            v for t in sample.trained_turns if (v := tree.turns[t].weight_version) is not None
        ],
        reward=sample.reward,
        status=status,
        metadata=metadata(sample_record(sample, truncated_by=truncated_by)),
    )


def _response_region(sample: Sample) -> tuple[list[int], list[float]]:
    """``loss_mask`` and ``rollout_log_probs`` of the response region, span by span: a span is
    trained or not as a whole, and agent sessions are mostly long untrained tool outputs, whose
    zeros are built without touching each token."""
    start = sample.prompt_length
    mask: list[int] = []
    logprobs: list[float] = []
    for span in sample.spans:
        lo, hi = max(span.start, start), span.end
        if hi <= lo:
            continue
        if span.trained:
            values = sample.logprobs[lo:hi]
            if not math.isfinite(math.fsum(values)):
                bad = next(i for i, v in enumerate(values) if not math.isfinite(v))
                raise ConversionError(
                    f"trained token {lo + bad - start} of the response has logprob {values[bad]}"
                )
            mask += [1] * (hi - lo)
            logprobs += values.tolist()
        else:
            mask += [0] * (hi - lo)
            logprobs += [0.0] * (hi - lo)
    return mask, logprobs


def _truncated_by(tree: SessionTree, sample: Sample, outcome: EpisodeOutcome) -> str | None:
    if sample.truncated:
        return "sample_length_limit"
    if tree.turns[max(sample.trained_turns)].finish_reason is FinishReason.LENGTH:
        return "max_new_tokens"
    if outcome.status is EpisodeStatus.TRUNCATED:
        return "episode_budget"
    return None


def _placeholder(
    base: Any, sample_class: type[Any], rollout_id: int, metadata: dict[Any, Any]
) -> Any:
    return sample_class(
        group_index=base.group_index,
        index=base.index,
        rollout_id=rollout_id,
        prompt=base.prompt,
        label=base.label,
        session_id=base.session_id,
        tokens=list(PLACEHOLDER_TOKENS),
        response_length=1,
        loss_mask=[0],
        rollout_log_probs=[0.0],
        reward=0.0,
        remove_sample=True,
        status=sample_class.Status.ABORTED,
        metadata=metadata,
    )
