"""What the local sandboxes share: commands as `bash -lc`, output in host files, file I/O.

A concrete sandbox says only how to start a process (`_launch`) and how to end them all
(`_shutdown`); deadlines, process-group kills, output capture and the file helpers are here
once. File-system work (opening and reading output files, removing the state directory) runs
in worker threads so a busy disk never stalls the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
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
from sandbox._local._output import PipeDrain
from sandbox._local._private_dirs import remove_tree
from sandbox._result import (
    ExecResult,
    ScriptResult,
    exit_code_from_returncode,
    limit_of_returncode,
)
from sandbox._spec import DEFAULT_READ_BYTES, validate_env

# Exit codes of the file helpers (chosen outside the range Python and coreutils use).
_EXIT_MISSING = 44
_EXIT_IS_DIR = 45
_EXIT_NOT_REGULAR = 46
_EXIT_TOO_LARGE = 47
# The helpers open the path inside the sandbox once, without blocking (a FIFO planted there
# would hang a plain open), and act only on what that open found to be a regular file.
_READ_SCRIPT = f"""
import os, stat, sys
path, limit = sys.argv[1], int(sys.argv[2])
try:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
except FileNotFoundError:
    sys.exit({_EXIT_MISSING})
info = os.fstat(fd)
if stat.S_ISDIR(info.st_mode):
    sys.exit({_EXIT_IS_DIR})
if not stat.S_ISREG(info.st_mode):
    sys.exit({_EXIT_NOT_REGULAR})
if info.st_size > limit:
    sys.exit({_EXIT_TOO_LARGE})
while chunk := os.read(fd, 1 << 20):
    sys.stdout.buffer.write(chunk)
"""
_WRITE_SCRIPT = f"""
import os, stat, sys
path = sys.argv[1]
os.makedirs(os.path.dirname(path), exist_ok=True)
try:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK, 0o666)
except IsADirectoryError:
    sys.exit({_EXIT_IS_DIR})
except OSError as error:
    if error.errno == 6:  # ENXIO: a FIFO nobody reads
        sys.exit({_EXIT_NOT_REGULAR})
    raise
if not stat.S_ISREG(os.fstat(fd).st_mode):
    sys.exit({_EXIT_NOT_REGULAR})
os.set_blocking(fd, True)
os.ftruncate(fd, 0)
view = memoryview(sys.stdin.buffer.read())
while view:
    view = view[os.write(fd, view):]
"""
_FILE_HELPER_TIMEOUT = 300.0
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
    """A command's stdin, a sealed memory file (no host path for `/proc/*/fd` to show, and no
    way to write to it), and its stdout and stderr, pipes the host reads into files of the
    sandbox's private state directory, each cut at its limit (_output.py)."""

    def __init__(
        self, io_dir: Path, stdin_data: bytes | None, limits: tuple[int | None, int | None]
    ) -> None:
        stem = uuid.uuid4().hex
        self.stdout = io_dir / f"{stem}.out"
        self.stderr = io_dir / f"{stem}.err"
        self._stdin_data = stdin_data
        self._limits = limits
        self.fds: tuple[int, int, int] = (-1, -1, -1)
        """What the command gets as stdin, stdout and stderr (closed here once it has them)."""
        self._pending: list[tuple[int, int]] = []
        self.drains: list[PipeDrain] = []

    def open(self) -> tuple[int, int, int]:
        """Create the files and pipes (file-system work: run in a worker thread)."""
        opened: list[int] = []
        try:
            if self._stdin_data is not None:
                opened.append(_sealed_memfd(self._stdin_data))
            else:
                opened.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
            for path in (self.stdout, self.stderr):
                read_end, write_end = os.pipe2(os.O_CLOEXEC)
                opened += (read_end, write_end)
                flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
                opened.append(os.open(path, flags, 0o600))
        except BaseException:
            for fd in opened:
                os.close(fd)
            raise
        stdin, out_read, out_write, out_file, err_read, err_write, err_file = opened
        self._pending = [(out_read, out_file), (err_read, err_file)]
        self.fds = (stdin, out_write, err_write)
        return self.fds

    def start_draining(self) -> None:
        """The command holds its ends now: read ours on the event loop."""
        self.drains = [
            PipeDrain(read_end, file, limit)
            for (read_end, file), limit in zip(self._pending, self._limits, strict=True)
        ]
        self._pending = []

    def settle(self) -> None:
        """The command has exited: keep what it left in the pipes, nothing after."""
        for drain in self.drains:
            drain.settle()

    @property
    def truncated(self) -> bool:
        return any(drain.truncated for drain in self.drains)

    @property
    def drained(self) -> bool:
        """Every writer of both pipes has closed them (no background process holds one)."""
        return not self._pending and all(drain.closed for drain in self.drains)

    def close_fds(self) -> None:
        for fd in self.fds:
            if fd >= 0:
                os.close(fd)
        self.fds = (-1, -1, -1)

    def close(self) -> None:
        """Release every descriptor (the command's copies, ours, the drains'); idempotent."""
        self.close_fds()
        for read_end, file in self._pending:
            os.close(read_end)
            os.close(file)
        self._pending = []
        for drain in self.drains:
            drain.close()

    def remove(self) -> None:
        for path in (self.stdout, self.stderr):
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
        max_output_bytes: int | None,
        host_programs: Mapping[str, Sequence[str]] | None = None,
        git_argv: Sequence[str] = ("git",),
    ) -> None:
        validate_env(env)
        self._max_output = max_output_bytes
        self._state_dir = state_dir
        self._io_dir = state_dir / "io"
        self._workspace = workspace
        self._env = dict(env)
        self._keep_state = keep_state
        self._host_programs = {path: tuple(argv) for path, argv in (host_programs or {}).items()}
        self._git_argv = tuple(git_argv)
        self._running: set[Launched] = set()
        self._open_io: set[_IoFiles] = set()
        """Output pipes of commands still running, or held by a background process after the
        command exited; closed with the sandbox."""
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

    @property
    @abstractmethod
    def source_repository(self) -> Path | None:
        """That repository on the host (see Sandbox)."""

    @abstractmethod
    def _python(self) -> tuple[Sequence[str], Mapping[str, str]]:
        """The command that starts the interpreter `run_python` uses inside (one the sandbox
        cannot have replaced) and the only environment it gets."""

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

    @property
    def git_argv(self) -> tuple[str, ...]:
        return self._git_argv

    def host_program_argv(self, path: str) -> tuple[str, ...]:
        try:
            return self._host_programs[path]
        except KeyError:
            declared = ", ".join(sorted(self._host_programs)) or "none"
            raise ValueError(
                f"{path} is not a host program of this sandbox (ReadOnlyBind.host_programs; "
                f"declared: {declared})"
            ) from None

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
        io = _IoFiles(self._io_dir, None, (self._max_output, self._max_output))
        started = time.monotonic()
        token = await asyncio.to_thread(self._limits_token)
        launched = await self._start(["/bin/bash", "-lc", cmd], cwd, env, io)
        return LocalProcess(self, launched, io, started, token)

    async def start_argv(
        self,
        argv: Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        unset_env: Sequence[str] = (),
    ) -> LocalProcess:
        if not argv:
            raise ValueError("empty argv")
        io = _IoFiles(self._io_dir, None, (self._max_output, self._max_output))
        started = time.monotonic()
        token = await asyncio.to_thread(self._limits_token)
        launched = await self._start(argv, cwd, env, io, unset_env=unset_env)
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
        argv = [*python, "-I", "-S", "-c", script, *args]
        io = _IoFiles(self._io_dir, stdin, (max_output_bytes, _STDERR_BYTES))
        started = time.monotonic()
        try:
            launched = await self._start(argv, "/", env, io, inherit_env=False)
            code, timed_out = await self._wait(launched, timeout, kill_on_cancel=True)
            self._settle(io)
            stdout, stderr = await asyncio.to_thread(_read_pair, io)
        finally:
            self._settle(io)
            await asyncio.to_thread(io.remove)
        return ScriptResult(
            exit_code=exit_code_from_returncode(code),
            stdout=stdout,
            stderr=stderr.decode("utf-8", errors="replace"),
            timed_out=timed_out,
            duration=time.monotonic() - started,
            truncated=io.drains[0].truncated,
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
        io = _IoFiles(self._io_dir, stdin, (self._max_output, self._max_output))
        started = time.monotonic()
        token = await asyncio.to_thread(self._limits_token)
        try:
            launched = await self._start(argv, cwd, env, io)
            code, timed_out = await self._wait(launched, timeout, kill_on_cancel=True)
            self._settle(io)
            return await asyncio.to_thread(self._result, code, timed_out, started, io, token)
        finally:
            self._settle(io)
            await asyncio.to_thread(io.remove)

    async def _start(
        self,
        argv: Sequence[str],
        cwd: str | None,
        env: Mapping[str, str] | None,
        io: _IoFiles,
        *,
        inherit_env: bool = True,
        unset_env: Sequence[str] = (),
    ) -> Launched:
        self._check_open()
        base = {k: v for k, v in self._env.items() if k not in unset_env} if inherit_env else {}
        merged = {**base, **(env or {})}
        validate_env(merged)
        directory = self._resolve(cwd) if cwd is not None else self._workspace
        stdio = await asyncio.to_thread(io.open)
        try:
            launched = await self._launch(argv, merged, directory, stdio)
        except BaseException:
            io.close()
            raise
        io.close_fds()
        io.start_draining()
        self._open_io.add(io)
        self._running.add(launched)
        return launched

    async def _wait(
        self, launched: Launched, timeout: float | None, *, kill_on_cancel: bool
    ) -> tuple[int, bool]:
        """Wait for `launched`; past `timeout` kill its group. Returns (exit code, timed out).

        With `kill_on_cancel` a cancelled wait kills the group too: an abandoned `exec` must
        not outlive the caller's interest in it (a detached process may).
        """
        waiting = asyncio.ensure_future(launched.wait())
        try:
            # asyncio.timeout, never wait_for: Python 3.11's wait_for returns the result of an
            # awaitable that has just finished even when its caller was cancelled meanwhile, so
            # an interrupted run's episode would carry on to its end.
            async with asyncio.timeout(timeout):
                returncode = await asyncio.shield(waiting)
            timed_out = False
        except TimeoutError:
            waiting.add_done_callback(_retrieve)
            launched.kill_group()
            returncode = await asyncio.wait_for(launched.wait(), _KILL_WAIT)
            timed_out = True
        except BaseException:
            if kill_on_cancel:
                launched.kill_group()
            # Nobody awaits the shielded wait now: its end (the sandbox may close first) is
            # retrieved here, never logged as "Task exception was never retrieved".
            waiting.add_done_callback(_retrieve)
            raise
        self._running.discard(launched)
        return returncode, timed_out

    def _settle(self, io: _IoFiles) -> None:
        """The command of `io` is done (or abandoned): keep what it wrote, nothing after, and
        release its pipes unless a background process still holds one (then at close)."""
        io.settle()
        if io.drained:
            io.close()
            self._open_io.discard(io)

    def _result(
        self, returncode: int, timed_out: bool, started: float, io: _IoFiles, token: object
    ) -> ExecResult:
        hits = self._limits_hit_since(token) + limit_of_returncode(returncode)
        if io.truncated:
            hits += ("max_output_bytes",)
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

    async def read_file(self, path: str, *, max_bytes: int = DEFAULT_READ_BYTES) -> bytes:
        target = self._resolve(path)
        result = await self.run_python(
            _READ_SCRIPT,
            [target, str(max_bytes)],
            timeout=_FILE_HELPER_TIMEOUT,
            max_output_bytes=max_bytes,
        )
        if result.exit_code == _EXIT_MISSING:
            raise SandboxFileNotFoundError(target)
        self._check_file_helper(result, "reading", target, max_bytes)
        return result.stdout

    async def read_text(self, path: str, *, max_bytes: int = DEFAULT_READ_BYTES) -> str:
        return (await self.read_file(path, max_bytes=max_bytes)).decode("utf-8")

    async def write_file(self, path: str, data: bytes | str) -> None:
        target = self._resolve(path)
        payload = data.encode("utf-8") if isinstance(data, str) else data
        result = await self.run_python(
            _WRITE_SCRIPT, [target], stdin=payload, timeout=_FILE_HELPER_TIMEOUT
        )
        self._check_file_helper(result, "writing", target, None)

    @staticmethod
    def _check_file_helper(
        result: ScriptResult, doing: str, target: str, max_bytes: int | None
    ) -> None:
        """File I/O runs inside, through the sandbox's own view of its files, on purpose:
        resolving the path on the host would follow links the agent planted to host files."""
        if result.exit_code == _EXIT_IS_DIR:
            raise SandboxCommandError(f"is a directory, not a file: {target}")
        if result.exit_code == _EXIT_NOT_REGULAR:
            raise SandboxCommandError(f"not a regular file (a FIFO, device or socket): {target}")
        if result.exit_code == _EXIT_TOO_LARGE or result.truncated:
            raise SandboxCommandError(f"{target} is larger than max_bytes={max_bytes}")
        if result.timed_out:
            raise SandboxCommandError(f"{doing} {target} took over {_FILE_HELPER_TIMEOUT:.0f}s")
        if result.exit_code != 0:
            raise SandboxCommandError(
                f"{doing} {target} failed ({result.exit_code}): {result.stderr.strip()[-2000:]}"
            )

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
                for io in self._open_io:
                    io.close()
                self._open_io.clear()
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
        self._sandbox._settle(self._io)
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


_SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE


def _sealed_memfd(data: bytes) -> int:
    """A read-only descriptor of `data` in memory: sealed, so that nobody (a process of the
    sandbox reopening it through /proc, say) can grow or change it."""
    fd = os.memfd_create("stdin", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_pair(io: _IoFiles) -> tuple[bytes, bytes]:
    return io.stdout.read_bytes(), io.stderr.read_bytes()


def _retrieve(task: asyncio.Future[int]) -> None:
    """Mark a wait nobody awaits any more as seen, whatever it ended with."""
    if not task.cancelled():
        task.exception()
