"""One episode through a process's adapter: open a session, run the app, close, report.

Whatever the app's episode does (returns, raises, hangs, lets the engine's outage decide its
fate), :func:`run_episode` returns an :class:`EpisodeReport`: the session tree, final once the
session is closed (what was still generating is aborted and recorded as such), and an outcome.
Faults become an ``ABORTED`` outcome that says why:

- the adapter could not start (the engine is unreachable);
- the episode raised, returned something that is not an :class:`EpisodeOutcome`, or had no
  outcome ``wall_clock_s + grace_s`` seconds after it started (it is cancelled);
- the engine failed the agent's last model call (:mod:`slime_backend._engine_tap`): the agent
  ended without the model, so its reward grades the outage.

The report travels from a Ray worker as plain data (:meth:`EpisodeReport.to_wire`): the tree as
trajectory-tree's JSON with its MoE routing as the binary sidecar beside it (bytes, which Ray
pickles as they are), the outcome and the facts as dicts.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from protocol_adapters import RolloutSampling
from trajectory_tree import SessionTree, dump_routing, dumps, loads

from ._episode import AdapterSession, Budgets, Episode, EpisodeOutcome, EpisodeStatus, JsonValue
from ._runtime import AdapterRuntime, EngineUnavailable

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EpisodeRequest:
    """What one generate call asks a process to run (plain data)."""

    task: Mapping[str, JsonValue]
    session_id: str
    sampling: RolloutSampling
    evaluation: bool = False


@dataclass(frozen=True, slots=True)
class EpisodeReport:
    """The episode's tree, its outcome, and how it ran (``facts``, stored in provenance)."""

    tree: SessionTree
    outcome: EpisodeOutcome
    facts: Mapping[str, JsonValue] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        outcome = self.outcome
        return {
            "tree": dumps(self.tree),
            "routing": dump_routing(self.tree),
            "outcome": {
                "reward": outcome.reward,
                "status": outcome.status.value,
                "reason": outcome.reason,
                "artifacts": dict(outcome.artifacts),
            },
            "facts": dict(self.facts),
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> EpisodeReport:
        outcome = data["outcome"]
        return cls(
            loads(data["tree"], routing=data.get("routing")),
            EpisodeOutcome(
                outcome["reward"],
                EpisodeStatus(outcome["status"]),
                outcome["reason"],
                outcome["artifacts"],
            ),
            data["facts"],
        )


def aborted_report(session_id: str, reason: str, **facts: JsonValue) -> EpisodeReport:
    """A report for an episode that never got a session (or whose run was lost)."""
    return EpisodeReport(SessionTree(session_id), EpisodeOutcome.aborted(reason), facts)


async def run_episode(
    runtime: AdapterRuntime, episode: Episode, request: EpisodeRequest, *, worker: str
) -> EpisodeReport:
    """Run ``request`` with ``episode`` through ``runtime``'s adapter (see the module docstring)."""
    started = time.monotonic()
    try:
        server = await runtime.adapter(request.sampling)
    except EngineUnavailable as exc:
        logger.error("agent-rl episode %s aborted: %s", request.session_id, exc)
        return aborted_report(request.session_id, str(exc), worker=worker)
    session = server.sessions.open(request.session_id)
    settings = runtime.setup.settings.episode
    record = runtime.tap.register(
        request.session_id, max_new_tokens=settings.max_episode_new_tokens
    )
    budgets = Budgets(
        wall_clock_s=settings.wall_clock_s,
        max_turns=settings.max_turns,
        context_tokens=session.context_tokens,
        max_new_tokens=request.sampling.max_new_tokens or session.context_tokens,
    )
    agent_session = AdapterSession(server.url, session.token, request.session_id)
    app_started = time.monotonic()
    try:
        _configure(episode, runtime)
        outcome = await _outcome(episode, request, agent_session, budgets, settings.deadline_s)
    finally:
        app_s = time.monotonic() - app_started
        closed = await server.close_session(session.token)
        runtime.tap.release(request.session_id)
    if outcome.status is not EpisodeStatus.ABORTED and record.last_call_failed:
        outcome = EpisodeOutcome.aborted(
            f"the engine failed the agent's last model call ({record.last_failure}); "
            f"{record.failures} of {record.calls} engine calls failed in this episode"
        )
    if outcome.status is EpisodeStatus.ABORTED:
        logger.warning("agent-rl episode %s aborted: %s", request.session_id, outcome.reason)
    await _finished(episode, closed.tree, outcome)
    facts: dict[str, JsonValue] = {
        "worker": worker,
        "adapter": server.url,
        "engine_calls": record.calls,
        "engine_failures": record.failures,
        "last_engine_failure": record.last_failure,
        "episode_s": round(time.monotonic() - started, 4),
        "app_s": round(app_s, 4),
        "evaluation": request.evaluation,
    }
    return EpisodeReport(closed.tree, outcome, facts)


def _configure(episode: Episode, runtime: AdapterRuntime) -> None:
    """The app's optional `configure(settings)`: the run's settings, before its episodes run
    in this process (the app's episode is built at import time, before slime's args exist)."""
    configure = getattr(episode, "configure", None)
    if configure is not None:
        configure(runtime.setup.settings)


async def _finished(episode: Episode, tree: SessionTree, outcome: EpisodeOutcome) -> None:
    """The app's optional `finished(tree, outcome)`, in a worker thread once the session is
    closed (e.g. to keep the tree with the episode's artifacts); its failure is only logged."""
    finished = getattr(episode, "finished", None)
    if finished is None:
        return
    try:
        await asyncio.to_thread(finished, tree, outcome)
    except Exception:
        logger.exception("the episode's finished() hook failed for %s", tree.session_id)


async def _outcome(
    episode: Episode,
    request: EpisodeRequest,
    session: AdapterSession,
    budgets: Budgets,
    deadline_s: float,
) -> EpisodeOutcome:
    try:
        async with asyncio.timeout(deadline_s) as scope:
            result: object = await episode(
                request.task, session, budgets, evaluation=request.evaluation
            )
    except TimeoutError:
        if not scope.expired():
            return _raised(TimeoutError("the episode raised TimeoutError"))
        return EpisodeOutcome.aborted(
            f"no outcome within {deadline_s:g} s (wall clock {budgets.wall_clock_s:g} s plus "
            "grace): the episode was cancelled"
        )
    except Exception as exc:
        return _raised(exc)
    if not isinstance(result, EpisodeOutcome):
        return EpisodeOutcome.aborted(
            f"the episode returned {type(result).__name__}, not an EpisodeOutcome"
        )
    return result


def _raised(exc: BaseException) -> EpisodeOutcome:
    logger.error("agent-rl episode raised", exc_info=exc)
    return EpisodeOutcome.aborted(f"the episode raised {type(exc).__name__}: {exc}")
