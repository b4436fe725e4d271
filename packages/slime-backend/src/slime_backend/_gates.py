"""Silent-failure gates: batch-level alarms for the failures that otherwise look like training.

Runs that "train" on nothing are the expensive kind of bug: an adapter that drops every tool call,
a parser that turns every call into text, an infrastructure fault that aborts most episodes. Each
step still produces a loss. So every rollout batch is checked for three shares of episodes:

- ``zero_trainable``: episodes whose samples train no token (aborted ones included);
- ``zero_tool_calls``: episodes that ran but made no well-formed tool call;
- ``tool_call_parse_failures``: episodes that ran and whose share of malformed tool calls
  (``malformed / (well-formed + malformed)``) exceeds ``parse_failure_rate``;
- ``environment_aborts``: episodes aborted because their task's environment failed (an image
  that cannot be pulled, a sandbox that cannot boot, a test runner that cannot start: the
  episode's reason starts with ``environment``), the run that "trains" on nothing because
  its tasks never ran.

A share above its limit trips the gate. A tripped gate names its causes: the aborted
episodes' reasons, counted by their first word (``environment``, ``sandbox``, ...), with an
example, so the alarm says what broke, not only how much.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from ._episode import EpisodeStatus, JsonValue
from ._typed_config import FieldError


@dataclass(frozen=True, slots=True)
class GateConfig:
    """Limits are shares of episodes in one rollout batch, in [0, 1]; ``fail_step`` makes a
    tripped gate raise :class:`SilentFailureAlarm` (which stops slime's run) instead of only
    logging and marking the samples."""

    max_zero_trainable_share: float = 0.2
    max_zero_tool_call_share: float = 0.5
    parse_failure_rate: float = 0.2
    max_parse_failure_share: float = 0.2
    max_environment_abort_share: float = 0.5
    fail_step: bool = False

    def __post_init__(self) -> None:
        for name in (
            "max_zero_trainable_share",
            "max_zero_tool_call_share",
            "parse_failure_rate",
            "max_parse_failure_share",
            "max_environment_abort_share",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0.0 <= value <= 1.0):
                raise FieldError(name, f"must be a share between 0 and 1, got {value}")


@dataclass(frozen=True, slots=True)
class EpisodeHealth:
    """The numbers the gates read for one episode (from its samples' provenance)."""

    status: EpisodeStatus
    trained_tokens: int
    tool_calls: int
    malformed_tool_calls: int
    reason: str = ""
    """The episode's outcome reason (for an aborted one: why it has no reward)."""

    @property
    def ran(self) -> bool:
        return self.status is not EpisodeStatus.ABORTED

    @property
    def abort_cause(self) -> str | None:
        """An aborted episode's cause: its reason's first word (``environment``, ``sandbox``,
        ...), or None for an episode that ran."""
        if self.ran:
            return None
        head = self.reason.split(":", 1)[0].strip().lower()
        return head if head and len(head) <= 40 else "unknown"

    @property
    def environment_failed(self) -> bool:
        return self.abort_cause == ENVIRONMENT_CAUSE

    @property
    def parse_failure_rate(self) -> float:
        attempts = self.tool_calls + self.malformed_tool_calls
        return self.malformed_tool_calls / attempts if attempts else 0.0


ENVIRONMENT_CAUSE = "environment"
"""The first word of the reason of an episode aborted for its task's environment."""


@dataclass(frozen=True, slots=True)
class GateResult:
    name: str
    offending: int
    episodes: int
    limit: float
    causes: tuple[tuple[str, int], ...] = ()
    """The offending episodes' abort causes, most common first (aborted ones only)."""
    example: str = ""
    """One offending episode's reason, of the most common cause."""

    @property
    def share(self) -> float:
        return self.offending / self.episodes if self.episodes else 0.0

    @property
    def tripped(self) -> bool:
        return self.share > self.limit


@dataclass(frozen=True, slots=True)
class GateReport:
    results: tuple[GateResult, ...]

    @property
    def tripped(self) -> tuple[GateResult, ...]:
        return tuple(r for r in self.results if r.tripped)

    def as_dict(self) -> dict[str, JsonValue]:
        return {
            r.name: {
                "share": r.share,
                "limit": r.limit,
                "offending": r.offending,
                "episodes": r.episodes,
                "tripped": r.tripped,
                "causes": dict(r.causes),
                "example": r.example,
            }
            for r in self.results
        }

    def describe(self) -> str:
        return "; ".join(
            f"{r.name}: {r.offending}/{r.episodes} episodes ({r.share:.0%}) > limit {r.limit:.0%}"
            + _causes(r)
            for r in self.tripped
        )


def _causes(result: GateResult) -> str:
    if not result.causes:
        return ""
    counted = ", ".join(f"{cause} {count}" for cause, count in result.causes)
    example = f", e.g. {result.example[:300]!r}" if result.example else ""
    return f" (aborted: {counted}{example})"


class SilentFailureAlarm(RuntimeError):
    """A rollout batch tripped a gate configured with ``fail_step``."""

    def __init__(self, report: GateReport) -> None:
        super().__init__(f"agent-rl silent-failure gate tripped: {report.describe()}")
        self.report = report


def _result(name: str, offending: list[EpisodeHealth], episodes: int, limit: float) -> GateResult:
    counts = Counter(e.abort_cause for e in offending if e.abort_cause is not None)
    causes = tuple(counts.most_common(5))
    example = ""
    if causes:
        top = causes[0][0]
        example = next(e.reason for e in offending if e.abort_cause == top)
    return GateResult(name, len(offending), episodes, limit, causes, example)


def evaluate_gates(episodes: Iterable[EpisodeHealth], config: GateConfig) -> GateReport:
    everyone = list(episodes)
    ran = [e for e in everyone if e.ran]
    return GateReport(
        (
            _result(
                "zero_trainable",
                [e for e in everyone if e.trained_tokens == 0],
                len(everyone),
                config.max_zero_trainable_share,
            ),
            GateResult(
                "zero_tool_calls",
                sum(1 for e in ran if e.tool_calls == 0),
                len(ran),
                config.max_zero_tool_call_share,
            ),
            GateResult(
                "tool_call_parse_failures",
                sum(1 for e in ran if e.parse_failure_rate > config.parse_failure_rate),
                len(ran),
                config.max_parse_failure_share,
            ),
            _result(
                "environment_aborts",
                [e for e in everyone if e.environment_failed],
                len(everyone),
                config.max_environment_abort_share,
            ),
        )
    )
