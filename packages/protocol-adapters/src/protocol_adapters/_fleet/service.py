"""The fleet as a whole: N workers started together, supervised, and the one admin API.

Ports: worker ``i`` serves agents on ``port + i``, or on a port the kernel picks when ``port``
is 0; either way the worker reports the address it bound over its pipe, and the admin API hands
it out with each session (``base_url``). Fixed ports because a node's forwarding rules and
firewalls name ports, and a restarted worker comes back on the same address; 0 because tests
and ad-hoc runs must not collide.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import secrets
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from protocol_adapters._server.config import AdminConfig

from .front import create_front_app
from .supervisor import Slot, WorkerStartFailed
from .worker import WorkerPlan, WorkerTarget

log = logging.getLogger("protocol_adapters")


class FleetError(Exception):
    """The fleet could not start: a worker failed before serving (the reason is its own)."""


@dataclass(frozen=True, slots=True)
class FleetConfig:
    processes: int
    host: str
    """Every worker's agent-facing address (loopback by default)."""
    port: int
    """Worker ``i`` on ``port + i``; 0: ports the kernel picks."""
    admin: AdminConfig
    """The caller's admin API: its token, address and port (served by the fleet's process)."""

    def __post_init__(self) -> None:
        if self.processes < 1:
            raise ValueError(f"processes must be >= 1, got {self.processes}")
        last = self.port + self.processes - 1
        if self.port and last > 65535:
            raise ValueError(f"ports {self.port}-{last}: past 65535")
        if self.port and self.admin.port in range(self.port, last + 1):
            raise ValueError(
                f"the admin port {self.admin.port} is one of the workers' ports {self.port}-{last}"
            )


async def serve_fleet(config: FleetConfig, target: WorkerTarget, stop: asyncio.Event) -> None:
    """Start ``config.processes`` workers (each ``target`` in a spawned process), serve the
    admin API in front of them until ``stop`` is set, then stop them all.

    Raises :class:`FleetError` when a worker cannot start; the others are stopped first.
    """
    internal_token = secrets.token_urlsafe(32)
    spawn = multiprocessing.get_context("spawn")
    slots = [
        Slot(
            WorkerPlan(i, config.host, config.port + i if config.port else 0, internal_token),
            target,
            spawn,
        )
        for i in range(config.processes)
    ]
    supervisors: list[asyncio.Task[None]] = []
    front: web.AppRunner | None = None
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=5.0)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
        try:
            started = await asyncio.gather(*(s.start() for s in slots), return_exceptions=True)
            failed = [r for r in started if isinstance(r, BaseException)]
            if failed:
                if isinstance(failed[0], WorkerStartFailed):
                    raise FleetError(str(failed[0]))
                raise failed[0]
            supervisors = [asyncio.create_task(s.supervise()) for s in slots]
            app = create_front_app(config.admin.token, internal_token, slots, http)
            front = web.AppRunner(app, handler_cancellation=True, access_log=None)
            await front.setup()
            await web.TCPSite(front, config.admin.host, config.admin.port).start()
            admin_host, admin_port = front.addresses[0][:2]
            first = started[0]
            assert not isinstance(first, BaseException)
            log.warning(
                "%d processes serving on %s; admin API on http://%s:%d; context %d tokens",
                config.processes,
                " ".join(r.serving.url for r in started if not isinstance(r, BaseException)),
                admin_host,
                admin_port,
                first.serving.context_tokens,
            )
            await stop.wait()
        finally:
            if front is not None:
                await front.cleanup()
            for task in supervisors:
                task.cancel()
            for task in supervisors:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await asyncio.gather(*(s.stop() for s in slots))
