"""A session at a glance: what was generated, what is trained, and why the rest is not."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from ._linearize import Linearization, linearize
from ._reasons import FinishReason, LossReason
from ._tree import SessionTree
from ._turns import HISTORY_DROPPED, OUTPUT_KEPT, PROMPT_MISMATCH, Turn


@dataclass(frozen=True, slots=True)
class SessionSummary:
    turns: int
    branches: int
    samples: int
    generated_tokens: int
    trained_tokens: int
    masked_tokens: dict[LossReason, int]
    """Loss-0 tokens across all samples, by reason."""
    excluded_tokens: dict[LossReason, int]
    """Generated tokens no sample trains, by reason."""
    tool_calls: int
    malformed_tool_calls: int
    aborted_turns: int
    side_requests: int
    """Turns marked as side requests (client housekeeping such as a session title), never
    trained."""
    rerendered_turns: int
    max_prompt_tokens: int
    prompt_mismatches: dict[str, int]
    """Turns whose prompt the renderer found different from the chat template's own render of
    the same conversation, by the reason it recorded (``TurnMeta.extra["prompt_mismatch"]``)."""
    outputs_kept: dict[str, int] = field(default_factory=dict)
    """Turns whose prompt keeps an earlier reply as the engine generated it where the chat
    template renders it differently (``TurnMeta.extra["output_kept"]``), by reason: expected
    (the model wrote unlike the template, or the client re-serialized its echo), never a fault
    of the renderer, and never counted as a prompt mismatch."""
    cut_replies: int = 0
    """Turns the engine stopped at a length limit (``max_new_tokens`` or the context), not at
    the model's own end: trained like any turn, counted so a run sees how often it happens."""
    history_dropped: int = 0
    """Turns whose request was resent without the oldest part of its history after a too-long
    refusal (``TurnMeta.extra["history_dropped"]``): never trained."""

    def as_dict(self) -> dict[str, object]:
        return {
            "turns": self.turns,
            "branches": self.branches,
            "samples": self.samples,
            "generated_tokens": self.generated_tokens,
            "trained_tokens": self.trained_tokens,
            "masked_tokens": {str(k): v for k, v in sorted(self.masked_tokens.items())},
            "excluded_tokens": {str(k): v for k, v in sorted(self.excluded_tokens.items())},
            "tool_calls": self.tool_calls,
            "malformed_tool_calls": self.malformed_tool_calls,
            "aborted_turns": self.aborted_turns,
            "side_requests": self.side_requests,
            "rerendered_turns": self.rerendered_turns,
            "max_prompt_tokens": self.max_prompt_tokens,
            "prompt_mismatches": dict(sorted(self.prompt_mismatches.items())),
            "outputs_kept": dict(sorted(self.outputs_kept.items())),
            "cut_replies": self.cut_replies,
            "history_dropped": self.history_dropped,
        }


def summarize(tree: SessionTree, linearization: Linearization | None = None) -> SessionSummary:
    """Summarize ``tree``; pass the linearization you train on to count exactly that."""
    lin = linearization if linearization is not None else linearize(tree)
    masked: dict[LossReason, int] = {}
    for sample in lin.samples:
        for reason, count in sample.masked_tokens().items():
            masked[reason] = masked.get(reason, 0) + count
    turns = tree.turns
    return SessionSummary(
        turns=len(turns),
        branches=sum(1 for n in tree.leaves() if n.turn is not None),
        samples=len(lin.samples),
        generated_tokens=sum(t.output_length for t in turns),
        trained_tokens=sum(s.trained_tokens for s in lin.samples),
        masked_tokens=masked,
        excluded_tokens=lin.excluded_tokens(),
        tool_calls=sum(len(t.reply.tool_calls) for t in turns),
        malformed_tool_calls=sum(t.meta.malformed_tool_calls for t in turns),
        aborted_turns=sum(1 for t in turns if t.finish_reason is FinishReason.ABORT),
        cut_replies=sum(1 for t in turns if t.finish_reason is FinishReason.LENGTH),
        side_requests=sum(1 for t in turns if t.meta.side_request),
        rerendered_turns=sum(1 for t in turns if t.rerendered is not None),
        max_prompt_tokens=max((t.prompt_length for t in turns), default=0),
        prompt_mismatches=_noted(turns, PROMPT_MISMATCH),
        outputs_kept=_noted(turns, OUTPUT_KEPT),
        history_dropped=sum(1 for t in turns if HISTORY_DROPPED in t.meta.extra),
    )


def _noted(turns: Sequence[Turn], key: str) -> dict[str, int]:
    """How many turns carry each reason under ``TurnMeta.extra[key]``."""
    return dict(Counter(r for t in turns if (r := t.meta.extra.get(key)) is not None))
