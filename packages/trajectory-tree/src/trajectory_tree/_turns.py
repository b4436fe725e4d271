"""What one model call produced, as the engine returned it and the client received it."""

from __future__ import annotations

import math
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

from ._errors import InvalidTurn
from ._messages import Message
from ._reasons import FinishReason
from ._routing import RoutedExperts

VersionRun = tuple[int, str]
"""``(first output index, weight version)``: from that output token on, until the next run, the
engine generated with those weights (a call the engine paused for a weight update and resumed
spans two)."""

LOGPROB_ROUNDING = 1e-4
"""Engines compute log-softmax in low precision; a certain token can come back as +1e-7. Such
values are kept as returned; anything larger is not a log-probability and is refused."""


@dataclass(frozen=True, slots=True)
class Completion:
    """The engine's answer: output ids and their logprobs exactly as generated.

    ``weight_version`` is the version that finished the call; ``version_runs``, when the engine
    reported versions as it went, says which version generated which tokens (empty: all of them
    ``weight_version``). ``routed_experts`` is the call's routing, when captured.
    """

    output_ids: Sequence[int]
    output_logprobs: Sequence[float]
    finish_reason: FinishReason
    weight_version: str | None = None
    version_runs: tuple[VersionRun, ...] = ()
    routed_experts: RoutedExperts | None = None

    def __post_init__(self) -> None:
        if len(self.output_ids) != len(self.output_logprobs):
            raise InvalidTurn(
                f"{len(self.output_ids)} output ids but {len(self.output_logprobs)} logprobs"
            )
        for lp in self.output_logprobs:
            if not isinstance(lp, int | float) or math.isnan(lp) or lp > LOGPROB_ROUNDING:
                raise InvalidTurn(f"logprob {lp!r} is not a log-probability")
        check_version_runs(self.version_runs, len(self.output_ids), self.weight_version)


def check_version_runs(
    runs: Sequence[VersionRun], output_length: int, weight_version: str | None
) -> None:
    """Raise :class:`InvalidTurn` unless ``runs`` start at token 0, advance, change version at
    each run, and end on ``weight_version``."""
    if not runs:
        return
    if runs[0][0] != 0:
        raise InvalidTurn(f"the first version run starts at token {runs[0][0]}, not 0")
    for (start, version), (next_start, next_version) in pairwise(runs):
        if next_start <= start or next_start >= output_length:
            raise InvalidTurn(f"version run at token {next_start} is out of order or past the end")
        if next_version == version:
            raise InvalidTurn(f"two consecutive version runs of {version!r}")
    if runs[-1][1] != weight_version:
        raise InvalidTurn(
            f"the last version run is {runs[-1][1]!r} but the call finished on {weight_version!r}"
        )


PROMPT_MISMATCH = "prompt_mismatch"
"""The ``TurnMeta.extra`` key of a prompt-mismatch reason (written by a renderer): the prompt's
template text differs from the chat template's own render."""
HISTORY_DROPPED = "history_dropped"
"""The ``TurnMeta.extra`` key saying the client sent this request again without the oldest part
of its history after it was refused as too long (how Claude Code and Codex shorten a compaction
request), the task statement among what went: the output was written without the task and is
never trained (:attr:`LossReason.HISTORY_DROPPED`). The value says what was dropped."""
OUTPUT_KEPT = "output_kept"
"""The ``TurnMeta.extra`` key of why an earlier reply in this turn's prompt is kept as the
engine generated it where the chat template would render it differently (the model wrote it
unlike the template, or the client echoed it re-serialized): expected, not a renderer fault."""


@dataclass(frozen=True, slots=True)
class TurnMeta:
    """Request metadata worth keeping next to the tokens.

    ``side_request`` marks calls that are not the policy's work (a session title, say): their
    output is kept for audit and never trained. ``agent_id`` tells sub-agents apart. ``extra``
    holds the rest as strings; its :data:`PROMPT_MISMATCH` entry (the reason a renderer found
    this turn's prompt different from its chat template's own render) and its
    :data:`OUTPUT_KEPT` entry (an earlier reply kept verbatim where the template renders it
    differently) are counted by :func:`~trajectory_tree.summarize`.
    """

    request_id: str = ""
    retry_count: int = 0
    started_at: float = 0.0
    finished_at: float = 0.0
    agent_id: str | None = None
    side_request: bool = False
    malformed_tool_calls: int = 0
    extra: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Turn:
    """One recorded model call.

    The prompt ids are the token path of ``node``'s parent plus the generation prompt, and the
    output ids are the tail of ``node``'s delta: both are read back from the tree
    (:meth:`SessionTree.prompt_ids`, :meth:`SessionTree.output_ids`), never stored twice.
    """

    id: int
    node: int
    prompt_length: int
    output_length: int
    reply: Message
    output_logprobs: array[float]
    finish_reason: FinishReason
    weight_version: str | None
    meta: TurnMeta
    rerendered: str | None = None
    """Why this turn's prompt did not extend its path's tokens, if it did not."""
    version_runs: tuple[VersionRun, ...] = ()
    """Which weight version generated which output tokens (see :class:`Completion`)."""
    routed_experts: RoutedExperts | None = None
    """The call's routing, positions counted from the start of its prompt."""

    def token_versions(self) -> tuple[tuple[int, int, str | None], ...]:
        """``(start, end, version)`` over the output tokens: who generated what."""
        runs = self.version_runs or ((0, self.weight_version),)
        ends = [start for start, _ in runs[1:]] + [self.output_length]
        return tuple((start, end, v) for (start, v), end in zip(runs, ends, strict=True))

    @property
    def versions(self) -> tuple[str | None, ...]:
        """Every weight version that generated some of this turn's output, oldest first."""
        return tuple(v for _, _, v in self.token_versions())
