"""Why a token is, or is not, trained: one code per span, so a user can always ask."""

from __future__ import annotations

from enum import StrEnum


class LossReason(StrEnum):
    """The reason attached to every span of a sample. Only ``GENERATED`` spans carry loss 1."""

    GENERATED = "generated"
    """Sampled by the engine at this position, trained in this sample."""
    CONTEXT = "context"
    """System, user or client-written assistant text the model did not generate."""
    TOOL_OUTPUT = "tool_output"
    """A tool result returned by the agent harness."""
    TEMPLATE_SCAFFOLD = "template_scaffold"
    """Chat-template tokens the model did not generate: role headers, closing tokens."""
    RERENDERED_HISTORY = "rerendered_history"
    """History rendered again in full because the request did not extend its path's tokens."""
    TRAINED_IN_OTHER_SAMPLE = "trained_in_other_sample"
    """Generated tokens shared with another branch, trained in that branch's sample."""
    ABORTED = "aborted"
    """Output of a generation that was aborted (client gone, session closed)."""
    ABANDONED_RETRY = "abandoned_retry"
    """Output the client never continued because it retried the same request."""
    SIDE_REQUEST = "side_request"
    """Output of a request the caller marked as not part of the policy's work (e.g. a title)."""
    HISTORY_DROPPED = "history_dropped"
    """Output of a request resent without the oldest part of its history after a too-long
    refusal: written without what was dropped (the task, often)."""
    OVER_LENGTH = "over_length"
    """Generated tokens cut or dropped by the sample length limit."""
    NOT_FINAL_BRANCH = "not_final_branch"
    """Generated tokens on a branch the reward policy does not train."""


class FinishReason(StrEnum):
    """Why the engine stopped generating (SGLang's ``meta_info.finish_reason.type``)."""

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"


TURN_EXCLUSIONS: frozenset[LossReason] = frozenset(
    (
        LossReason.ABORTED,
        LossReason.ABANDONED_RETRY,
        LossReason.SIDE_REQUEST,
        LossReason.HISTORY_DROPPED,
    )
)
"""Reasons that exclude a whole turn's output from training, decided per turn."""
