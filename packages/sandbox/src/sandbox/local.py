"""The embedded default backend: bubblewrap namespaces on this machine.

Each sandbox is one idle `bwrap` holding fresh user/pid/ipc/uts/net namespaces, a fresh
workspace directory on the host bound at /workspace, the host's /usr and /etc read-only,
and private tmpfs /tmp, /root and /run. Commands enter it with nsenter (see _bwrap.py). The
network namespace has loopback only; a spec's ForwardedEndpoint is relayed in (_forward.py).

Without bubblewrap (or where user namespaces are disabled) the backend falls back to plain
subprocesses on the host, and says so loudly: a logging.warning per backend and
`Sandbox.isolated == False`. The fallback keeps the process-group discipline (timeouts and
close kill what we started) but gives no file-system or network isolation.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import posixpath
import shutil
import stat
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from types import TracebackType
from typing import Literal, Self

from sandbox import _process_group as pg
from sandbox._bwrap import (
    READY_LINE,
    SANDBOX_HOME,
    SANDBOX_WORKSPACE,
    bwrap_argv,
    nsenter_prefix,
    prlimit_prefix,
)
from sandbox._forward import SOCKET_NAME, HostRelay, is_listening, socat_argv
from sandbox.errors import (
    SandboxBootError,
    SandboxClosedError,
    SandboxCommandError,
    SandboxFileNotFoundError,
    SandboxUnavailableError,
    UnsupportedSpecError,
)
from sandbox.result import ExecResult
from sandbox.spec import (
    DirectoryWorkspace,
    EmptyWorkspace,
    GitWorkspace,
    ReadOnlyBind,
    SandboxSpec,
    validate_env,
)
from sandbox.workspace import checkout_repo

logger = logging.getLogger(__name__)

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Exit codes of the file helper scripts (chosen outside the range coreutils use).
_EXIT_MISSING = 44
_EXIT_IS_DIR = 45
_READ_SCRIPT = (
    f'[ -e "$1" ] || exit {_EXIT_MISSING}; [ -d "$1" ] && exit {_EXIT_IS_DIR}; exec cat -- "$1"'
)
_WRITE_SCRIPT = 'mkdir -p -- "$(dirname -- "$1")" && exec cat > "$1"'


@dataclass(frozen=True, slots=True)
class LocalConfig:
    """How the local backend runs sandboxes.

    isolation: "auto" uses bubblewrap when it works here and falls back (loudly) otherwise;
    "bwrap" refuses to fall back; "none" always runs plain subprocesses.
    state_root: where per-sandbox state directories (workspace, output files) are created;
    None means the system temporary directory.
    keep_state: leave the state directory (and workspace) on disk after close, for debugging.
    """

    isolation: Literal["auto", "bwrap", "none"] = "auto"
    state_root: Path | None = None
    boot_timeout: float = 10.0
    keep_state: bool = False
    base_env: Mapping[str, str] = field(
        default_factory=lambda: {"PATH": DEFAULT_PATH, "LANG": "C.UTF-8"}
    )


@dataclass(frozen=True, slots=True)
class _Tools:
    bwrap: str | None
    nsenter: str | None
    prlimit: str | None
    socat: str | None


class LocalBackend:
    """Creates local sandboxes. One backend can serve many concurrent sandboxes."""

    def __init__(self, config: LocalConfig | None = None) -> None:
        self.config = config or LocalConfig()
        self._tools = _Tools(
            bwrap=shutil.which("bwrap"),
            nsenter=shutil.which("nsenter"),
            prlimit=shutil.which("prlimit"),
            socat=shutil.which("socat"),
        )
        self._isolated: bool | None = None
        self._probe_lock = asyncio.Lock()

    async def isolation_available(self) -> bool:
        """Whether sandboxes will be isolated with bubblewrap (probed once, then cached)."""
        async with self._probe_lock:
            if self._isolated is None:
                self._isolated = await self._decide_isolation()
            return self._isolated

    async def _decide_isolation(self) -> bool:
        mode = self.config.isolation
        if mode == "none":
            logger.warning(
                "sandbox isolation disabled by config: commands run as plain host processes "
                "with full file-system and network access"
            )
            return False
        problem = await self._bwrap_problem()
        if problem is None:
            return True
        if mode == "bwrap":
            raise SandboxUnavailableError(f"bubblewrap isolation unavailable: {problem}")
        logger.warning(
            "SANDBOX NOT ISOLATED: %s; falling back to plain subprocesses with full host "
            "file-system and network access (install bubblewrap: apt-get install bubblewrap)",
            problem,
        )
        return False

    async def _bwrap_problem(self) -> str | None:
        if self._tools.bwrap is None:
            return "bwrap not found on PATH"
        if self._tools.nsenter is None:
            return "nsenter not found on PATH"
        probe = await asyncio.create_subprocess_exec(
            self._tools.bwrap,
            "--unshare-user",
            "--unshare-pid",
            "--unshare-net",
            "--ro-bind",
            "/",
            "/",
            "--",
            "true",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await probe.communicate()
        if probe.returncode != 0:
            return f"bwrap cannot create namespaces here: {err.decode(errors='replace').strip()}"
        return None

    async def create(self, spec: SandboxSpec) -> LocalSandbox:
        isolated = await self.isolation_available()
        if spec.network is not None and isolated and self._tools.socat is None:
            raise SandboxUnavailableError(
                "forwarding an endpoint into the sandbox needs socat (apt-get install socat)"
            )
        limits_prefix = self._limits_prefix(spec)
        root = self.config.state_root or Path(tempfile.gettempdir())
        state = Path(tempfile.mkdtemp(prefix="sandbox-", dir=root))
        try:
            workspace_host = state / "workspace"
            workspace_host.mkdir()
            io_dir = state / "io"
            io_dir.mkdir()
            binds = list(spec.read_only_binds)
            binds += await asyncio.to_thread(_materialize, spec, workspace_host)
            if isolated:
                return await self._boot_bwrap(
                    spec, state, workspace_host, io_dir, binds, limits_prefix
                )
            return self._fallback(spec, state, workspace_host, io_dir, binds, limits_prefix)
        except BaseException:
            if not self.config.keep_state:
                await asyncio.to_thread(_remove_tree, state)
            raise

    def _limits_prefix(self, spec: SandboxSpec) -> list[str]:
        limits = spec.limits
        wanted = (limits.max_open_files, limits.max_file_size_bytes, limits.max_address_space_bytes)
        if all(value is None for value in wanted):
            return []
        if self._tools.prlimit is None:
            raise SandboxUnavailableError("resource limits need prlimit (util-linux)")
        return prlimit_prefix(self._tools.prlimit, limits)

    async def _boot_bwrap(
        self,
        spec: SandboxSpec,
        state: Path,
        workspace_host: Path,
        io_dir: Path,
        binds: list[ReadOnlyBind],
        limits_prefix: list[str],
    ) -> LocalSandbox:
        assert self._tools.bwrap is not None
        assert self._tools.nsenter is not None
        forward_dir: Path | None = None
        relay: HostRelay | None = None
        if spec.network is not None:
            forward_dir = state / "forward"
            forward_dir.mkdir()
            relay = HostRelay(forward_dir / SOCKET_NAME, spec.network.host, spec.network.port)
            await relay.start()
        info_read, info_write = os.pipe()
        try:
            argv = bwrap_argv(
                self._tools.bwrap,
                workspace=workspace_host,
                forward_dir=forward_dir,
                binds=binds,
                limits=spec.limits,
                info_fd=info_write,
            )
            bwrap = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env={"PATH": DEFAULT_PATH},
                pass_fds=(info_write,),
                start_new_session=True,
            )
            os.close(info_write)
            info_write = -1
            init_pid = await self._await_ready(bwrap, info_read)
        except BaseException:
            if relay is not None:
                await relay.close()
            raise
        finally:
            os.close(info_read)
            if info_write >= 0:
                os.close(info_write)
        env = {**self.config.base_env, "HOME": SANDBOX_HOME, **spec.env}
        sandbox = LocalSandbox(
            state_dir=state,
            workspace_host=workspace_host,
            workspace=SANDBOX_WORKSPACE,
            io_dir=io_dir,
            env=env,
            enter_prefix=nsenter_prefix(self._tools.nsenter, init_pid) + limits_prefix,
            isolated=True,
            bwrap=bwrap,
            relay=relay,
            endpoint_url=(
                f"http://127.0.0.1:{spec.network.inside_port}" if spec.network is not None else None
            ),
            keep_state=self.config.keep_state,
        )
        if spec.network is not None:
            assert self._tools.socat is not None
            try:
                await sandbox._start_forwarder(
                    socat_argv(self._tools.socat, spec.network.inside_port),
                    init_pid,
                    spec.network.inside_port,
                    self.config.boot_timeout,
                )
            except BaseException:
                await sandbox.close()
                raise
        return sandbox

    async def _await_ready(self, bwrap: asyncio.subprocess.Process, info_read: int) -> int:
        assert bwrap.stdout is not None
        assert bwrap.stderr is not None
        try:
            line = await asyncio.wait_for(bwrap.stdout.readline(), self.config.boot_timeout)
        except BaseException:
            pg.kill_group(bwrap)
            await bwrap.wait()
            raise
        if line != READY_LINE:
            pg.kill_group(bwrap)
            await bwrap.wait()
            err = (await bwrap.stderr.read()).decode(errors="replace").strip()
            raise SandboxBootError(f"bwrap failed to start the sandbox: {err or line!r}")
        # bwrap wrote the info (a small JSON object, one atomic pipe write) before running
        # the payload that printed READY_LINE, so it is complete by now.
        info = json.loads(os.read(info_read, 65536))
        return int(info["child-pid"])

    def _fallback(
        self,
        spec: SandboxSpec,
        state: Path,
        workspace_host: Path,
        io_dir: Path,
        binds: list[ReadOnlyBind],
        limits_prefix: list[str],
    ) -> LocalSandbox:
        for bind in binds:
            if Path(bind.sandbox_path) != bind.host_path.resolve():
                raise UnsupportedSpecError(
                    f"without bubblewrap {bind.host_path} cannot appear at {bind.sandbox_path}"
                )
        home = state / "home"
        home.mkdir()
        env = {**self.config.base_env, "HOME": str(home), **spec.env}
        endpoint = None
        if spec.network is not None:
            endpoint = f"http://{spec.network.host}:{spec.network.port}"
        return LocalSandbox(
            state_dir=state,
            workspace_host=workspace_host,
            workspace=str(workspace_host),
            io_dir=io_dir,
            env=env,
            enter_prefix=limits_prefix,
            isolated=False,
            bwrap=None,
            relay=None,
            endpoint_url=endpoint,
            keep_state=self.config.keep_state,
        )


def _materialize(spec: SandboxSpec, workspace_host: Path) -> list[ReadOnlyBind]:
    """Fill the fresh workspace; return the extra read-only binds it needs."""
    source = spec.workspace
    if isinstance(source, EmptyWorkspace):
        return []
    if isinstance(source, DirectoryWorkspace):
        if not source.source.is_dir():
            raise UnsupportedSpecError(f"workspace source is not a directory: {source.source}")
        shutil.copytree(source.source, workspace_host, symlinks=True, dirs_exist_ok=True)
        return []
    if isinstance(source, GitWorkspace):
        checkout = checkout_repo(source.repo, source.commit, workspace_host)
        objects = checkout.shared_objects
        return [ReadOnlyBind(objects, PurePosixPath(objects))]
    raise UnsupportedSpecError(f"unknown workspace source: {source!r}")


def _remove_tree(path: Path) -> None:
    """Delete a state directory even where the sandbox left unreadable or read-only dirs.

    Directories are made accessible with an explicit stack (nesting depth is the agent's
    choice, so no recursion), then removed in one rmtree.
    """
    if not path.exists():
        return
    stack = [str(path)]
    while stack:
        directory = stack.pop()
        os.chmod(directory, stat.S_IMODE(os.lstat(directory).st_mode) | stat.S_IRWXU)
        with os.scandir(directory) as entries:
            stack.extend(e.path for e in entries if e.is_dir(follow_symlinks=False))
    shutil.rmtree(path)


class LocalProcess:
    """A detached command of a LocalSandbox; output goes to files in the state directory."""

    def __init__(
        self, proc: asyncio.subprocess.Process, stdout_path: Path, stderr_path: Path
    ) -> None:
        self._proc = proc
        self._stdout_path = stdout_path
        self._stderr_path = stderr_path
        self._started = time.monotonic()
        self._killed = False

    @property
    def pid(self) -> int:
        """Host pid of the launcher process (leader of the command's process group)."""
        return self._proc.pid

    @property
    def stdout_path(self) -> Path:
        return self._stdout_path

    @property
    def stderr_path(self) -> Path:
        return self._stderr_path

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    async def wait(self, timeout: float | None = None) -> ExecResult:
        exit_code, timed_out = await pg.wait_with_deadline(
            self._proc, timeout, kill_on_cancel=False
        )
        return pg.result_from_files(
            exit_code, timed_out, self._started, self._stdout_path, self._stderr_path
        )

    async def kill(self) -> None:
        pg.kill_group(self._proc)
        await self._proc.wait()


class LocalSandbox:
    """A running local sandbox. Create it with `LocalBackend.create`."""

    def __init__(
        self,
        *,
        state_dir: Path,
        workspace_host: Path,
        workspace: str,
        io_dir: Path,
        env: Mapping[str, str],
        enter_prefix: list[str],
        isolated: bool,
        bwrap: asyncio.subprocess.Process | None,
        relay: HostRelay | None,
        endpoint_url: str | None,
        keep_state: bool,
    ) -> None:
        validate_env(env)
        self._state_dir = state_dir
        self._workspace_host = workspace_host
        self._workspace = workspace
        self._io_dir = io_dir
        self._env = dict(env)
        self._prefix = enter_prefix
        self._isolated = isolated
        self._bwrap = bwrap
        self._relay = relay
        self._endpoint_url = endpoint_url
        self._keep_state = keep_state
        self._procs: set[asyncio.subprocess.Process] = set()
        self._closed = False
        self._close_lock = asyncio.Lock()

    # -- properties -------------------------------------------------------------------------

    @property
    def workspace(self) -> str:
        return self._workspace

    @property
    def workspace_host_path(self) -> Path:
        """The workspace directory on the host (for the caller's own trusted bookkeeping)."""
        return self._workspace_host

    @property
    def endpoint_url(self) -> str | None:
        return self._endpoint_url

    @property
    def isolated(self) -> bool:
        return self._isolated

    @property
    def init_pid(self) -> int | None:
        """Host pid of the sandbox's bwrap launcher (None without isolation)."""
        return self._bwrap.pid if self._bwrap is not None else None

    # -- commands ---------------------------------------------------------------------------

    async def exec(
        self,
        cmd: str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> ExecResult:
        started = time.monotonic()
        out, err = self._io_paths()
        try:
            proc = await self._spawn_shell(cmd, cwd, env, out, err)
            try:
                exit_code, timed_out = await pg.wait_with_deadline(
                    proc, timeout, kill_on_cancel=True
                )
            finally:
                self._procs.discard(proc)
            return pg.result_from_files(exit_code, timed_out, started, out, err)
        finally:
            out.unlink(missing_ok=True)
            err.unlink(missing_ok=True)

    async def start(
        self,
        cmd: str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> LocalProcess:
        out, err = self._io_paths()
        proc = await self._spawn_shell(cmd, cwd, env, out, err)
        return LocalProcess(proc, out, err)

    async def _spawn_shell(
        self,
        cmd: str,
        cwd: str | None,
        env: Mapping[str, str] | None,
        out: Path,
        err: Path,
    ) -> asyncio.subprocess.Process:
        self._check_open()
        merged = {**self._env, **(env or {})}
        validate_env(merged)
        directory = self._resolve(cwd) if cwd is not None else self._workspace
        argv = [*self._prefix, "env", "-C", directory, "/bin/bash", "-lc", cmd]
        with out.open("wb") as stdout, err.open("wb") as stderr:
            proc = await pg.spawn(argv, env=merged, stdout=stdout, stderr=stderr)
        self._procs.add(proc)
        return proc

    def _io_paths(self) -> tuple[Path, Path]:
        stem = uuid.uuid4().hex
        return self._io_dir / f"{stem}.out", self._io_dir / f"{stem}.err"

    def _resolve(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(self._workspace, path))

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxClosedError("sandbox is closed")

    async def _start_forwarder(
        self, argv: list[str], init_pid: int, port: int, timeout: float
    ) -> None:
        out, err = self._io_paths()
        with out.open("wb") as stdout, err.open("wb") as stderr:
            proc = await pg.spawn(
                [*self._prefix, *argv], env=self._env, stdout=stdout, stderr=stderr
            )
        self._procs.add(proc)
        deadline = time.monotonic() + timeout
        while not is_listening(init_pid, port):
            if proc.returncode is not None or time.monotonic() > deadline:
                pg.kill_group(proc)
                raise SandboxBootError(
                    f"port forwarder did not start: {pg.read_output(err).strip()!r}"
                )
            await asyncio.sleep(0.001)

    # -- files ------------------------------------------------------------------------------

    async def read_file(self, path: str) -> bytes:
        target = self._resolve(path)
        code, data, err = await self._helper(_READ_SCRIPT, target, b"")
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

    async def _helper(self, script: str, target: str, stdin: bytes) -> tuple[int, bytes, str]:
        """Run a fixed sh script inside the sandbox with the path as $1 (never parsed as shell).

        File I/O goes through the sandbox's own view of the file system on purpose: resolving
        the path on the host would follow symlinks the agent planted to host files.
        """
        self._check_open()
        argv = [*self._prefix, "/bin/sh", "-c", script, "sh", target]
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self._env,
            cwd=None if self._isolated else str(self._workspace_host),
            start_new_session=True,
        )
        self._procs.add(proc)
        try:
            out, err = await proc.communicate(stdin)
        except BaseException:
            pg.kill_group(proc)
            raise
        finally:
            self._procs.discard(proc)
        assert proc.returncode is not None
        return proc.returncode, out, err.decode(errors="replace").strip()

    # -- lifetime ---------------------------------------------------------------------------

    async def close(self) -> None:
        async with self._close_lock:
            if self._closed:
                return
            self._closed = True
            for proc in list(self._procs):
                pg.kill_group(proc)
            if self._bwrap is not None:
                # Killing bwrap kills the sandbox's pid 1 (--die-with-parent), and with it
                # every process in the pid namespace, setsid'd and daemonized ones included.
                pg.kill_group(self._bwrap)
                await self._bwrap.wait()
            await asyncio.gather(*(proc.wait() for proc in self._procs))
            self._procs.clear()
            if self._relay is not None:
                await self._relay.close()
            if not self._keep_state:
                await asyncio.to_thread(_remove_tree, self._state_dir)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
