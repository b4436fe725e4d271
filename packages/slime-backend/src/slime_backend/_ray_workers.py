"""Episodes spread over the Ray cluster: one rollout worker per node, least-loaded first.

With local sandboxes the agents run on the CPUs of the node that runs them, so one node caps how
many episodes can run at once. :class:`RayWorkerPool` starts one :class:`RolloutWorker` actor on
every alive node (or every node holding ``workers.node_resource``), pinned there by node
affinity. Each worker owns its node's adapter (:class:`~slime_backend._runtime.AdapterRuntime`)
and runs the app's episode, so its sandboxes start on its node. The generate function sends each
episode to the worker with the fewest episodes in flight and gets the report back as plain data
(the tree as trajectory-tree JSON).

The report's trip back (JSON
of the tree, Ray's transfer) is timed into the episode's provenance (``ray_hop_s``).

A worker that dies (its process killed, its node lost) fails the calls it held: each of those
episodes comes back ``ABORTED`` with the reason, never an exception in slime's rollout step. The
dead worker leaves the pool, and the next dispatch starts a new one on any alive node without a
worker. Generations the dead worker had running on the engine cannot be aborted from here; they
end at their ``max_new_tokens``.

Ray is imported only when a pool is made (``pip install agent-rl-slime-backend[ray]``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from ._episode import Episode
from ._episode_run import EpisodeReport, EpisodeRequest, aborted_report, run_episode
from ._runtime import AdapterRuntime, RuntimeSetup
from ._settings import WorkerSettings
from ._typed_config import ConfigError

logger = logging.getLogger(__name__)


class RolloutWorker:
    """The actor on one node (created by :class:`RayWorkerPool` with ``ray.remote``); episodes
    it runs name the node it really runs on."""

    def __init__(self, episode: Episode, setup: RuntimeSetup) -> None:
        self._episode = episode
        self._runtime = AdapterRuntime(setup)
        self._node_id = str(_ray().get_runtime_context().get_node_id())

    async def run(self, request: EpisodeRequest) -> dict[str, Any]:
        report = await run_episode(self._runtime, self._episode, request, worker=self._node_id)
        wire = report.to_wire()
        wire["facts"]["reported_at"] = time.time()
        return wire

    async def shutdown(self) -> None:
        await self._runtime.aclose()


@dataclass(slots=True)
class WorkerSlot:
    """One worker as the pool sees it."""

    node_id: str
    actor: Any
    in_flight: int = 0
    alive: bool = True


class RayWorkerPool:
    """Dispatches episodes to one worker per node (see the module docstring)."""

    def __init__(self, episode: Episode, setup: RuntimeSetup, settings: WorkerSettings) -> None:
        ray = _ray()
        if not ray.is_initialized():
            raise ConfigError(
                "workers.mode",
                "'ray' needs a connected Ray runtime (slime's rollout process has one)",
            )
        self._ray = ray
        self._episode = episode
        self._setup = setup
        self._settings = settings
        self._slots: list[WorkerSlot] = []
        self._changed = asyncio.Condition()
        self._stale = True

    @property
    def slots(self) -> tuple[WorkerSlot, ...]:
        """The live workers (for tests and monitoring)."""
        return tuple(s for s in self._slots if s.alive)

    async def run(self, request: EpisodeRequest) -> EpisodeReport:
        slot = await self._acquire()
        if slot is None:
            return aborted_report(
                request.session_id,
                "no Ray node can host a rollout worker"
                + (
                    f" (none holds the resource {self._settings.node_resource!r})"
                    if self._settings.node_resource
                    else ""
                ),
            )
        try:
            wire = await slot.actor.run.remote(request)
            facts = wire["facts"]
            facts["ray_hop_s"] = round(time.time() - facts.pop("reported_at"), 4)
            return EpisodeReport.from_wire(wire)
        except self._ray.exceptions.RayActorError as exc:
            slot.alive = False
            self._stale = True
            logger.error("agent-rl rollout worker on node %s died: %s", slot.node_id, exc)
            return aborted_report(
                request.session_id,
                f"the rollout worker on node {slot.node_id} died during the episode: "
                f"{_first_line(exc)}",
                worker=slot.node_id,
            )
        except Exception as exc:  # a bug on the worker's side must not end the rollout
            logger.exception("agent-rl rollout worker on node %s failed", slot.node_id)
            return aborted_report(
                request.session_id,
                f"the rollout worker on node {slot.node_id} failed: {type(exc).__name__}: "
                f"{_first_line(exc)}",
                worker=slot.node_id,
            )
        finally:
            async with self._changed:
                slot.in_flight -= 1
                self._changed.notify_all()

    async def _acquire(self) -> WorkerSlot | None:
        """The least-loaded live worker with room, waiting for room; None without workers."""
        async with self._changed:
            while True:
                if self._stale:
                    await self._refresh()
                live = self.slots
                if not live:
                    return None
                cap = self._settings.max_episodes_per_worker
                open_slots = [s for s in live if cap is None or s.in_flight < cap]
                if open_slots:
                    slot = min(open_slots, key=lambda s: s.in_flight)
                    slot.in_flight += 1
                    return slot
                await self._changed.wait()

    async def _refresh(self) -> None:
        """Start a worker on every eligible node that has none."""
        self._stale = False
        self._slots = [s for s in self._slots if s.alive]
        hosted = {s.node_id for s in self._slots}
        nodes = await asyncio.to_thread(self._ray.nodes)
        resource = self._settings.node_resource
        strategy = self._ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy
        actor_class = self._ray.remote(RolloutWorker)
        for node in nodes:
            node_id = node["NodeID"]
            if not node.get("Alive") or node_id in hosted:
                continue
            if resource is not None and node.get("Resources", {}).get(resource, 0) <= 0:
                continue
            actor = actor_class.options(
                num_cpus=0,
                scheduling_strategy=strategy(node_id, soft=False),
                max_concurrency=_MAX_CONCURRENCY,
            ).remote(self._episode, self._setup)
            self._slots.append(WorkerSlot(node_id, actor))
            logger.info("agent-rl rollout worker started on node %s", node_id)

    async def aclose(self) -> None:
        """Close every worker's adapter, then end the workers."""
        live = self.slots
        await asyncio.gather(*(s.actor.shutdown.remote() for s in live), return_exceptions=True)
        for slot in live:
            self._ray.kill(slot.actor)
            slot.alive = False


_MAX_CONCURRENCY = 10_000
"""Episodes one worker may hold at once (Ray's default for async actors is 1,000)."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _ray() -> Any:
    try:
        import ray  # type: ignore[import-not-found, unused-ignore]  # an optional extra
        import ray.util.scheduling_strategies  # type: ignore[import-not-found, unused-ignore]
    except ImportError as exc:
        raise ConfigError(
            "workers.mode", "'ray' needs Ray installed (pip install agent-rl-slime-backend[ray])"
        ) from exc
    return ray
