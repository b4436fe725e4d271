"""The live parts of one booted sandbox (bwrap, init and its channel, the cgroup, the uid and
image leases), and how they are taken down, in order."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from dataclasses import dataclass
from pathlib import Path

from sandbox._images import ImageLease
from sandbox._local._cgroups import SandboxCgroup
from sandbox._local._control import InitChannel, InitGoneError
from sandbox._local._uids import UidLease

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Booted:
    """The live parts of one sandbox and how to take them down, in order."""

    state_dir: Path
    process: asyncio.subprocess.Process
    init_pid: int
    pidfd: int
    channel: InitChannel
    host_uid: int
    cgroup: SandboxCgroup | None
    lease: UidLease | None
    image: ImageLease | None = None
    """The cached image the sandbox runs on, held until it is gone."""

    def why_gone(self, gone: InitGoneError) -> InitGoneError:
        """Init died under us: say so plainly when the memory limit is why (a sandbox whose
        tmpfs files fill its memory has nothing else to take from, unless init is exempt)."""
        if self.cgroup is not None and self.cgroup.counters().oom_kills:
            return InitGoneError(
                f"{gone}: the sandbox's memory is full (memory_bytes, tmpfs files included) "
                "and the OOM killer took its init; the sandbox is lost"
            )
        return gone

    async def stop(self) -> None:
        """Kill init (the kernel then kills everything in its pid namespace and init's exit
        reaps them), let bwrap reap init, reap bwrap; then drop cgroups and the uid lease."""
        self.channel.close()
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        try:
            await self.process.wait()
            logger.debug("sandbox %s: bwrap %d reaped", self.state_dir.name, self.process.pid)
        finally:
            os.close(self.pidfd)
            try:
                await asyncio.to_thread(self._release)
            finally:
                if self.image is not None:
                    await self.image.release()

    def _release(self) -> None:
        try:
            if self.cgroup is not None:
                self.cgroup.remove()
        finally:
            if self.lease is not None:
                self.lease.release()
