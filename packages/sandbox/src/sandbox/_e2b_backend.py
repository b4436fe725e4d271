"""The E2B backend: the same Sandbox contract on E2B's cloud sandboxes (extra `sandbox[e2b]`).

Mapping onto the SDK's async API: `AsyncSandbox.create` boots (with our own deadline and
retries with backoff; one idempotency key per `create` call, so a retried request whose
first attempt did succeed server-side returns that sandbox instead of leaking a second),
`commands.run(background=True)` starts every command (so we, not the SDK, own the wait),
`handle.wait()` raises `CommandExitException` for a non-zero exit and we turn that back
into an ExecResult, `files.read/write` do file I/O, and `kill()` ends the sandbox.

Deadlines are ours: the SDK's command timeout is disabled (`timeout=0`) because it is not
reliable on Python 3.11; `asyncio.wait_for` bounds every wait, and on expiry we SIGKILL the
command's process group inside the sandbox and report exit 137 with `timed_out=True`.

envd reports a process killed by a signal as exit code -1 with error "signal: killed"; that
becomes 128 + signal number, as a shell would report it.

Nothing is left running when `create` or `close` ends, also when either is cancelled: a boot
abandoned while E2B may still be creating its sandbox is reaped through its idempotency key,
and the kill of `close` finishes in its own task before the cancellation is passed on.

`kill_all` SIGKILLs what envd lists through envd's own API (List, SendSignal), then sweeps the
VM as root for every process carrying the sandbox's `E2B_SANDBOX_ID` or descending from one,
until envd lists nothing and the sweep finds nothing. `run_python` runs the caller's script
as `env -i PATH=... LC_ALL=C.UTF-8 python3 -I -S -c SCRIPT`, its stdin and stdout passing
through temporary files so that bytes stay bytes. docs/e2b.md says what E2B isolates, what this
backend adds, and what neither reaches.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import posixpath
import re
import shlex
import shutil
import signal
import tarfile
import tempfile
import time
import uuid
from collections.abc import Awaitable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from http import HTTPStatus
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Self, TypeVar

from sandbox._errors import (
    SandboxBootError,
    SandboxClosedError,
    SandboxCommandError,
    SandboxFileNotFoundError,
    SandboxUnavailableError,
    UnsupportedSpecError,
)
from sandbox._result import KILLED_EXIT_CODE, ExecResult, ScriptResult
from sandbox._retry import RetryPolicy
from sandbox._spec import (
    DEFAULT_READ_BYTES,
    DirectoryWorkspace,
    E2BTemplate,
    EmptyWorkspace,
    ForwardedEndpoint,
    ImageWorkspace,
    ResourceLimits,
    SandboxSpec,
    validate_env,
)

if TYPE_CHECKING:
    from e2b import AsyncSandbox

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

#: Every IPv4 address, as E2B's egress lists spell "everything".
_ALL_TRAFFIC = "0.0.0.0/0"
_MIN_POLL_DELAY = 0.05

_SIGNAL_EXIT = re.compile(r"^signal: (.+)$")
_SIZE = re.compile(r"^size=(\d+)$", re.MULTILINE)
# Exit codes of read_file's check inside (outside the range coreutils use).
_FILE_MISSING = 44
_FILE_IS_DIR = 45
_FILE_NOT_REGULAR = 46
# Go's names for signals (os.Signal.String()) as envd reports them.
_GO_SIGNAL_NAMES = {
    "killed": signal.SIGKILL,
    "terminated": signal.SIGTERM,
    "interrupt": signal.SIGINT,
    "hangup": signal.SIGHUP,
    "aborted": signal.SIGABRT,
    "segmentation fault": signal.SIGSEGV,
    "broken pipe": signal.SIGPIPE,
    "quit": signal.SIGQUIT,
}

#: HOME of the commands the backend runs for itself: a directory that does not exist, so their
#: login shell reads /etc/profile (the template's) but none of the user's own rc files
#: (~/.bash_profile, ~/.bash_login, ~/.profile), which the sandbox's commands can rewrite.
_NO_HOME = "/nonexistent"
#: The whole environment of a `run_python` script, PATH being where `python3` is looked up.
_SCRIPT_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C.UTF-8"}
_SCRIPT_STDERR_BYTES = 64 << 10
#: Who runs the sweep of `kill_all`: root can read every process's environment and kill it.
_SWEEP_USER = "root"
_SWEEP_NO_MARKER = 3
_SWEEP_SURVIVORS = 1
# The sweep of `kill_all`, run by `bash -l -c` (builtins only, so it forks nothing of its own):
# SIGKILL every process whose environment holds this sandbox's E2B_SANDBOX_ID (envd gives it
# to every command; the sweep takes the value envd gave the sweep itself) or that descends
# from such a process, but not the sweep itself, until a scan of /proc finds none; past
# @LIMIT@ seconds it prints the survivors and exits 1. Zombies are dead and are skipped.
_SWEEP_SCRIPT = r"""
[ -n "${E2B_SANDBOX_ID-}" ] || { echo "envd gave no E2B_SANDBOX_ID" >&2; exit 3; }
marker="E2B_SANDBOX_ID=$E2B_SANDBOX_ID"
self=$$
deadline=$((SECONDS + @LIMIT@))
while :; do
  unset parent member
  declare -A parent=() member=()
  for dir in /proc/[0-9]*; do
    pid=${dir#/proc/}
    [ "$pid" = "$self" ] && continue
    { read -r stat < "$dir/stat"; } 2>/dev/null || continue
    rest=${stat##*) }
    case ${rest%% *} in Z|X) continue ;; esac
    rest=${rest#* }
    parent[$pid]=${rest%% *}
    while IFS= read -r -d '' entry; do
      if [ "$entry" = "$marker" ]; then member[$pid]=1; break; fi
    done 2>/dev/null < "$dir/environ"
  done
  grown=1
  while [ "$grown" = 1 ]; do
    grown=0
    for pid in "${!parent[@]}"; do
      if [ -z "${member[$pid]-}" ] && [ -n "${member[${parent[$pid]}]-}" ]; then
        member[$pid]=1
        grown=1
      fi
    done
  done
  [ "${#member[@]}" = 0 ] && exit 0
  if [ "$SECONDS" -ge "$deadline" ]; then echo "${!member[@]}"; exit 1; fi
  kill -KILL "${!member[@]}" 2>/dev/null
done
"""


@dataclass(frozen=True, slots=True)
class E2BConfig:
    """Everything the E2B backend needs; nothing is read from the environment.

    `api_url` / `sandbox_url` point the SDK at a self-hosted or test deployment;
    `sandbox_timeout` is E2B's own lifetime limit of a sandbox (seconds), a safety net for
    sandboxes whose `close()` never ran.
    """

    api_key: str
    template: str | None = None
    domain: str | None = None
    api_url: str | None = None
    sandbox_url: str | None = None
    http_version: Literal["1.1", "2"] | None = None
    sandbox_timeout: int = 3600
    request_timeout: float = 30.0
    boot_timeout: float = 120.0
    reap_timeout: float = 120.0
    """How long a boot we abandoned (cancelled, or out of attempts) is waited for, so that the
    sandbox E2B may still be creating for it can be killed; past that it ends at
    `sandbox_timeout`."""
    boot_retry: RetryPolicy = field(default_factory=RetryPolicy)
    max_concurrent_boots: int = 8
    """Creates in flight at once per backend: a burst of hundreds of episodes must not hit the
    E2B API (and its rate limits) all in the same second."""
    metadata: Mapping[str, str] = field(default_factory=dict)
    """Attached to every sandbox (e.g. run and episode ids), visible in E2B's dashboard and API."""
    kill_timeout: float = 15.0
    sdk_retries: int = 0
    workspace_path: str = "/home/user/workspace"
    output_root: Path | None = None


def exit_code_from_envd(exit_code: int, error: str | None) -> int:
    """envd's (exit code, error) to shell convention: a signal N becomes 128 + N."""
    if error:
        match = _SIGNAL_EXIT.match(error.strip())
        if match:
            signum = _GO_SIGNAL_NAMES.get(match.group(1))
            return 128 + signum if signum is not None else KILLED_EXIT_CODE
    if exit_code < 0:
        return KILLED_EXIT_CODE
    return exit_code


def _import_sdk() -> Any:
    try:
        import e2b
    except ImportError as error:
        raise SandboxUnavailableError(
            "the E2B backend needs the e2b SDK: install sandbox[e2b]"
        ) from error
    return e2b


_UNFINISHED: set[asyncio.Future[Any]] = set()
"""Cleanup tasks whose waiter was cancelled twice: referenced here until they end."""


async def _finish_despite_cancellation(work: Awaitable[_T]) -> _T:
    """Await `work` to its end even if the caller is cancelled meanwhile, then re-raise that.

    Killing a remote sandbox must not stop halfway because an episode was cancelled (its
    timeout expired, its task group unwound): a sandbox nobody holds runs, and is billed, until
    E2B's own lifetime limit. The work runs in its own task; a second cancellation of the
    caller stops only the waiting, never the work.
    """
    task = asyncio.ensure_future(work)
    _UNFINISHED.add(task)
    task.add_done_callback(_UNFINISHED.discard)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await asyncio.shield(task)
        raise


async def _kill_sdk_sandbox(sdk_sandbox: AsyncSandbox, timeout: float) -> None:
    try:
        await asyncio.wait_for(sdk_sandbox.kill(), timeout)
    except Exception as error:
        logger.warning(
            "E2B kill of sandbox %s failed (%r); it ends at its own timeout",
            sdk_sandbox.sandbox_id,
            error,
        )


def _poll_delays(policy: RetryPolicy) -> Iterator[float]:
    """Endless waits between polls of E2B: the retry policy's backoff, never below 50 ms."""
    delay = max(policy.initial_delay, _MIN_POLL_DELAY)
    while True:
        yield delay
        delay = min(delay * policy.multiplier, max(policy.max_delay, _MIN_POLL_DELAY))


def _network_options(network: ForwardedEndpoint | None) -> dict[str, Any]:
    """Egress: nothing, or the forwarded endpoint's host only. Ingress: E2B's public sandbox
    URLs answer only requests carrying the sandbox's traffic token, which nobody is given."""
    if network is None:
        return {"allow_internet_access": False, "network": {"allow_public_traffic": False}}
    return {
        "network": {
            "allow_out": [network.host],
            "deny_out": [_ALL_TRAFFIC],
            "allow_public_traffic": False,
        }
    }


class E2BBackend:
    """Creates E2B sandboxes."""

    def __init__(self, config: E2BConfig) -> None:
        if config.max_concurrent_boots < 1:
            raise ValueError("max_concurrent_boots must be at least 1")
        self.config = config
        self._e2b = _import_sdk()
        self._boots = asyncio.Semaphore(config.max_concurrent_boots)

    def _api_params(self) -> dict[str, Any]:
        c = self.config
        params: dict[str, Any] = {
            "api_key": c.api_key,
            "request_timeout": c.request_timeout,
            "debug": False,
            # Boot retries are ours (`boot_retry`); the SDK's own would multiply them.
            "retries": c.sdk_retries,
        }
        optional = {
            "domain": c.domain,
            "api_url": c.api_url,
            "sandbox_url": c.sandbox_url,
            "http_version": c.http_version,
        }
        params.update({k: v for k, v in optional.items() if v is not None})
        return params

    async def create(self, spec: SandboxSpec) -> E2BSandbox:
        """Boot a sandbox and prepare its workspace; on any failure or cancellation, kill it."""
        _check_supported(spec)
        template = self.config.template
        if isinstance(spec.image, E2BTemplate):
            template = spec.image.template_id
        create_kwargs: dict[str, Any] = {
            "template": template,
            "timeout": self.config.sandbox_timeout,
            "idempotency_key": str(uuid.uuid4()),
            **_network_options(spec.network),
            **self._api_params(),
        }
        if self.config.metadata:
            create_kwargs["metadata"] = dict(self.config.metadata)
        endpoint_url = None
        if spec.network is not None:
            endpoint_url = f"http://{spec.network.host}:{spec.network.port}"
        sdk_sandbox = await self._boot(create_kwargs)
        sandbox = E2BSandbox(
            sdk_sandbox,
            self._e2b,
            config=self.config,
            env=spec.env,
            endpoint_url=endpoint_url,
            max_output_bytes=spec.limits.max_output_bytes,
            workspace=_workspace_path(spec, self.config),
        )
        try:
            await sandbox._prepare_workspace(spec)
        except BaseException:
            await sandbox.close()
            raise
        return sandbox

    @property
    def _refusals(self) -> tuple[type[Exception], ...]:
        return (self._e2b.AuthenticationException, self._e2b.InvalidArgumentException)

    async def _boot(self, create_kwargs: dict[str, Any]) -> AsyncSandbox:
        """`AsyncSandbox.create` with our deadline and retries (all under one idempotency key).

        When we abandon the boot (cancelled, or out of attempts) after a request whose outcome
        we never learnt, E2B may still be creating that sandbox: it is reaped before we return.
        """
        delays = self.config.boot_retry.delays()
        attempt = 0
        may_have_booted = False
        try:
            while True:
                attempt += 1
                try:
                    async with self._boots:
                        try:
                            created: AsyncSandbox = await asyncio.wait_for(
                                self._e2b.AsyncSandbox.create(**create_kwargs),
                                self.config.boot_timeout,
                            )
                        except asyncio.CancelledError:
                            may_have_booted = True  # E2B may finish this boot all the same
                            raise
                    return created
                except self._refusals as error:
                    raise SandboxBootError(f"E2B refused to create a sandbox: {error}") from error
                except Exception as error:
                    may_have_booted = may_have_booted or self._may_have_booted(error)
                    delay = next(delays, None)
                    if delay is None:
                        raise SandboxBootError(
                            f"E2B sandbox failed to boot after {attempt} attempts: {error!r}"
                        ) from error
                    logger.warning(
                        "E2B boot attempt %d failed (%r); retrying in %.2fs", attempt, error, delay
                    )
                    await asyncio.sleep(delay)
        except BaseException:
            if may_have_booted:
                await _finish_despite_cancellation(self._reap(create_kwargs))
            raise

    def _may_have_booted(self, error: Exception) -> bool:
        """Whether a failed create may still leave a sandbox: it got no answer (our deadline,
        a dropped connection) or E2B answered that the key's boot is still in progress (409)."""
        if isinstance(error, self._e2b.RateLimitException | self._e2b.ServiceBusyException):
            return False
        status = getattr(error, "status_code", None)
        return status is None or status == HTTPStatus.CONFLICT

    async def _reap(self, create_kwargs: dict[str, Any]) -> None:
        """Kill whatever sandbox an abandoned boot left, found through its idempotency key.

        Repeating the request with the same key is answered with the sandbox that key booted
        (409 while that boot is still under way, which we wait out), or boots one if no request
        of ours ever arrived; either way the answer is killed. Tried with backoff for
        `reap_timeout`; after that the sandbox ends at its own `sandbox_timeout`.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.reap_timeout
        delays = _poll_delays(self.config.boot_retry)
        while True:
            try:
                async with self._boots:
                    sdk_sandbox: AsyncSandbox = await asyncio.wait_for(
                        self._e2b.AsyncSandbox.create(**create_kwargs),
                        max(deadline - loop.time(), 0.0),
                    )
            except Exception as error:
                delay = next(delays)
                if isinstance(error, self._refusals) or loop.time() + delay >= deadline:
                    logger.warning(
                        "could not reap the E2B boot %s (%r); its sandbox, if any, ends at its "
                        "own timeout",
                        create_kwargs["idempotency_key"],
                        error,
                    )
                    return
                await asyncio.sleep(delay)
                continue
            await _kill_sdk_sandbox(sdk_sandbox, self.config.kill_timeout)
            return


def _check_supported(spec: SandboxSpec) -> None:
    if spec.read_only_binds:
        raise UnsupportedSpecError("E2B cannot mount host paths; bake them into the template")
    if replace(spec.limits, max_output_bytes=ResourceLimits().max_output_bytes) != ResourceLimits():
        raise UnsupportedSpecError(
            "E2B resource limits come from the template, not the spec (max_output_bytes apart)"
        )
    if spec.image is not None and not isinstance(spec.image, E2BTemplate):
        raise UnsupportedSpecError(
            f"E2B runs templates, not a {type(spec.image).__name__}: build a template from the "
            "task's image (see the package's docs/images.md) and give E2BTemplate its id"
        )
    if isinstance(spec.workspace, ImageWorkspace) and spec.workspace.path is None:
        raise UnsupportedSpecError(
            "on E2B, ImageWorkspace needs its path (the template's working directory is not "
            "known to the API)"
        )
    if not isinstance(spec.workspace, EmptyWorkspace | DirectoryWorkspace | ImageWorkspace):
        raise UnsupportedSpecError(
            "E2B takes an empty, directory or image workspace; put repositories in the "
            "template or upload a directory"
        )


def _workspace_path(spec: SandboxSpec, config: E2BConfig) -> str:
    """The template's own directory for an ImageWorkspace (writable in an E2B sandbox as it
    is: the sandbox is a VM of its own); otherwise the configured workspace."""
    if isinstance(spec.workspace, ImageWorkspace) and spec.workspace.path is not None:
        return str(spec.workspace.path)
    return config.workspace_path


def _tar_directory(source: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        archive.add(source, arcname=".")
    return buffer.getvalue()


class _OutputSink:
    """Collects a command's output as the SDK streams it, in memory or into a host file, at
    most `limit` bytes (UTF-8) of it when a limit is given; the rest is counted, not kept."""

    def __init__(self, path: Path | None, limit: int | None = None) -> None:
        self._chunks: list[str] = []
        self._file = path.open("w", encoding="utf-8") if path is not None else None
        self._room = limit
        self.dropped = 0

    def __call__(self, chunk: str) -> None:
        if self._room is not None:
            encoded = chunk.encode("utf-8")
            if len(encoded) > self._room:
                chunk = encoded[: self._room].decode("utf-8", errors="ignore")
                self.dropped += len(encoded) - len(chunk.encode("utf-8"))
                encoded = chunk.encode("utf-8")
            self._room -= len(encoded)
            if not chunk:
                return
        if self._file is not None:
            self._file.write(chunk)
            self._file.flush()
            return
        self._chunks.append(chunk)

    def text(self, path: Path | None) -> str:
        if path is None:
            return "".join(self._chunks)
        if self._file is not None and not self._file.closed:
            self._file.flush()
        return path.read_text(encoding="utf-8")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


class _Command:
    """One running command: its SDK handle and where its output goes."""

    def __init__(
        self,
        sandbox: E2BSandbox,
        handle: Any,
        stdout: _OutputSink,
        stderr: _OutputSink,
        paths: tuple[Path | None, Path | None],
    ) -> None:
        self._sandbox = sandbox
        self.handle = handle
        self.stdout = stdout
        self.stderr = stderr
        self.paths = paths
        self.started = time.monotonic()
        self._finished: tuple[int, bool] | None = None
        self._end_task: asyncio.Future[int] | None = None

    def _end(self) -> asyncio.Future[int]:
        """One shared task awaiting the SDK handle, shielded from our deadlines.

        Cancelling a wait on the handle would cancel the SDK's own stream reader and lose
        the end event, so deadlines only ever cancel waits on this task, never the task.
        """
        if self._end_task is None:
            self._end_task = asyncio.ensure_future(self._exit_code())
        return self._end_task

    async def wait(self, timeout: float | None) -> ExecResult:
        if self._finished is None:
            try:
                exit_code = await asyncio.wait_for(asyncio.shield(self._end()), timeout)
                self._finished = (exit_code, False)
            except TimeoutError:
                await self.kill()
                self._finished = (KILLED_EXIT_CODE, True)
        exit_code, timed_out = self._finished
        cut = self.stdout.dropped or self.stderr.dropped
        return ExecResult(
            exit_code=exit_code,
            stdout=self.stdout.text(self.paths[0]),
            stderr=self.stderr.text(self.paths[1]),
            timed_out=timed_out,
            duration=time.monotonic() - self.started,
            limits_hit=("max_output_bytes",) if cut else (),
        )

    async def _exit_code(self) -> int:
        exit_exception = self._sandbox._e2b.CommandExitException
        try:
            result = await self.handle.wait()
        except exit_exception as error:
            return exit_code_from_envd(error.exit_code, error.error)
        return exit_code_from_envd(result.exit_code, result.error)

    async def kill(self) -> None:
        """SIGKILL the command's process group inside the sandbox, then the command itself."""
        pid = int(self.handle.pid)
        await self._sandbox._run_quiet(f"kill -KILL -- -{pid} 2>/dev/null; true")
        try:
            await asyncio.wait_for(self.handle.kill(), self._sandbox._config.kill_timeout)
        except Exception as error:
            logger.warning("E2B kill of pid %d failed: %r", pid, error)
        # Let the stream deliver its end event (and the last output) before reporting.
        try:
            await asyncio.wait_for(asyncio.shield(self._end()), self._sandbox._config.kill_timeout)
        except Exception as error:
            logger.warning("E2B command %d did not report its end after kill: %r", pid, error)
            await self.handle.disconnect()
        self.stdout.close()
        self.stderr.close()


async def _kill_once_started(starting: asyncio.Future[_Command]) -> None:
    try:
        command = await starting
    except Exception:
        return  # it never started
    await command.kill()


class E2BProcess:
    """A detached command in an E2B sandbox; output streams into host files."""

    def __init__(self, command: _Command) -> None:
        self._command = command

    @property
    def pid(self) -> int:
        return int(self._command.handle.pid)

    @property
    def stdout_path(self) -> Path:
        assert self._command.paths[0] is not None
        return self._command.paths[0]

    @property
    def stderr_path(self) -> Path:
        assert self._command.paths[1] is not None
        return self._command.paths[1]

    async def wait(self, timeout: float | None = None) -> ExecResult:
        return await self._command.wait(timeout)

    async def kill(self) -> None:
        await self._command.kill()


@dataclass(frozen=True, slots=True)
class _Own:
    """How the backend runs one of its own commands: as which user (envd's default when None),
    and how much of its stderr it keeps."""

    user: str | None = None
    stderr_limit: int | None = None


class E2BSandbox:
    """A running E2B sandbox. Create it with `E2BBackend.create`."""

    def __init__(
        self,
        sdk_sandbox: AsyncSandbox,
        e2b_module: Any,
        *,
        config: E2BConfig,
        env: Mapping[str, str],
        endpoint_url: str | None,
        max_output_bytes: int | None = ResourceLimits().max_output_bytes,
        workspace: str | None = None,
    ) -> None:
        self._sdk = sdk_sandbox
        self._workspace = workspace or config.workspace_path
        self._max_output = max_output_bytes
        self._e2b = e2b_module
        self._config = config
        self._env = dict(env)
        self._endpoint_url = endpoint_url
        self._output_dir: Path | None = None
        self._processes: list[_Command] = []
        self._closed = False
        self._release: asyncio.Future[None] | None = None

    @property
    def sandbox_id(self) -> str:
        return str(self._sdk.sandbox_id)

    @property
    def workspace(self) -> str:
        return self._workspace

    @property
    def endpoint_url(self) -> str | None:
        return self._endpoint_url

    @property
    def isolated(self) -> bool:
        return True

    @property
    def source_repository(self) -> Path | None:
        return None

    @property
    def base_repository(self) -> str | None:
        """None: E2B cannot mount a host repository read-only inside, so `capture_diff`
        refuses an E2B sandbox."""
        return None

    async def _prepare_workspace(self, spec: SandboxSpec) -> None:
        q = shlex.quote(self.workspace)
        if isinstance(spec.workspace, ImageWorkspace):
            found = await self.exec(f"test -d {q}", cwd="/", timeout=self._config.request_timeout)
            if not found.ok:
                raise SandboxBootError(f"the template has no directory {self.workspace}")
            return
        made = await self.exec(f"mkdir -p -- {q}", cwd="/", timeout=self._config.request_timeout)
        if not made.ok:
            raise SandboxBootError(f"could not create the workspace: {made.stderr}")
        if isinstance(spec.workspace, DirectoryWorkspace):
            archive = await asyncio.to_thread(_tar_directory, spec.workspace.source)
            remote = f"/tmp/workspace-{uuid.uuid4().hex}.tar"
            await self.write_file(remote, archive)
            unpacked = await self.exec(
                f"tar -xf {shlex.quote(remote)} -C {q} && rm -f -- {shlex.quote(remote)}",
                cwd="/",
                timeout=self._config.boot_timeout,
            )
            if not unpacked.ok:
                raise SandboxBootError(f"could not unpack the workspace: {unpacked.stderr}")

    async def _launch(
        self,
        cmd: str,
        cwd: str | None,
        env: Mapping[str, str] | None,
        paths: tuple[Path | None, Path | None],
        *,
        own: _Own | None = None,
    ) -> _Command:
        """Start `cmd` inside. A cancelled launch still waits for envd's answer and kills what
        it started: the command may already be running, and nobody would ever hold its handle.

        Commands the backend runs for itself (`own`) get none of the spec's environment."""
        if self._closed:
            raise SandboxClosedError("sandbox is closed")
        merged = {**(self._env if own is None else {}), **(env or {})}
        validate_env(merged)
        directory = self._resolve(cwd) if cwd is not None else self.workspace
        starting = asyncio.ensure_future(
            self._start_command(cmd, merged, directory, paths, own or _Own())
        )
        try:
            return await asyncio.shield(starting)
        except asyncio.CancelledError:
            await _finish_despite_cancellation(_kill_once_started(starting))
            raise

    async def _start_command(
        self,
        cmd: str,
        envs: dict[str, str],
        directory: str,
        paths: tuple[Path | None, Path | None],
        own: _Own,
    ) -> _Command:
        limit = self._max_output
        stdout = _OutputSink(paths[0], limit)
        stderr = _OutputSink(paths[1], own.stderr_limit or limit)
        try:
            handle = await asyncio.wait_for(
                self._sdk.commands.run(
                    cmd,
                    background=True,
                    envs=envs,
                    cwd=directory,
                    on_stdout=stdout,
                    on_stderr=stderr,
                    timeout=0,
                    request_timeout=self._config.request_timeout,
                    retain_output=False,
                    user=own.user,
                ),
                self._config.request_timeout,
            )
        except BaseException:
            stdout.close()
            stderr.close()
            raise
        return _Command(self, handle, stdout, stderr, paths)

    async def exec(
        self,
        cmd: str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> ExecResult:
        command = await self._launch(cmd, cwd, env, (None, None))
        try:
            return await command.wait(timeout)
        except asyncio.CancelledError:
            await _finish_despite_cancellation(command.kill())
            raise

    async def start(
        self,
        cmd: str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> E2BProcess:
        if self._output_dir is None:
            self._output_dir = Path(
                tempfile.mkdtemp(prefix="e2b-sandbox-", dir=self._config.output_root)
            )
        stem = self._output_dir / uuid.uuid4().hex
        command = await self._launch(
            cmd, cwd, env, (stem.with_suffix(".out"), stem.with_suffix(".err"))
        )
        self._processes.append(command)
        return E2BProcess(command)

    async def start_argv(
        self,
        argv: Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        unset_env: Sequence[str] = (),
    ) -> E2BProcess:
        """envd starts everything through its shell: `argv` is quoted into it and `exec`ed,
        after bash's own `unset` of `unset_env` (no program of the template's is needed)."""
        if not argv:
            raise ValueError("empty argv")
        for name in unset_env:
            if not name.isidentifier():
                raise ValueError(f"not an environment variable name: {name!r}")
        dropped = [name for name in unset_env if name not in (env or {})]  # `env` wins
        unset = f"unset -v -- {' '.join(dropped)}; " if dropped else ""
        return await self.start(f"{unset}exec -- {shlex.join(argv)}", cwd=cwd, env=env)

    @property
    def git_argv(self) -> tuple[str, ...]:
        return ("git",)

    def host_program_argv(self, path: str) -> tuple[str, ...]:
        """E2B mounts no host path: `path` is the template's own program, run as it is."""
        return (path,)

    async def _run_quiet(self, cmd: str) -> None:
        """Best-effort helper command (used while killing); failures are only logged."""
        try:
            command = await self._launch(cmd, "/", None, (None, None))
            await command.wait(self._config.kill_timeout)
        except Exception as error:
            logger.warning("E2B helper command %r failed: %r", cmd, error)

    async def _exec_own(
        self, cmd: str, timeout: float | None, own: _Own | None = None
    ) -> tuple[int, ExecResult]:
        """Run a command of the backend's own in `/` and wait, as `exec` does (killed at
        `timeout` or when cancelled), with none of the spec's environment and HOME pointing
        nowhere, so its login shell reads /etc/profile but no rc file of the user's. Returns
        the command's pid (as envd lists it) and its result."""
        command = await self._launch(cmd, "/", {"HOME": _NO_HOME}, (None, None), own=own or _Own())
        try:
            return int(command.handle.pid), await command.wait(timeout)
        except asyncio.CancelledError:
            await _finish_despite_cancellation(command.kill())
            raise

    async def kill_all(self) -> None:
        """Kill every process of the sandbox this backend can find, and keep the sandbox open;
        raise SandboxCommandError if one is still found after `kill_timeout` seconds.

        Each round SIGKILLs every process envd lists, through envd's SendSignal (which reaches
        that process only: the SDK's request names no process group), then runs a sweep as root
        (`bash -l -c`, builtins only) that SIGKILLs every process whose environment holds the
        sandbox's `E2B_SANDBOX_ID`, or that descends from such a process, until a scan of
        /proc finds none. envd puts that variable into every command's environment and
        children inherit it, so the sweep reaches children, detached commands and `setsid` or
        `nohup` daemons that kept their environment. Rounds repeat until envd lists nothing and
        the sweep found nothing.

        Not reached: a process that has left envd's process tree (its parents are gone) and
        whose environment lacks `E2B_SANDBOX_ID` (emptied with `env -i`, reset by `sudo`) is
        found by neither, is not reported, and runs on until the sandbox is closed. The sweep's
        login shell reads /etc/profile, the template's file, which an agent that can become
        root inside (through sudo, say) can rewrite. docs/e2b.md has the details.
        """
        if self._closed:
            raise SandboxClosedError("sandbox is closed")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._config.kill_timeout
        while True:
            await self._kill_listed()
            remaining = max(deadline - loop.time(), 0.0)
            sweep = _SWEEP_SCRIPT.replace("@LIMIT@", str(max(1, int(remaining / 2))))
            sweep_pid, swept = await self._exec_own(sweep, remaining, _Own(user=_SWEEP_USER))
            if swept.exit_code == _SWEEP_NO_MARKER:
                raise SandboxCommandError(
                    f"kill_all cannot tell the sandbox's processes: {swept.stderr.strip()}"
                )
            listed = [pid for pid in await self._listed() if pid != sweep_pid]
            if swept.ok and not listed:
                return
            if loop.time() >= deadline:
                survivors = swept.stdout.strip() if swept.exit_code == _SWEEP_SURVIVORS else ""
                raise SandboxCommandError(
                    f"processes survived kill_all for {self._config.kill_timeout}s: envd "
                    f"lists {listed}; the sweep exited {swept.exit_code} (timed out "
                    f"{swept.timed_out}) leaving [{survivors}]: {swept.stderr.strip()[-2000:]}"
                )
            await asyncio.sleep(_MIN_POLL_DELAY)

    async def _listed(self) -> list[int]:
        """The pids of the commands envd runs (its List RPC)."""
        try:
            processes = await asyncio.wait_for(
                self._sdk.commands.list(request_timeout=self._config.request_timeout),
                self._config.request_timeout,
            )
        except (self._e2b.SandboxException, TimeoutError) as error:
            raise SandboxCommandError(f"envd did not list the processes: {error!r}") from error
        return [int(process.pid) for process in processes]

    async def _kill_listed(self) -> None:
        """SIGKILL every command envd lists, through its SendSignal RPC. A refusal is only
        logged: envd keeps listing a command for a moment after its end, and signalling it then
        fails; whether anything survived is for envd's next listing to say."""

        async def kill(pid: int) -> None:
            try:
                await asyncio.wait_for(
                    self._sdk.commands.kill(pid, request_timeout=self._config.request_timeout),
                    self._config.request_timeout,
                )
            except (self._e2b.SandboxException, TimeoutError) as error:
                logger.info("E2B SendSignal to pid %d failed: %r", pid, error)

        await asyncio.gather(*(kill(pid) for pid in await self._listed()))

    async def run_python(
        self,
        script: str,
        args: Sequence[str] = (),
        *,
        stdin: bytes = b"",
        timeout: float | None = None,
        max_output_bytes: int = 64 << 20,
    ) -> ScriptResult:
        """Run `python3 -I -S -c script args...` inside, in `/`, with an environment of PATH
        (/usr/local/bin:/usr/bin:/bin, where python3 is looked up) and LC_ALL only: envd's
        variables (`E2B_SANDBOX`, `E2B_SANDBOX_ID`, ...) and the spec's are removed by
        `env -i`. `stdin` is written to a fresh file under /tmp and redirected in; stdout goes
        to another, whose size is read first and which is cut to `max_output_bytes` (then
        `truncated`) before it is downloaded as bytes; stderr is kept up to 64 KiB. Both files
        are removed afterwards. At `timeout` the script is killed (exit 137, `timed_out`).

        What "an interpreter the sandbox's commands cannot have replaced" means here is only
        as strong as the template: envd starts every command as `/bin/bash -l -c`, so a login
        shell of envd's default user reads /etc/profile (HOME points at a directory that does
        not exist, so no rc file of the user's is read) before `env -i` runs, and
        /usr/bin/env, python3 and its standard library are the template's files. The template
        owns them; an agent that can become root inside (through sudo, say) can replace them.
        """
        if self._closed:
            raise SandboxClosedError("sandbox is closed")
        if max_output_bytes < 0:
            raise ValueError("max_output_bytes must not be negative")
        if "\0" in script or any("\0" in arg for arg in args):
            raise ValueError("a script and its arguments cannot contain NUL bytes")
        stem = f"/tmp/sandbox-script-{uuid.uuid4().hex}"
        source = f"{stem}.in" if stdin else "/dev/null"
        target = f"{stem}.out"
        argv = [
            "/usr/bin/env",
            "-i",
            *(f"{name}={value}" for name, value in _SCRIPT_ENV.items()),
            "python3",
            "-I",
            "-S",
            "-c",
            script,
            *args,
        ]
        cmd = f"exec {shlex.join(argv)} <{shlex.quote(source)} >{shlex.quote(target)}"
        started = time.monotonic()
        try:
            if stdin:
                await self.write_file(source, stdin)
            _, result = await self._exec_own(cmd, timeout, _Own(stderr_limit=_SCRIPT_STDERR_BYTES))
            stdout, truncated = await self._read_bounded(target, max_output_bytes)
        finally:
            await _finish_despite_cancellation(self._remove_quietly(f"{stem}.in", target))
        return ScriptResult(
            exit_code=result.exit_code,
            stdout=stdout,
            stderr=result.stderr,
            timed_out=result.timed_out,
            duration=time.monotonic() - started,
            truncated=truncated,
        )

    async def _read_bounded(self, path: str, limit: int) -> tuple[bytes, bool]:
        """At most `limit` bytes of a file of ours inside, and whether it held more: its size
        is read first, and a longer file is cut to `limit` before it is downloaded."""
        q = shlex.quote(path)
        _, sized = await self._exec_own(
            f'[ -e {q} ] || exit 0; size=$(stat -c %s -- {q}) || exit 1; echo "size=$size"; '
            f'[ "$size" -le {limit} ] || truncate -s {limit} -- {q}',
            self._config.request_timeout,
        )
        found = _SIZE.findall(sized.stdout)
        if not sized.ok:
            raise SandboxCommandError(
                f"could not size the script's output (exit {sized.exit_code}): "
                f"{sized.stderr.strip()[-2000:]}"
            )
        size = int(found[-1]) if found else 0
        data = await self._download(path) if size else b""
        return data[:limit], size > limit or len(data) > limit

    async def _remove_quietly(self, *paths: str) -> None:
        """Remove files of ours inside; a failure is only logged."""
        if self._closed:
            return
        try:
            await self._exec_own(f"rm -f -- {shlex.join(paths)}", self._config.kill_timeout)
        except Exception as error:
            logger.warning("E2B could not remove %s: %r", paths, error)

    def _resolve(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(self.workspace, path))

    async def read_file(self, path: str, *, max_bytes: int = DEFAULT_READ_BYTES) -> bytes:
        """Checked inside first (a regular file of at most `max_bytes`), then downloaded. The
        file can change between the two; a VM's agent can fill its own disk, not the host's
        memory beyond one download (E2B's file API has no range reads)."""
        if self._closed:
            raise SandboxClosedError("sandbox is closed")
        target = self._resolve(path)
        q = shlex.quote(target)
        _, checked = await self._exec_own(
            f"[ -e {q} ] || exit {_FILE_MISSING}; [ -d {q} ] && exit {_FILE_IS_DIR}; "
            f"[ -f {q} ] || exit {_FILE_NOT_REGULAR}; stat -L -c %s -- {q}",
            self._config.request_timeout,
        )
        if checked.exit_code == _FILE_MISSING:
            raise SandboxFileNotFoundError(target)
        if checked.exit_code == _FILE_IS_DIR:
            raise SandboxCommandError(f"is a directory, not a file: {target}")
        if checked.exit_code == _FILE_NOT_REGULAR:
            raise SandboxCommandError(f"not a regular file (a FIFO, device or socket): {target}")
        if not checked.ok or not checked.stdout.strip().isdigit():
            raise SandboxCommandError(
                f"could not check {target} (exit {checked.exit_code}): {checked.stderr[-2000:]}"
            )
        if int(checked.stdout) > max_bytes:
            raise SandboxCommandError(f"{target} is larger than max_bytes={max_bytes}")
        data = await self._download(target)
        if len(data) > max_bytes:
            raise SandboxCommandError(f"{target} is larger than max_bytes={max_bytes}")
        return data

    async def _download(self, target: str) -> bytes:
        try:
            data = await asyncio.wait_for(
                self._sdk.files.read(target, format="bytes"), self._config.request_timeout
            )
        except self._e2b.FileNotFoundException as error:
            raise SandboxFileNotFoundError(target) from error
        return bytes(data)

    async def read_text(self, path: str, *, max_bytes: int = DEFAULT_READ_BYTES) -> str:
        return (await self.read_file(path, max_bytes=max_bytes)).decode("utf-8")

    async def write_file(self, path: str, data: bytes | str) -> None:
        if self._closed:
            raise SandboxClosedError("sandbox is closed")
        target = self._resolve(path)
        payload = data.encode("utf-8") if isinstance(data, str) else data
        try:
            await asyncio.wait_for(
                self._sdk.files.write(target, payload, use_octet_stream=True),
                self._config.request_timeout,
            )
        except self._e2b.SandboxException as error:
            raise SandboxCommandError(f"writing {target} failed: {error}") from error

    async def close(self) -> None:
        """Kill the sandbox and drop what we hold of it; idempotent.

        The work runs once, in its own task: a cancelled `close` waits for it to finish and then
        re-raises the cancellation, so the kill request is never the part that gets dropped.
        """
        if self._release is None:
            self._closed = True
            self._release = asyncio.ensure_future(self._kill_and_release())
        await _finish_despite_cancellation(self._release)

    async def _kill_and_release(self) -> None:
        await _kill_sdk_sandbox(self._sdk, self._config.kill_timeout)
        for command in self._processes:
            with contextlib.suppress(Exception):
                await command.handle.disconnect()
            command.stdout.close()
            command.stderr.close()
        if self._output_dir is not None:
            await asyncio.to_thread(shutil.rmtree, self._output_dir, True)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
