"""The worker's side of the fleet: what it is told, what it reports, and dying with its parent.

A worker is a complete adapter in a process of its own (the ``serve`` command builds it); this
module holds only what makes it a fleet member. Its admin listener is on loopback with the
fleet's internal token, which reaches it inside the pickled plan over the spawn pipe, never
through a file or the command line. It reports where it serves over the same pipe.
"""

from __future__ import annotations

import asyncio
import ctypes
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection

from protocol_adapters._server.config import AdminConfig

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True, slots=True)
class WorkerPlan:
    """What one worker serves on: its index, its agent-facing address (``port`` 0: one the
    kernel picks) and the fleet's internal admin token."""

    index: int
    host: str
    port: int
    admin_token: str

    def __repr__(self) -> str:  # the token stays out of logs and tracebacks
        return f"WorkerPlan(index={self.index}, host={self.host!r}, port={self.port})"

    @property
    def admin(self) -> AdminConfig:
        """Its admin listener: loopback, a port the kernel picks, the internal token."""
        return AdminConfig(self.admin_token, "127.0.0.1", 0)


@dataclass(frozen=True, slots=True)
class Serving:
    """A worker's report once it listens: where agents and the front reach it."""

    url: str
    admin_url: str
    context_tokens: int
    pid: int


@dataclass(frozen=True, slots=True)
class Failed:
    """A worker's report when it cannot start (engine unreachable, template refused, ...)."""

    reason: str


WorkerTarget = Callable[[WorkerPlan, Connection], None]
"""Runs one worker to its end in the spawned process: picklable, so a module-level function
(or a ``functools.partial`` of one)."""


def die_with_parent() -> None:
    """Have the kernel send SIGTERM when the parent dies (Linux ``PR_SET_PDEATHSIG``).

    The parent may be killed with SIGKILL and clean up nothing; a worker left behind would hold
    its port and its engine connections. Elsewhere a no-op: :func:`watch_parent` still works.
    """
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def watch_parent(conn: Connection, stop: Callable[[], None]) -> None:
    """Call ``stop`` when the parent's end of ``conn`` closes.

    The parent never writes after the worker's report, so the pipe becomes readable only at
    end of file: the parent stopped the worker, exited, or died before ``die_with_parent`` took
    hold (a race the signal alone leaves open).
    """
    asyncio.get_running_loop().add_reader(conn.fileno(), stop)
