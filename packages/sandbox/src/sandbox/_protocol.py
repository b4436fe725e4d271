"""The contract every backend implements: an async, E2B-shaped sandbox.

Commands run with `bash -lc` semantics (a login shell, like E2B's envd), so a caller writes
shell, not argv; `start_argv` alone runs a program with no shell in between, for an image that
has none (an agent CLI must still start there). Output of detached processes goes to host files
so a long agent run never sits in memory and survives a crash of the caller's bookkeeping.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Protocol, Self, runtime_checkable

from sandbox._result import ExecResult, ScriptResult
from sandbox._spec import DEFAULT_READ_BYTES, SandboxSpec


@runtime_checkable
class Process(Protocol):
    """A command started detached with `Sandbox.start`."""

    @property
    def stdout_path(self) -> Path:
        """Host file receiving the process's stdout as it is written, up to the spec's
        `ResourceLimits.max_output_bytes` (the process's result then names that limit)."""
        ...

    @property
    def stderr_path(self) -> Path:
        """Host file receiving the process's stderr as it is written."""
        ...

    async def wait(self, timeout: float | None = None) -> ExecResult:
        """Wait for the process to exit; at `timeout` seconds kill it (`timed_out=True`)."""
        ...

    async def kill(self) -> None:
        """Kill the process and its process group; idempotent."""
        ...


@runtime_checkable
class Sandbox(Protocol):
    """One isolated machine for one episode. Use as `async with`; `close()` kills everything."""

    @property
    def workspace(self) -> str:
        """Absolute path of the workspace as seen by commands inside the sandbox."""
        ...

    @property
    def endpoint_url(self) -> str | None:
        """URL under which the spec's forwarded endpoint is reachable inside, if any."""
        ...

    @property
    def isolated(self) -> bool:
        """False when the backend fell back to running commands directly on the host."""
        ...

    @property
    def base_repository(self) -> str | None:
        """Where, inside, the git directory the workspace was checked out from is mounted
        read-only, out of every command's reach (no write, no rename, no replacement); None
        when the sandbox has none (a workspace not from git, E2B)."""
        ...

    @property
    def source_repository(self) -> Path | None:
        """That repository on the host (a GitWorkspace's, or the repository an image keeps
        where its ImageWorkspace is), for `capture_diff`; None with `base_repository`."""
        ...

    async def exec(
        self,
        cmd: str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> ExecResult:
        """Run `cmd` with `bash -lc` and wait; at `timeout` kill its process group."""
        ...

    async def start(
        self,
        cmd: str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Process:
        """Start `cmd` with `bash -lc` detached; output is captured to host files."""
        ...

    async def start_argv(
        self,
        argv: Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        unset_env: Sequence[str] = (),
    ) -> Process:
        """Start `argv` detached with no shell in between (E2B: quoted into envd's shell), in
        the sandbox's environment without `unset_env`, `env` over it; as `start` otherwise."""
        ...

    @property
    def git_argv(self) -> tuple[str, ...]:
        """How this package's own tools start git inside (capturing a change, applying a
        patch): ``("git",)``, the root's own, except on an image that has no git on its PATH,
        where the local backend mounts the host's and starts it like a host program."""
        ...

    def host_program_argv(self, path: str) -> tuple[str, ...]:
        """The argv that starts the host program at `path` (inside; one of the spec's
        `ReadOnlyBind.host_programs`), its arguments to follow: `(path,)` where it runs as it
        is (the host's own root, a static program), `(loader, "--library-path", directory,
        path)` on an image, where it runs on the host's loader and libraries, mounted at
        create time. No variable is set for it (no `LD_LIBRARY_PATH`), so the programs it
        starts run on the image's own. Raises ValueError for a path the spec did not name.
        E2B mounts no host path, nor does `isolation="none"`: there `path` is the template's,
        or the host's, own program, run as it is."""
        ...

    async def kill_all(self) -> None:
        """Kill every process of the sandbox (commands, detached ones, and any daemon they
        left behind) and keep the sandbox open, so what runs next runs alone. Raises
        SandboxCommandError if a process survives."""
        ...

    async def run_python(
        self,
        script: str,
        args: Sequence[str] = (),
        *,
        stdin: bytes = b"",
        timeout: float | None = None,
        max_output_bytes: int = 64 << 20,
    ) -> ScriptResult:
        """Run a Python script of the caller's with an interpreter the sandbox's commands
        cannot replace, isolated (`-I -S`: no site hooks, no user paths, no PYTHON*
        variables), with an empty environment but for PATH, no shell and no rc files, in
        `/`. For work that must not trust anything earlier commands left behind (capturing
        the agent's change, reading a report); pair it with `kill_all` first."""
        ...

    async def read_file(self, path: str, *, max_bytes: int = DEFAULT_READ_BYTES) -> bytes:
        """Read a regular file inside the sandbox, as the sandbox sees it. Raises
        SandboxFileNotFoundError if it is missing, SandboxCommandError if it is not a regular
        file (a FIFO or device planted there would block or never end) or holds more than
        `max_bytes`."""
        ...

    async def read_text(self, path: str, *, max_bytes: int = DEFAULT_READ_BYTES) -> str:
        """`read_file` decoded as UTF-8 (strict: a decoding error is raised, never hidden)."""
        ...

    async def write_file(self, path: str, data: bytes | str) -> None:
        """Write a regular file inside the sandbox, creating parent directories; raises
        SandboxCommandError if the path is something else (a FIFO, a device)."""
        ...

    async def close(self) -> None:
        """Kill every process of the sandbox (detached ones too) and release it; idempotent."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class SandboxBackend(Protocol):
    """A factory of sandboxes of one kind (local bubblewrap, E2B)."""

    async def create(self, spec: SandboxSpec) -> Sandbox:
        """Create and boot a sandbox described by `spec`."""
        ...
