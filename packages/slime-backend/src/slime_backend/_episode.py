"""The contract between this package and the app: one episode in, one outcome out.

slime-backend knows nothing about agents, sandboxes or tasks. For every slime sample it opens an
adapter session, calls the app's :class:`Episode` with the task payload (the dataset row's
``metadata``, verbatim), the session and the budgets, and turns the session tree plus the returned
:class:`EpisodeOutcome` into slime samples. An episode that cannot produce a trustworthy reward
(the sandbox never came up, grading crashed) says so with ``EpisodeStatus.ABORTED`` and a reason,
instead of raising: one failed episode must never end the run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

from ._typed_config import FieldError

if TYPE_CHECKING:
    from ._slime_api import SlimeSample

JsonValue = str | int | float | bool | None | Sequence["JsonValue"] | Mapping[str, "JsonValue"]
"""Plain data: what may travel in sample metadata (slime pickles it and ``torch.save``s it)."""


class EpisodeStatus(StrEnum):
    COMPLETED = "completed"
    """The agent finished (or gave up) on its own and the outcome was graded."""
    TRUNCATED = "truncated"
    """A budget (wall clock, turns, context) cut the agent off; the outcome was still graded."""
    ABORTED = "aborted"
    """No trustworthy reward: infrastructure failed. The episode is never trained."""


@dataclass(frozen=True, slots=True)
class Budgets:
    """Limits for one episode. ``max_new_tokens`` is slime's per-call generation cap."""

    wall_clock_s: float
    max_turns: int
    context_tokens: int
    max_new_tokens: int

    def __post_init__(self) -> None:
        if not (math.isfinite(self.wall_clock_s) and self.wall_clock_s > 0):
            raise FieldError("wall_clock_s", f"must be a positive number, got {self.wall_clock_s}")
        for name in ("max_turns", "context_tokens", "max_new_tokens"):
            if getattr(self, name) <= 0:
                raise FieldError(name, f"must be positive, got {getattr(self, name)}")


@dataclass(frozen=True, slots=True)
class AdapterSession:
    """Where the agent reaches the policy: the adapter's URL and this episode's session token.

    The token is the agent CLI's API key; every model call made with it lands in this episode's
    session tree. ``session_id`` names the tree (logs, provenance), never authenticates.
    """

    base_url: str
    token: str = field(repr=False)
    session_id: str


@dataclass(frozen=True, slots=True)
class EpisodeOutcome:
    """What the app reports back. ``artifacts`` are copied into every sample's metadata: keep them
    small and plain (a diff summary, test counts, exit codes), never whole logs."""

    reward: float
    status: EpisodeStatus = EpisodeStatus.COMPLETED
    reason: str = ""
    artifacts: Mapping[str, JsonValue] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not math.isfinite(self.reward):
            raise FieldError("reward", f"must be a finite number, got {self.reward}")
        object.__setattr__(self, "status", EpisodeStatus(self.status))
        if self.status is EpisodeStatus.ABORTED and not self.reason:
            raise FieldError("reason", "an aborted episode must say why")

    @classmethod
    def aborted(cls, reason: str, **artifacts: JsonValue) -> EpisodeOutcome:
        return cls(0.0, EpisodeStatus.ABORTED, reason, artifacts)

    @classmethod
    def from_sample(cls, sample: SlimeSample) -> EpisodeOutcome:
        """The final outcome of the episode ``sample`` belongs to, as the conversion recorded it
        in the sample's provenance: a graded episode left with nothing to train is ``aborted``
        there, its graded reward kept. Raises ``ValueError`` naming the key the provenance lacks
        (a sample not made by slime_backend's generate function)."""
        from ._provenance import read_provenance  # which builds on this module

        return read_provenance(sample).episode.outcome


class Episode(Protocol):
    """The app's episode function (the generate function runs it; see generate.py).

    Two optional methods, looked up by name, let an episode built at import time take part:
    ``configure(settings)`` receives the run's ``BackendSettings`` (agent, sandbox and their
    options, from ``args.agent_rl``) before every episode it runs in a process (make it cheap
    after the first), and ``finished(tree, outcome)`` receives the closed session's tree in a
    worker thread after each episode (to keep it with the episode's artifacts, say).
    """

    async def __call__(
        self,
        task: Mapping[str, JsonValue],
        session: AdapterSession,
        budgets: Budgets,
        *,
        evaluation: bool,
    ) -> EpisodeOutcome: ...
