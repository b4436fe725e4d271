"""What the local sandboxes share: commands as `bash -lc`, output in host files, file I/O.

A concrete sandbox says only how to start a process (`_launch`) and how to end them all
(`_shutdown`); deadlines, process-group kills, output capture and the file helpers are here
once. File-system work (opening and reading output files, removing the state directory) runs
in worker threads so a busy disk never stalls the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Protocol, Self

from sandbox._errors import (
    SandboxClosedError,
    SandboxCommandError,
    SandboxFileNotFoundError,
)
from sandbox._private_dirs import remove_tree
from sandbox._result import (
    ExecResult,
    ScriptResult,
    exit_code_from_returncode,
    limit_of_returncode,
)
from sandbox._spec import validate_env

# Exit codes of the file helper scripts (chosen outside the range coreutils use).
_EXIT_MISSING = 44
_EXIT_IS_DIR = 45
_READ_SCRIPT = (
    f'[ -e "$1" ] || exit {_EXIT_MISSING}; [ -d "$1" ] && exit {_EXIT_IS_DIR}; exec cat -- "$1"'
)
_WRITE_SCRIPT = 'mkdir -p -- "$(dirname -- "$1")" && exec cat > "$1"'
_KILL_WAIT = 10.0
_STDERR_BYTES = 64 << 10


class Launched(Protocol):
    """A process started by a sandbox, leading its own process group."""

    @property
    def returncode(self) -> int | None:
        """subprocess-style return code once reaped (negative: killed by that signal)."""
        ...

    async def wait(self) -> int:
        """Wait for the process to be reaped; returns its return code."""
        ...

    def kill_group(self) -> None:
        """SIGKILL the process group, unless the leader is already reaped (never blocks)."""
        ...


class _IoFiles:
    """A command's stdin/stdout/stderr: host files in the sandbox's private state directory."""

    def __init__(self, io_dir: Path, stdin_data: bytes | None) -> None:
        stem = uuid.uuid4().hex
        self.stdout = io_dir / f"{stem}.out"
        self.stderr = io_dir / f"{stem}.err"
        self.stdin = io_dir / f"{stem}.in" if stdin_data is not None else None
        self._stdin_data = stdin_data
        self.fds: tuple[int, int, int] = (-1, -1, -1)

    def open(self) -> tuple[int, int, int]:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        if self.stdin is not None:
            self.stdin.write_bytes(self._stdin_data or b"")
            stdin = os.open(self.stdin, os.O_RDONLY | os.O_CLOEXEC)
        else:
            stdin = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        self.fds = (stdin, os.open(self.stdout, flags, 0o600), os.open(self.stderr, flags, 0o600))
        return self.fds

    def close_fds(self) -> None:
        for fd in self.fds:
            if fd >= 0:
                os.close(fd)
        self.fds = (-1, -1, -1)

    def remove(self) -> None:
        for path in (self.stdout, self.stderr, self.stdin):
            if path is not None:
                path.unlink(missing_ok=True)


class CommandSandbox(ABC):
    """Sandbox operations on top of `_launch`; see sandbox.Sandbox for the contract."""

    def __init__(
        self,
        *,
        state_dir: Path,
        workspace: str,
        env: Mapping[str, str],
        keep_state: bool,
    ) -> None:
        validate_env(env)
        self._state_dir = state_dir
        self._io_dir = state_dir / "io"
        self._workspace = workspace
        self._env = dict(env)
        self._keep_state = keep_state
        self._running: set[Launched] = set()
        self._closed = False
        self._close_lock = asyncio.Lock()

    # -- what a concrete sandbox provides ---------------------------------------------------

    @abstractmethod
    async def _launch(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str,
        stdio: tuple[int, int, int],
    ) -> Launched:
        """Start `argv` in a new session with these descriptors as its stdin/out/err."""

    @property
    @abstractmethod
    def endpoint_url(self) -> str | None:
        """URL under which the spec's forwarded endpoint is reachable inside, if any."""

    @property
    @abstractmethod
    def isolated(self) -> bool:
        """False for plain host processes (isolation="none")."""

    @property
    @abstractmethod
    def base_repository(self) -> str | None:
        """The read-only git directory the workspace came from, as seen inside (see Sandbox)."""

    @abstractmethod
    def _python(self) -> tuple[str, Mapping[str, str]]:
        """The interpreter `run_python` uses inside (one the sandbox cannot have replaced) and
        the only environment it gets."""

    @abstractmethod
    async def _kill_all(self) -> int:
        """SIGKILL every process of the sandbox; how many are still alive afterwards."""

    @abstractmethod
    async def _shutdown(self) -> None:
        """Kill every process of the sandbox and release what backs it (not the state dir)."""

    def _limits_hit_since(self, token: object) -> tuple[str, ...]:
        """Limits the kernel counted since `_limits_token()` (blocking; called in a thread)."""
        return ()

    def _limits_token(self) -> object:
        """A snapshot of the kernel's limit counters (blocking; called in a thread)."""
        return None

    # -- properties -------------------------------------------------------------------------

    @property
    def workspace(self) -> str:
        return self._workspace

    # -- commands ---------------------------------------------------------------------------

    async def exec(
        self,
        cmd: str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> ExecResult:
        return await self._run(["/bin/bash", "-lc", cmd], cwd=cwd, env=env, timeout=timeout)

    async def start(
        self,
        cmd: str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> LocalProcess:
        io = _IoFiles(self._io_dir, None)
        started = time.monotonic()
        token = await asyncio.to_thread(self._limits_token)
        launched = await self._start(["/bin/bash", "-lc", cmd], cwd, env, io)
        return LocalProcess(self, launched, io, started, token)

    async def kill_all(self) -> None:
        self._check_open()
        remaining = await self._kill_all()
        if remaining:
            raise SandboxCommandError(f"{remaining} processes survived SIGKILL in the sandbox")

    async def run_python(
        self,
        script: str,
        args: Sequence[str] = (),
        *,
        stdin: bytes = b"",
        timeout: float | None = None,
        max_output_bytes: int = 64 << 20,
    ) -> ScriptResult:
        python, env = self._python()
        argv = [python, "-I", "-S", "-c", script, *args]
        io = _IoFiles(self._io_dir, stdin)
        started = time.monotonic()
        try:
            launched = await self._start(argv, "/", env, io, inherit_env=False)
            code, timed_out = await self._wait(launched, timeout, kill_on_cancel=True)
            stdout, truncated = await asyncio.to_thread(_read_bounded, io.stdout, max_output_bytes)
            stderr, _ = await asyncio.to_thread(_read_bounded, io.stderr, _STDERR_BYTES)
        finally:
            await asyncio.to_thread(io.remove)
        return ScriptResult(
            exit_code=exit_code_from_returncode(code),
            stdout=stdout,
            stderr=stderr.decode("utf-8", errors="replace"),
            timed_out=timed_out,
            duration=time.monotonic() - started,
            truncated=truncated,
        )

    async def _run(
        self,
        argv: Sequence[str],
        *,
        cwd: str | None,
        env: Mapping[str, str] | None,
        timeout: float | None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        io = _IoFiles(self._io_dir, stdin)
        started = time.monotonic()
        token = await asyncio.to_thread(self._limits_token)
        try:
            launched = await self._start(argv, cwd, env, io)
            code, timed_out = await self._wait(launched, timeout, kill_on_cancel=True)
            return await asyncio.to_thread(self._result, code, timed_out, started, io, token)
        finally:
            await asyncio.to_thread(io.remove)

    async def _start(
        self,
        argv: Sequence[str],
        cwd: str | None,
        env: Mapping[str, str] | None,
        io: _IoFiles,
        *,
        inherit_env: bool = True,
    ) -> Launched:
        self._check_open()
        merged = {**(self._env if inherit_env else {}), **(env or {})}
        validate_env(merged)
        directory = self._resolve(cwd) if cwd is not None else self._workspace
        stdio = await asyncio.to_thread(io.open)
        try:
            launched = await self._launch(argv, merged, directory, stdio)
        finally:
            io.close_fds()
        self._running.add(launched)
        return launched

    async def _wait(
        self, launched: Launched, timeout: float | None, *, kill_on_cancel: bool
    ) -> tuple[int, bool]:
        """Wait for `launched`; past `timeout` kill its group. Returns (exit code, timed out).

        With `kill_on_cancel` a cancelled wait kills the group too: an abandoned `exec` must
        not outlive the caller's interest in it (a detached process may).
        """
        try:
            returncode = await asyncio.wait_for(asyncio.shield(launched.wait()), timeout)
            timed_out = False
        except TimeoutError:
            launched.kill_group()
            returncode = await asyncio.wait_for(launched.wait(), _KILL_WAIT)
            timed_out = True
        except BaseException:
            if kill_on_cancel:
                launched.kill_group()
            raise
        self._running.discard(launched)
        return returncode, timed_out

    def _result(
        self, returncode: int, timed_out: bool, started: float, io: _IoFiles, token: object
    ) -> ExecResult:
        hits = self._limits_hit_since(token) + limit_of_returncode(returncode)
        return ExecResult(
            exit_code=exit_code_from_returncode(returncode),
            stdout=_read_output(io.stdout),
            stderr=_read_output(io.stderr),
            timed_out=timed_out,
            duration=time.monotonic() - started,
            limits_hit=tuple(dict.fromkeys(hits)),
        )

    def _resolve(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(self._workspace, path))

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxClosedError("sandbox is closed")

    # -- files ------------------------------------------------------------------------------

    async def read_file(self, path: str) -> bytes:
        target = self._resolve(path)
        code, data, err = await self._helper(_READ_SCRIPT, target, None)
        if code == _EXIT_MISSING:
            raise SandboxFileNotFoundError(target)
        if code == _EXIT_IS_DIR:
            raise SandboxCommandError(f"is a directory, not a file: {target}")
        if code != 0:
            raise SandboxCommandError(f"reading {target} failed ({code}): {err}")
        return data

    async def read_text(self, path: str) -> str:
        return (await self.read_file(path)).decode("utf-8")

    async def write_file(self, path: str, data: bytes | str) -> None:
        target = self._resolve(path)
        payload = data.encode("utf-8") if isinstance(data, str) else data
        code, _, err = await self._helper(_WRITE_SCRIPT, target, payload)
        if code != 0:
            raise SandboxCommandError(f"writing {target} failed ({code}): {err}")

    async def _helper(
        self, script: str, target: str, stdin: bytes | None
    ) -> tuple[int, bytes, str]:
        """Run a fixed sh script inside the sandbox with the path as $1 (never parsed as shell).

        File I/O goes through the sandbox's own view of the file system on purpose: resolving
        the path on the host would follow symlinks the agent planted to host files.
        """
        io = _IoFiles(self._io_dir, stdin)
        try:
            launched = await self._start(["/bin/sh", "-c", script, "sh", target], None, None, io)
            code, _ = await self._wait(launched, None, kill_on_cancel=True)
            out, err = await asyncio.to_thread(_read_pair, io)
        finally:
            await asyncio.to_thread(io.remove)
        return exit_code_from_returncode(code), out, err.decode(errors="replace").strip()

    # -- lifetime ---------------------------------------------------------------------------

    async def close(self) -> None:
        async with self._close_lock:
            if self._closed:
                return
            self._closed = True
            try:
                await self._shutdown()
            finally:
                self._running.clear()
                if not self._keep_state:
                    await asyncio.to_thread(remove_tree, self._state_dir)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class LocalProcess:
    """A detached command of a local sandbox; output goes to files in the state directory."""

    def __init__(
        self,
        sandbox: CommandSandbox,
        launched: Launched,
        io: _IoFiles,
        started: float,
        token: object,
    ) -> None:
        self._sandbox = sandbox
        self._launched = launched
        self._io = io
        self._started = started
        self._token = token

    @property
    def stdout_path(self) -> Path:
        return self._io.stdout

    @property
    def stderr_path(self) -> Path:
        return self._io.stderr

    @property
    def returncode(self) -> int | None:
        return self._launched.returncode

    async def wait(self, timeout: float | None = None) -> ExecResult:
        code, timed_out = await self._sandbox._wait(self._launched, timeout, kill_on_cancel=False)
        return await asyncio.to_thread(
            self._sandbox._result, code, timed_out, self._started, self._io, self._token
        )

    async def kill(self) -> None:
        self._launched.kill_group()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._launched.wait(), _KILL_WAIT)


def _read_output(path: Path) -> str:
    """Decode captured output; undecodable bytes become U+FFFD (as E2B's SDK does)."""
    try:
        return path.read_bytes().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""


def _read_bounded(path: Path, limit: int) -> tuple[bytes, bool]:
    """At most `limit` bytes of a captured output file, and whether there was more."""
    try:
        with path.open("rb") as stream:
            data = stream.read(limit + 1)
    except FileNotFoundError:
        return b"", False
    return data[:limit], len(data) > limit


def _read_pair(io: _IoFiles) -> tuple[bytes, bytes]:
    return io.stdout.read_bytes(), io.stderr.read_bytes()
