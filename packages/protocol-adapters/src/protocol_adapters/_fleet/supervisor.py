"""One worker's place in the fleet: the process holding it now, and its restart when it dies.

Workers are spawned (not forked): the ``serve`` process runs an event loop, a fork would copy it
mid-flight. Each start is a new *generation*; a session remembers the generation it was opened
on, so after a restart it answers "lost" instead of reaching a worker that never knew it.
Processes are started from the event loop's thread: ``PR_SET_PDEATHSIG`` fires when the
*thread* that forked the child ends, so a start from a short-lived thread would kill the worker.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.context import SpawnContext, SpawnProcess

from .worker import Failed, Serving, WorkerPlan, WorkerTarget

log = logging.getLogger(__name__)

START_TIMEOUT = 300.0
"""How long a worker may take to load its vocabulary, audit its template and ask the engine."""
STOP_TIMEOUT = 30.0
"""How long a stopping worker may take to close its sessions before it is killed."""
_RESTART_DELAYS = (1.0, 2.0, 5.0, 10.0, 30.0)
"""Waits before restarting a worker that keeps failing: an engine that is down is not hammered."""
_STAYED_UP = 60.0
"""A worker that served this long before dying restarts after the first delay again."""


class WorkerStartFailed(Exception):
    """A worker exited or reported a failure before it served."""


@dataclass(frozen=True, slots=True)
class Running:
    generation: int
    process: SpawnProcess
    serving: Serving
    started: float


async def _readable(fd: int) -> None:
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        loop.remove_reader(fd)


async def _exited(process: SpawnProcess) -> int | None:
    await _readable(process.sentinel)
    process.join()
    return process.exitcode


async def _ended(process: SpawnProcess) -> None:
    """Wait for an ending worker's exit; kill it after :data:`STOP_TIMEOUT`."""
    try:
        await asyncio.wait_for(_exited(process), STOP_TIMEOUT)
    except TimeoutError:
        log.error("%s did not stop in %.0f s: killed", process.name, STOP_TIMEOUT)
        process.kill()
        process.join()


class Slot:
    """Worker ``index``: started by :meth:`start`, kept running by :meth:`supervise`."""

    def __init__(self, plan: WorkerPlan, target: WorkerTarget, context: SpawnContext) -> None:
        self.plan = plan
        self.index = plan.index
        self.current: Running | None = None
        self._target = target
        self._context = context
        self._generation = 0
        self._pipe: Connection | None = None
        self._ready = asyncio.Event()

    async def start(self) -> Running:
        """Spawn the worker and wait for its report; raises :class:`WorkerStartFailed`."""
        self._generation += 1
        here, there = self._context.Pipe()
        process = self._context.Process(
            target=self._target,
            args=(self.plan, there),
            name=f"protocol-adapters-worker-{self.index}",
            daemon=True,
        )
        process.start()
        there.close()  # the worker's end: its exit is then end of file here
        try:
            report = await asyncio.wait_for(self._report(here), START_TIMEOUT)
        except BaseException as exc:
            here.close()
            process.kill()
            process.join()
            if isinstance(exc, (EOFError, TimeoutError)):
                raise WorkerStartFailed(
                    f"worker {self.index} exited with status {process.exitcode} before serving"
                ) from None
            raise
        if isinstance(report, Failed):
            here.close()
            await _ended(process)
            raise WorkerStartFailed(report.reason)
        self._pipe = here  # kept open: closing it tells the worker to stop
        self.current = Running(self._generation, process, report, time.monotonic())
        self._ready.set()
        log.warning(
            "worker %d (pid %d) serving on %s; admin API on %s",
            self.index,
            report.pid,
            report.url,
            report.admin_url,
        )
        return self.current

    @staticmethod
    async def _report(conn: Connection) -> Serving | Failed:
        await _readable(conn.fileno())
        report = conn.recv()
        if not isinstance(report, (Serving, Failed)):
            raise TypeError(f"unexpected report from a worker: {report!r}")
        return report

    async def ready(self, timeout: float) -> Running | None:
        """The running worker, waiting up to ``timeout`` for one being restarted."""
        if self.current is None:
            try:
                await asyncio.wait_for(self._ready.wait(), timeout)
            except TimeoutError:
                return None
        return self.current

    async def supervise(self) -> None:
        """Restart the worker whenever it dies, until cancelled (before :meth:`stop`)."""
        failures = 0
        while True:
            running = self.current
            if running is not None:
                status = await _exited(running.process)
                self._lost()
                log.error(
                    "worker %d (pid %d) exited with status %s: its sessions are lost; restarting",
                    self.index,
                    running.serving.pid,
                    status,
                )
                stayed_up = time.monotonic() - running.started >= _STAYED_UP
                failures = 0 if stayed_up else failures + 1
            await asyncio.sleep(_RESTART_DELAYS[min(failures, len(_RESTART_DELAYS) - 1)])
            try:
                await self.start()
            except WorkerStartFailed as exc:
                failures += 1
                log.error("worker %d did not restart: %s", self.index, exc)

    def _lost(self) -> None:
        self.current = None
        self._ready.clear()
        if self._pipe is not None:
            self._pipe.close()
            self._pipe = None

    async def stop(self) -> None:
        """SIGTERM (the worker closes its sessions), SIGKILL after :data:`STOP_TIMEOUT`.
        Only once :meth:`supervise` is cancelled: both would wait on the process."""
        running = self.current
        self._lost()
        if running is not None:
            running.process.terminate()
            await _ended(running.process)
