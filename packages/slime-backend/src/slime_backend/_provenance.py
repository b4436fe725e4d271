"""What every sample carries about where its tokens came from, as plain data.

Stored under ``metadata["agent_rl"]`` next to the task payload, so a researcher holding one sample
from a slime rollout dump can answer: which session and turns is this, why is each untrained token
untrained, what did the episode generate that no sample trains, and how did tool calling go. Plain
dicts, lists, strings and numbers only: slime pickles samples across Ray and ``torch.save``s them.
"""

from __future__ import annotations

from collections.abc import Mapping

from trajectory_tree import Linearization, Sample, SessionSummary, SessionTree

from ._episode import EpisodeOutcome, JsonValue
from ._staleness import STALE_REASON


def episode_record(
    tree: SessionTree,
    linearization: Linearization,
    summary: SessionSummary,
    outcome: EpisodeOutcome,
    *,
    rollout_id: int,
    samples: int,
    trained_tokens: int,
    extra: Mapping[str, JsonValue],
) -> dict[str, JsonValue]:
    """Facts about the whole episode, identical on each of its samples.

    ``samples`` and ``trained_tokens`` describe what slime gets (0 for an aborted episode, whatever
    its tree holds); the tool-call counts cover every recorded turn, trained or not. ``status``,
    ``reason`` and ``reward`` are the final outcome (a graded episode with nothing to train is
    ``aborted`` with its graded reward). ``extra`` adds the app's own status (``graded_status``),
    the weight versions and how the episode was run.
    """
    return {
        "session_id": tree.session_id,
        "rollout_id": rollout_id,
        "status": outcome.status.value,
        "reason": outcome.reason,
        "reward": outcome.reward,
        "samples": samples,
        "turns": summary.turns,
        "branches": summary.branches,
        "generated_tokens": summary.generated_tokens,
        "trained_tokens": trained_tokens,
        "tool_calls": summary.tool_calls,
        "malformed_tool_calls": summary.malformed_tool_calls,
        "aborted_turns": summary.aborted_turns,
        "rerendered_turns": summary.rerendered_turns,
        "excluded_tokens": {str(r): n for r, n in sorted(summary.excluded_tokens.items())},
        "exclusions": [
            {"turn": e.turn, "reason": str(e.reason), "tokens": e.tokens}
            for e in linearization.exclusions
        ],
        "artifacts": dict(outcome.artifacts),
        **extra,
    }


def sample_record(
    sample: Sample,
    *,
    truncated_by: str | None,
    stale_turns: frozenset[int] = frozenset(),
    stale_tokens: int = 0,
    versions: dict[str, JsonValue] | None = None,
) -> dict[str, JsonValue]:
    """Facts about one sample: its branch, its turns, a reason count for every masked token
    (``stale_turns`` were generated here but masked by the staleness policy), and the weight
    versions of its trained tokens (:func:`slime_backend._sample_versions.versions_record`)."""
    trained = set(sample.trained_turns) - stale_turns
    context_turns = sorted(
        {s.turn for s in sample.spans if s.turn is not None and s.turn not in trained}
    )
    masked = {str(r): n for r, n in sample.masked_tokens().items()}
    if stale_tokens:
        masked[STALE_REASON] = stale_tokens
    return {
        "position": sample.index,
        "leaf_turn": sample.leaf_turn,
        "trained_turns": [t for t in sample.trained_turns if t in trained],
        "context_turns": context_turns,
        "stale_turns": sorted(stale_turns),
        "prompt_tokens": sample.prompt_length,
        "trained_tokens": sample.trained_tokens - stale_tokens,
        "masked_tokens": dict(sorted(masked.items())),
        "truncated_by": truncated_by,
        "versions": versions,
    }
