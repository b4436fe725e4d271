"""`isolation="none"`: commands as plain host processes. NOT a sandbox.

Only for code you wrote yourself (a scripted demo policy, a test of the harness), never for
model-written code: it runs with the caller's uid, files and network. What it keeps is the
process discipline: each command leads its own process group, timeouts and `close()` kill the
groups we started (a group whose leader is already reaped is left alone, since its id may
belong to an unrelated process by then), and rlimits apply through util-linux's `prlimit`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from sandbox._local._commands import CommandSandbox, Launched
from sandbox._spec import ResourceLimits

_RLIMIT_OPTIONS = (
    ("max_open_files", "--nofile", resource.RLIMIT_NOFILE),
    ("max_file_size_bytes", "--fsize", resource.RLIMIT_FSIZE),
    ("cpu_seconds", "--cpu", resource.RLIMIT_CPU),
    ("memory_bytes", "--data", resource.RLIMIT_DATA),
)


class _HostProcess:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self._proc = proc

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    async def wait(self) -> int:
        return await self._proc.wait()

    def kill_group(self) -> None:
        # Only an unreaped leader proves the group id is still ours.
        if self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, signal.SIGKILL)


class HostSandbox(CommandSandbox):
    """Plain host subprocesses in a private state directory; `isolated` is False."""

    def __init__(
        self,
        *,
        state_dir: Path,
        workspace: Path,
        env: Mapping[str, str],
        keep_state: bool,
        prlimit: str | None,
        limits: ResourceLimits,
        endpoint_url: str | None,
        base_repository: str | None = None,
        source_repository: Path | None = None,
    ) -> None:
        super().__init__(
            state_dir=state_dir,
            workspace=str(workspace),
            env=env,
            keep_state=keep_state,
            max_output_bytes=limits.max_output_bytes,
        )
        self._prefix = prlimit_prefix(prlimit, limits)
        self._endpoint_url = endpoint_url
        self._base_repository = base_repository
        self._source_repository = source_repository

    @property
    def endpoint_url(self) -> str | None:
        return self._endpoint_url

    @property
    def isolated(self) -> bool:
        return False

    @property
    def source_repository(self) -> Path | None:
        return self._source_repository

    @property
    def base_repository(self) -> str | None:
        """The source's own git directory: nothing here is out of a command's reach."""
        return self._base_repository

    async def _launch(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str,
        stdio: tuple[int, int, int],
    ) -> Launched:
        stdin, stdout, stderr = stdio
        proc = await asyncio.create_subprocess_exec(
            *self._prefix,
            *argv,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,
        )
        return _HostProcess(proc)

    def host_program_argv(self, path: str) -> tuple[str, ...]:
        """The host's root is the sandbox's: every program runs as it is (no bind names it
        here, the host's paths being the sandbox's)."""
        return (path,)

    def _python(self) -> tuple[Sequence[str], Mapping[str, str]]:
        return (sys.executable,), {"PATH": os.environ.get("PATH", os.defpath), "LC_ALL": "C.UTF-8"}

    async def _kill_all(self) -> int:
        """The process groups we started; a daemon that left its group is not found here
        (without a pid namespace nothing can find it): one more reason never to run
        model-written code without isolation."""
        running = list(self._running)
        for launched in running:
            launched.kill_group()
        await asyncio.gather(*(launched.wait() for launched in running))
        self._running.difference_update(running)
        return 0

    async def _shutdown(self) -> None:
        await self._kill_all()


def _lowered(kind: int, value: int) -> int:
    """A limit can only be lowered: keep ours where it is already below `value`."""
    _, hard = resource.getrlimit(kind)
    return value if hard == resource.RLIM_INFINITY else min(value, hard)


def prlimit_prefix(prlimit: str | None, limits: ResourceLimits) -> list[str]:
    """A `prlimit ... --` prefix for the per-process limits that are set; empty if none."""
    options = [
        f"{option}={_lowered(kind, value)}"
        for field, option, kind in _RLIMIT_OPTIONS
        if (value := getattr(limits, field)) is not None
    ]
    if not options or prlimit is None:
        return []
    return [prlimit, *options, "--"]
