"""Silent-failure gates: batch-level alarms for the failures that otherwise look like training.

Runs that "train" on nothing are the expensive kind of bug: an adapter that drops every tool call,
a parser that turns every call into text, an infrastructure fault that aborts most episodes. Each
step still produces a loss. So every rollout batch is checked for these shares of episodes:

- ``zero_trainable``: episodes whose samples train no token (aborted ones, and graded ones left
  with nothing to train, included);
- ``zero_tool_calls``: episodes that ran (were graded) but made no well-formed tool call;
- ``tool_call_parse_failures``: episodes that ran and whose share of malformed tool calls
  (``malformed / (well-formed + malformed)``) exceeds ``parse_failure_rate``;
- ``aborts``: episodes aborted without a reward, whatever the cause (the engine, the sandbox,
  grading, a worker, the environment);
- ``environment_aborts``: episodes aborted because their task's environment failed (an image
  that cannot be pulled, a sandbox that cannot boot, a test runner that cannot start: the
  episode's reason starts with ``environment``), the run that "trains" on nothing because
  its tasks never ran;
- ``length_drops``: graded episodes the sample length limit left with nothing to train
  (``length_mode = "drop"``): the policy's own doing, so counted apart from the faults;
- ``routing_missing``: episodes with a sample refused for routing replay (slime's
  ``--use-rollout-routing-replay`` on, and the engine returned no routing, or not for every
  token): a run whose engine does not capture routing trains on nothing but says so here.

A share above its limit trips the gate, and a tripped gate stops the step by default
(``fail_step``; ``fail_step = false`` lowers it to an error in the log and a mark in the dump).
A tripped gate names its causes: the aborted episodes' reasons, counted by their first word
(``environment``, ``sandbox``, ``nothing_trainable``, ...), with an example, so the alarm says
what broke, not only how much.

A graded episode with nothing to train (no model call, every call aborted, every sample dropped
by the length limit) is recorded as aborted with the reason ``nothing_trainable: <kind>: ...``
and its graded reward kept (:data:`NOTHING_TRAINABLE`): it counts in ``zero_trainable`` (and
``length_drops``), among the episodes that ran, and not in ``aborts``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from ._episode import EpisodeStatus, JsonValue
from ._provenance import EpisodeProvenance, read_provenance
from ._slime_api import SlimeSample
from ._typed_config import FieldError


@dataclass(frozen=True, slots=True)
class GateConfig:
    """Limits are shares of episodes in one rollout batch, in [0, 1]. A tripped gate raises
    :class:`SilentFailureAlarm`, which fails slime's step and stops the run; ``fail_step =
    false`` lowers it to a warning (an error in the log, the report in every sample's metadata,
    the step trained)."""

    max_zero_trainable_share: float = 0.2
    max_zero_tool_call_share: float = 0.5
    parse_failure_rate: float = 0.2
    max_parse_failure_share: float = 0.2
    max_abort_share: float = 0.2
    max_environment_abort_share: float = 0.5
    max_length_drop_share: float = 0.2
    max_routing_missing_share: float = 0.2
    fail_step: bool = True

    def __post_init__(self) -> None:
        for name in (
            "max_zero_trainable_share",
            "max_zero_tool_call_share",
            "parse_failure_rate",
            "max_parse_failure_share",
            "max_abort_share",
            "max_environment_abort_share",
            "max_length_drop_share",
            "max_routing_missing_share",
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
    routing_refused: int = 0
    """Samples not trained because their routing could not be replayed."""

    @classmethod
    def from_sample(cls, sample: SlimeSample) -> EpisodeHealth:
        """The health of the episode ``sample`` belongs to, from the provenance slime_backend's
        generate function wrote on it (the same on each of the episode's samples). Raises
        ``ValueError`` naming the key its provenance lacks (a sample not made by that function).
        """
        return health_of(read_provenance(sample).episode)

    @property
    def nothing_trainable(self) -> str | None:
        """For a graded episode left with nothing to train: the kind (``no_turns``,
        ``aborted_turns``, ``length_drop``, ...); None otherwise."""
        if self.status is not EpisodeStatus.ABORTED:
            return None
        head, _, rest = self.reason.partition(":")
        if head.strip() != NOTHING_TRAINABLE:
            return None
        return rest.split(":", 1)[0].strip() or "unknown"

    @property
    def ran(self) -> bool:
        """The episode was graded (aborted ones were not, except those with nothing to train)."""
        return self.status is not EpisodeStatus.ABORTED or self.nothing_trainable is not None

    @property
    def aborted(self) -> bool:
        """Aborted without a reward (a fault, not the policy)."""
        return not self.ran

    @property
    def abort_cause(self) -> str | None:
        """An aborted episode's cause: its reason's first word (``environment``, ``sandbox``,
        ``nothing_trainable``, ...), or None for an episode that was not aborted."""
        if self.status is not EpisodeStatus.ABORTED:
            return None
        head = self.reason.split(":", 1)[0].strip().lower()
        return head if head and len(head) <= 40 else "unknown"

    @property
    def environment_failed(self) -> bool:
        return self.abort_cause == ENVIRONMENT_CAUSE

    @property
    def length_dropped(self) -> bool:
        return self.nothing_trainable == LENGTH_DROP

    @property
    def parse_failure_rate(self) -> float:
        attempts = self.tool_calls + self.malformed_tool_calls
        return self.malformed_tool_calls / attempts if attempts else 0.0


def health_of(episode: EpisodeProvenance) -> EpisodeHealth:
    """What the gates read of an episode's provenance."""
    return EpisodeHealth(
        status=episode.status,
        trained_tokens=episode.trained_tokens,
        tool_calls=episode.tool_calls,
        malformed_tool_calls=episode.malformed_tool_calls,
        reason=episode.reason,
        routing_refused=len(episode.routing.refused),
    )


ENVIRONMENT_CAUSE = "environment"
"""The first word of the reason of an episode aborted for its task's environment."""
NOTHING_TRAINABLE = "nothing_trainable"
"""The first word of the reason of a graded episode left with nothing to train; the second is
its kind (:data:`NOTHING_TRAINABLE_KINDS`)."""
LENGTH_DROP = "length_drop"
ROUTING_MISSING = "routing_missing"
NOTHING_TRAINABLE_KINDS = {
    "no_turns": "the agent made no model call",
    "nothing_generated": "the engine generated no token",
    "aborted_turns": "every model call was aborted",
    LENGTH_DROP: "every trained token was past the sample length limit",
    "excluded": "every generated token was excluded from training",
    ROUTING_MISSING: "routing replay is on and no sample has routing for every token",
}
"""Why a graded episode has nothing to train, by kind."""


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
    """A rollout batch tripped a gate (with ``fail_step``, the default): the step fails."""

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
                "aborts",
                [e for e in everyone if e.aborted],
                len(everyone),
                config.max_abort_share,
            ),
            _result(
                "environment_aborts",
                [e for e in everyone if e.environment_failed],
                len(everyone),
                config.max_environment_abort_share,
            ),
            _result(
                "length_drops",
                [e for e in everyone if e.length_dropped],
                len(everyone),
                config.max_length_drop_share,
            ),
            _result(
                "routing_missing",
                [e for e in everyone if e.routing_refused],
                len(everyone),
                config.max_routing_missing_share,
            ),
        )
    )
