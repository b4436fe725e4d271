"""The embedded default backend: bubblewrap sandboxes on this machine.

Each sandbox is one `bwrap` holding fresh namespaces around our init (see _bwrap.py and
_init.py); every command is a child of that init, so it runs with no capabilities, no way to
regain them (no_new_privs, no user namespaces) and the seccomp filter (_seccomp.py), as an
unprivileged host uid (_uids.py) inside a cgroup of its own (_cgroups.py). The workspace and
every scratch directory are size-limited tmpfs that vanish with the sandbox. The threat model
and what each layer stops are in the package's docs/isolation.md.

There is no silent downgrade: when a layer cannot be had here, creating a sandbox fails with an
error naming what is missing. Plain host processes (`isolation="none"`, _host.py) are only ever
used when asked for by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import Any, Literal, TypeVar

from sandbox import _owner
from sandbox._bwrap import (
    PYTHON_MOUNT,
    RUN_SANDBOX,
    SANDBOX_WORKSPACE,
    SCRATCH_MOUNTS,
    SOURCE_MOUNT,
    Bind,
    BootFds,
    ImageTree,
    Layout,
    bwrap_argv,
)
from sandbox._cgroups import CONTROLLERS, CgroupLimits, CgroupSupport, Counters, SandboxCgroup
from sandbox._commands import CommandSandbox, Launched
from sandbox._control import InitChannel, InitGoneError
from sandbox._errors import (
    SandboxBootError,
    SandboxUnavailableError,
    UnsupportedSpecError,
)
from sandbox._forward import HostRelay, RelayBudget
from sandbox._host import HostSandbox
from sandbox._image_root import ImagePlan, ImageRoot, inside, plan
from sandbox._images import ImageCache, ImageCacheConfig, ImageLease
from sandbox._private_dirs import owned_directory, private_dir, remove_tree
from sandbox._runtime import HostRuntime, program_commands
from sandbox._seccomp import compile_filter
from sandbox._snapshot import snapshot_directory
from sandbox._spec import (
    DirectoryWorkspace,
    EmptyWorkspace,
    GitWorkspace,
    ImageWorkspace,
    OciLayoutImage,
    ReadOnlyBind,
    RegistryImage,
    RootfsImage,
    SandboxSpec,
)
from sandbox._stage import stage_dir, staged_launch
from sandbox._subids import SubordinateIds
from sandbox._uids import UidLease, UidRange, lease_uid
from sandbox._workspace import CheckoutError, checkout_repo, git_common_dir, resolve_commit

logger = logging.getLogger(__name__)
_T = TypeVar("_T")

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_SEED_PATH = f"{RUN_SANDBOX}/seed"
_SNAPSHOT_PATH = f"{RUN_SANDBOX}/base.git"
_GIT_CORE = PurePosixPath(RUN_SANDBOX, "git-core")
_HOST_GIT = str(_GIT_CORE / "git")
_STATE_PREFIX = "sandbox-"
_BWRAP_EXIT_S = 5.0
_KILL_ALL_S = 10.0
# Git settings for populating the workspace inside: no system config, and a global config
# that trusts the read-only source (another uid owns it). Only a global config will do: git
# hides command-line and environment config from the process that reads a local source.
_GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "LC_ALL": "C",
}
_TRUST_SOURCE = (
    'export GIT_CONFIG_GLOBAL="$(mktemp)" && '
    "printf '[safe]\\n\\tdirectory = *\\n' > \"$GIT_CONFIG_GLOBAL\" && "
    "trap 'rm -f \"$GIT_CONFIG_GLOBAL\"' EXIT && "
)
# Copies an image's workspace directory into the sandbox's own (run by our interpreter, so an
# image needs no tools): files, directories and links with their modes and times; anything
# else (a FIFO, a device) is left out, never opened.
_COPY_SCRIPT = r"""
import os, shutil, stat, sys
source, target = sys.argv[1], sys.argv[2]
for top, dirs, files in os.walk(source):
    here = os.path.join(target, os.path.relpath(top, source))
    for name in dirs + files:
        src, dst = os.path.join(top, name), os.path.join(here, name)
        info = os.lstat(src)
        if stat.S_ISLNK(info.st_mode):
            os.symlink(os.readlink(src), dst)
        elif stat.S_ISDIR(info.st_mode):
            os.mkdir(dst)
        elif stat.S_ISREG(info.st_mode):
            shutil.copyfile(src, dst, follow_symlinks=False)
        else:
            continue
        if not stat.S_ISLNK(info.st_mode):
            os.utime(dst, ns=(info.st_atime_ns, info.st_mtime_ns))
    for name in dirs:
        os.chmod(os.path.join(here, name), stat.S_IMODE(os.lstat(os.path.join(top, name)).st_mode))
    for name in files:
        info = os.lstat(os.path.join(top, name))
        if stat.S_ISREG(info.st_mode):
            os.chmod(os.path.join(here, name), stat.S_IMODE(info.st_mode))
for top, dirs, _ in os.walk(target, topdown=False):
    for name in dirs:
        info = os.lstat(os.path.join(source, os.path.relpath(os.path.join(top, name), target)))
        os.utime(os.path.join(top, name), ns=(info.st_atime_ns, info.st_mtime_ns))
"""
_RLIMITS = (
    ("max_open_files", "RLIMIT_NOFILE"),
    ("max_file_size_bytes", "RLIMIT_FSIZE"),
    ("cpu_seconds", "RLIMIT_CPU"),
)


@dataclass(frozen=True, slots=True)
class LocalConfig:
    """How the local backend runs sandboxes.

    isolation: "bwrap" (the default) isolates every sandbox and fails loudly where it cannot;
    "none" runs plain host processes. "none" is UNSAFE for model-written code: the code runs
    as you, with your files and network. Use it only for commands you wrote yourself.
    state_root: where per-sandbox state directories (command output files) are created;
    None means a directory of the calling user's own under /tmp (`agent-rl-sandboxes-<uid>`,
    mode 0700, refused if another user planted it).
    keep_state: leave the state directory on disk after close, for debugging.
    uids: the host uids sandboxes run as when the caller is root (one per live sandbox).
    subordinate_ids: when the caller is not root, run each sandbox as a host uid of its own
    from the caller's subordinate ids (/etc/subuid, /etc/subgid; needs `newuidmap` and
    `newgidmap`: _subids.py) where the host grants some; otherwise, or when False, all
    sandboxes run as the caller (`enforcement()` says which).
    use_cgroups: limit each sandbox as a whole with its own cgroups where the host allows;
    False enforces limits with rlimits only (per process, or per host user for processes).
    cgroup_parent: a cgroup path (relative to each hierarchy's root) delegated to us, under
    which per-sandbox groups are made; None means `agent-sandboxes/` below our own cgroup.
    images: where RegistryImage and OciLayoutImage specs are pulled and unpacked, once per
    node (docs/images.md); None refuses them (RootfsImage needs no cache).
    """

    isolation: Literal["bwrap", "none"] = "bwrap"
    state_root: Path | None = None
    boot_timeout: float = 10.0
    keep_state: bool = False
    base_env: Mapping[str, str] = field(
        default_factory=lambda: {"PATH": DEFAULT_PATH, "LANG": "C.UTF-8"}
    )
    uids: UidRange = field(default_factory=UidRange)
    subordinate_ids: bool = True
    use_cgroups: bool = True
    cgroup_parent: PurePosixPath | None = None
    images: ImageCacheConfig | None = None

    def __post_init__(self) -> None:
        if self.isolation not in ("bwrap", "none"):
            raise ValueError(
                f"isolation must be 'bwrap' or 'none' (unsafe, no sandbox), got {self.isolation!r}"
            )


@dataclass(frozen=True, slots=True)
class Enforcement:
    """How the backend isolates and limits sandboxes on this host, in words for logs."""

    host_uid: str
    cgroup_controllers: tuple[str, ...]
    fallbacks: tuple[str, ...]
    unreported: tuple[str, ...] = ()
    """`ResourceLimits` fields enforced here whose hits `ExecResult.limits_hit` never names:
    the kernel counts them nowhere (a refused open, fork or allocation is only an error code
    to the process that made it). `cpu_seconds` and `max_file_size_bytes` are named when the
    command itself, its shell's last child or an orphaned process dies of their signal, not
    when the shell goes on after an earlier child died of it."""
    oom_exempt_init: bool = False
    """Init is exempt from the OOM killer (root with CAP_SYS_RESOURCE): a sandbox whose memory
    is full loses commands, never init. Otherwise a fork that finds no memory may take init."""


class LocalBackend:
    """Creates local sandboxes. One backend can serve many concurrent sandboxes."""

    def __init__(self, config: LocalConfig | None = None) -> None:
        self.config = config or LocalConfig()
        self._images = ImageCache(self.config.images) if self.config.images else None
        self._prepared: _Prepared | None = None
        self._prepare_lock = asyncio.Lock()
        self._warned = False

    @property
    def isolated(self) -> bool:
        return self.config.isolation == "bwrap"

    async def enforcement(self) -> Enforcement:
        """What protects sandboxes here; prepares the backend (once) if needed."""
        return (await self._prepare()).enforcement

    async def create(self, spec: SandboxSpec) -> CommandSandbox:
        if self.config.isolation == "none":
            return await self._create_on_host(spec)
        prepared = await self._prepare()
        return await _Boot(self.config, prepared, spec, self._images).run()

    async def _prepare(self) -> _Prepared:
        async with self._prepare_lock:
            if self._prepared is None:
                prepared = await asyncio.to_thread(_Prepared.discover, self.config)
                await _Boot(self.config, prepared, SandboxSpec()).probe()
                self._prepared = prepared
                logger.info("local sandboxes: %s", prepared.enforcement)
                for fallback in prepared.enforcement.fallbacks:
                    logger.warning("local sandboxes: %s", fallback)
            return self._prepared

    async def _create_on_host(self, spec: SandboxSpec) -> HostSandbox:
        if spec.image is not None:
            raise UnsupportedSpecError("isolation='none' runs on the host's own root, no image")
        if not self._warned:
            self._warned = True
            logger.warning(
                "sandbox isolation disabled by config (isolation='none'): commands run as "
                "plain host processes with this user's files and network; never use it for "
                "model-written code"
            )
        state = await asyncio.to_thread(_make_state_dir, self.config)
        try:
            workspace = state / "workspace"
            home = state / "home"
            await asyncio.to_thread(_materialize_on_host, spec, workspace, home)
            base = None
            if isinstance(spec.workspace, GitWorkspace):
                base = str(await asyncio.to_thread(git_common_dir, spec.workspace.repo))
            prlimit = shutil.which("prlimit")
            if prlimit is None:
                raise SandboxUnavailableError("resource limits need prlimit (util-linux)")
            endpoint = None
            if spec.network is not None:
                endpoint = f"http://{spec.network.host}:{spec.network.port}"
            return HostSandbox(
                state_dir=state,
                workspace=workspace,
                env={**self.config.base_env, "HOME": str(home), **spec.env},
                keep_state=self.config.keep_state,
                prlimit=prlimit,
                limits=spec.limits,
                endpoint_url=endpoint,
                base_repository=base,
                source_repository=(
                    spec.workspace.repo if isinstance(spec.workspace, GitWorkspace) else None
                ),
            )
        except BaseException:
            await asyncio.to_thread(remove_tree, state)
            raise


class LocalSandbox(CommandSandbox):
    """A running bubblewrap sandbox. Create it with `LocalBackend.create`."""

    def __init__(
        self,
        *,
        boot: _Booted,
        env: Mapping[str, str],
        keep_state: bool,
        python: tuple[Sequence[str], Mapping[str, str]],
        base_repository: str | None,
        max_output_bytes: int | None,
        source_repository: Path | None = None,
        workspace: str = SANDBOX_WORKSPACE,
        host_programs: Mapping[str, Sequence[str]] | None = None,
        git_argv: Sequence[str] = ("git",),
    ) -> None:
        super().__init__(
            state_dir=boot.state_dir,
            workspace=workspace,
            env=env,
            keep_state=keep_state,
            max_output_bytes=max_output_bytes,
            host_programs=host_programs,
            git_argv=git_argv,
        )
        self._boot = boot
        self._python_inside = python
        self._base_repository = base_repository
        self._source_repository = source_repository
        self._relay: HostRelay | None = None
        self._endpoint_url: str | None = None

    @property
    def endpoint_url(self) -> str | None:
        return self._endpoint_url

    @property
    def isolated(self) -> bool:
        return True

    @property
    def host_uid(self) -> int:
        """The unprivileged host uid every process of this sandbox runs as."""
        return self._boot.host_uid

    @property
    def init_pid(self) -> int:
        """Host pid of the sandbox's pid 1 (our init)."""
        return self._boot.init_pid

    async def _launch(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str,
        stdio: tuple[int, int, int],
    ) -> Launched:
        try:
            pid = await self._boot.channel.spawn(argv, env, cwd, stdio)
        except InitGoneError as gone:
            raise self._boot.why_gone(gone) from gone
        return _InitProcess(self._boot, pid)

    @property
    def base_repository(self) -> str | None:
        return self._base_repository

    @property
    def source_repository(self) -> Path | None:
        return self._source_repository

    def _python(self) -> tuple[Sequence[str], Mapping[str, str]]:
        return self._python_inside

    async def _kill_all(self) -> int:
        return await self._boot.channel.kill_all(_KILL_ALL_S)

    async def _forward(
        self,
        inside_port: int,
        host: str,
        port: int,
        max_connections: int | None,
        budget: RelayBudget,
    ) -> None:
        listener = await self._boot.channel.listen(inside_port)
        self._relay = HostRelay(
            listener, host, port, max_connections=max_connections, budget=budget
        )
        await self._relay.start()
        self._endpoint_url = f"http://127.0.0.1:{inside_port}"

    @property
    def refused_connections(self) -> int:
        """Connections to the forwarded endpoint closed at once because a cap was reached."""
        return self._relay.refused if self._relay is not None else 0

    def _limits_token(self) -> object:
        counters = self._boot.cgroup.counters() if self._boot.cgroup else None
        channel = self._boot.channel
        return counters, self.refused_connections, dict(channel.rlimit_kills)

    def _limits_hit_since(self, token: object) -> tuple[str, ...]:
        """The cgroups' counters, the relay's refusals, and what init reported: tmpfs full
        when the command ended, orphans killed by an rlimit's signal (a command's own death
        by one is in its return code)."""
        assert isinstance(token, tuple)
        counters, refused, kills = token
        hits: tuple[str, ...] = ()
        if isinstance(counters, Counters) and self._boot.cgroup is not None:
            hits = self._boot.cgroup.counters().hits_since(counters)
        if self.refused_connections > refused:
            hits += ("max_connections",)
        channel = self._boot.channel
        hits += tuple(
            limit for limit, count in channel.rlimit_kills.items() if count > kills.get(limit, 0)
        )
        return hits + channel.full

    async def _shutdown(self) -> None:
        if self._relay is not None:
            await self._relay.close()
        await self._boot.stop()


class _InitProcess:
    """A command started by the sandbox's init."""

    def __init__(self, boot: _Booted, pid: int) -> None:
        self._boot = boot
        self._pid = pid
        self._returncode: int | None = None

    @property
    def returncode(self) -> int | None:
        return self._returncode

    async def wait(self) -> int:
        try:
            self._returncode = await self._boot.channel.wait(self._pid)
        except InitGoneError as gone:
            raise self._boot.why_gone(gone) from gone
        return self._returncode

    def kill_group(self) -> None:
        self._boot.channel.kill_group(self._pid)


# -- booting ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Prepared:
    """Everything a boot needs that is the same for every sandbox of a backend."""

    bwrap: str
    python: str
    python_prefix: Path | None
    """The interpreter's installation, when it is not under /usr (then mounted at PYTHON_MOUNT)."""
    prefix: Path
    """The interpreter's installation, wherever it is."""
    seccomp: bytes
    init_source: bytes
    as_root: bool
    subids: SubordinateIds | None
    """A non-root caller's subordinate ids, when sandboxes run as uids of their own."""
    stage: Path | None
    """Where bind sources are staged before dropping to the sandbox uid (None: no own uid)."""
    cgroups: CgroupSupport
    enforcement: Enforcement
    relays: RelayBudget
    """Connections all of this backend's forwarded endpoints may relay at once."""
    checked_roots: set[Path] = field(default_factory=set)
    """Root file systems (RootfsImage) already searched for Unix sockets."""

    @property
    def python_inside(self) -> str:
        """The interpreter's path as init sees it."""
        if self.python_prefix is None:
            return self.python
        return str(PurePosixPath(PYTHON_MOUNT) / Path(self.python).relative_to(self.python_prefix))

    @property
    def script_python(self) -> tuple[Sequence[str], Mapping[str, str]]:
        """Init's interpreter and the environment `run_python` gives it: read-only from
        inside (host /usr or our read-only mount), so no command can have replaced it."""
        env = {"PATH": DEFAULT_PATH, "LC_ALL": "C.UTF-8"}
        if self.python_prefix is not None:
            env["LD_LIBRARY_PATH"] = f"{PYTHON_MOUNT}/lib"
        return (self.python_inside,), env

    def runtime(self) -> HostRuntime:
        """The interpreter's loader and libraries, for roots other than the host's (blocking:
        found once per interpreter, then cached)."""
        return _host_runtime(Path(self.python), self.prefix)

    @classmethod
    def discover(cls, config: LocalConfig) -> _Prepared:
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            raise SandboxUnavailableError(
                "bubblewrap (bwrap) not found: install it (apt-get install bubblewrap), or "
                "pass LocalConfig(isolation='none') to run commands unsandboxed (unsafe for "
                "model-written code)"
            )
        python = os.path.realpath(sys.executable)
        prefix = Path(os.path.realpath(sys.base_prefix))
        visible = python.startswith("/usr/") and prefix.is_relative_to("/usr")
        if not visible and not Path(python).is_relative_to(prefix):
            raise SandboxUnavailableError(
                f"the Python interpreter {python} lies outside its prefix {prefix}"
            )
        cgroups = (
            CgroupSupport.discover(config.cgroup_parent)
            if config.use_cgroups
            else CgroupSupport(problems=dict.fromkeys(CONTROLLERS, "disabled by config"))
        )
        as_root = os.geteuid() == 0
        subids: SubordinateIds | str = "not asked for (LocalConfig.subordinate_ids=False)"
        if not as_root and config.subordinate_ids:
            subids = SubordinateIds.discover()
        own_uids = as_root or isinstance(subids, SubordinateIds)
        _sweep(config, cgroups)
        return cls(
            bwrap=bwrap,
            python=python,
            python_prefix=None if visible else prefix,
            prefix=prefix,
            seccomp=compile_filter(),
            init_source=resources.files("sandbox").joinpath("_init.py").read_bytes(),
            as_root=as_root,
            subids=subids if isinstance(subids, SubordinateIds) else None,
            stage=stage_dir(_host_tmp()) if own_uids else None,
            cgroups=cgroups,
            enforcement=_enforcement(config, cgroups, as_root, subids),
            relays=RelayBudget(),
        )


def _enforcement(
    config: LocalConfig, cgroups: CgroupSupport, as_root: bool, subids: SubordinateIds | str
) -> Enforcement:
    fallbacks = []
    missing = {
        "pids": "max_processes is enforced per host user with RLIMIT_NPROC",
        "memory": "memory_bytes is enforced per process with RLIMIT_DATA",
        "cpu": "cpu_cores is not enforced",
    }
    for controller, consequence in missing.items():
        if controller not in cgroups.hierarchies:
            reason = cgroups.problems.get(controller, "unavailable")
            fallbacks.append(f"no {controller} cgroup ({reason}): {consequence}")
    if as_root:
        host_uid = f"one uid per sandbox from {config.uids.first} (+{config.uids.count})"
    elif isinstance(subids, SubordinateIds):
        first, count = subids.uids.first, subids.uids.count
        host_uid = f"one uid per sandbox from the caller's subordinate ids {first} (+{count})"
    else:
        host_uid = f"the caller's uid {os.geteuid()}, shared by all sandboxes ({subids})"
    unreported = ["max_open_files"]
    if "pids" not in cgroups.hierarchies:
        unreported.append("max_processes")
    if "memory" not in cgroups.hierarchies:
        unreported.append("memory_bytes")
        fallbacks.append("tmpfs files do not count against memory_bytes")
    if isinstance(subids, SubordinateIds):
        instances, watches = subids.inotify_share
        fallbacks.append(
            "inotify instances and watches are charged to the caller (the owner of every "
            f"sandbox's user namespace); each sandbox may take {instances} and {watches}"
        )
    elif not as_root:
        fallbacks.append(
            "per-user kernel quotas (inotify instances and watches, processes, message queues) "
            "are shared by all sandboxes and the caller"
        )
    return Enforcement(
        host_uid,
        tuple(sorted(cgroups.hierarchies)),
        tuple(fallbacks),
        tuple(unreported),
        as_root and _has_capability(_CAP_SYS_RESOURCE),
    )


_CAP_SYS_RESOURCE = 24


def _has_capability(number: int) -> bool:
    """Whether this process holds the capability in its effective set."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> number & 1)
    return False


@dataclass(slots=True)
class _Booted:
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


class _Boot:
    """One sandbox boot: each step registers how to undo it, so a failure leaves nothing."""

    def __init__(
        self,
        config: LocalConfig,
        prepared: _Prepared,
        spec: SandboxSpec,
        images: ImageCache | None = None,
    ) -> None:
        self.config = config
        self.prepared = prepared
        self.spec = spec
        self._fds: list[int] = []
        self.image: ImagePlan | None = None
        self.runtime: HostRuntime | None = None
        self.host_programs: dict[str, tuple[str, ...]] = {}
        self._images = images
        self._image_lease: ImageLease | None = None
        self.runtime_dir: Path | None = None
        self.own_binds: list[ReadOnlyBind] = []
        """Binds of the backend's own: the host's git, on an image that has none."""
        self.snapshot: Path | None = None
        """A bare repository committing the image's workspace directory, when it is none
        (_snapshot.py): the base its change is captured against."""

    async def probe(self) -> None:
        """Boot and close one empty sandbox: proves every layer works here, or says which not."""
        try:
            sandbox = await self.run()
        except SandboxBootError as error:
            raise SandboxUnavailableError(
                f"cannot create a bubblewrap sandbox here: {error}"
            ) from error
        await sandbox.close()

    async def run(self) -> LocalSandbox:
        try:
            return await self._run()
        except BaseException:
            if self._image_lease is not None:  # released by the sandbox once it has one
                await self._image_lease.release()
            raise

    async def _run(self) -> LocalSandbox:
        if self.spec.image is not None:
            await self._lay_out_image()
        source = self.spec.workspace
        commit = None
        if isinstance(source, GitWorkspace):  # a bad repository fails before anything boots
            commit = await asyncio.to_thread(resolve_commit, source.repo, source.commit)
        lease = None
        if self.prepared.as_root:
            lease = await asyncio.to_thread(lease_uid, self.config.uids, _uid_lock_dir())
        elif self.prepared.subids is not None:
            uids = self.prepared.subids.uids
            lease = await asyncio.to_thread(lease_uid, uids, _uid_lock_dir())
        state: Path | None = None
        cgroup: SandboxCgroup | None = None
        try:
            state = await asyncio.to_thread(_make_state_dir, self.config)
            await asyncio.to_thread(self._snapshot_workspace, state)
            cgroup = await asyncio.to_thread(self._cgroup, state.name)
            booted = await self._start(state, lease, cgroup, commit)
        except BaseException:
            await asyncio.to_thread(_undo, state, cgroup, lease, self.config.keep_state)
            raise
        finally:
            for fd in self._fds:
                os.close(fd)
        layout = self._layout()
        image_env = self.image.env if self.image is not None else {}
        env = {**self.config.base_env, **image_env, "HOME": layout.home, **self.spec.env}
        sandbox = LocalSandbox(
            boot=booted,
            env=env,
            keep_state=self.config.keep_state,
            python=self._script_python(),
            max_output_bytes=self.spec.limits.max_output_bytes,
            workspace=layout.workspace,
            host_programs=self.host_programs,
            git_argv=self.host_programs.get(_HOST_GIT, ("git",)),
            **self._repositories(commit),
        )
        try:
            await self._populate(sandbox, commit)
            if self.spec.network is not None:
                network = self.spec.network
                await sandbox._forward(
                    network.inside_port,
                    network.host,
                    network.port,
                    self.spec.limits.max_connections,
                    self.prepared.relays,
                )
        except BaseException:
            await sandbox.close()
            raise
        return sandbox

    async def _lay_out_image(self) -> None:
        """Resolve the spec's image to a root on the host and lay the sandbox out on it."""
        image = self.spec.image
        if isinstance(image, RootfsImage):
            root = ImageRoot(image.path, image.env, image.working_dir, image.user)
        elif isinstance(image, RegistryImage | OciLayoutImage):
            if self._images is None:
                raise UnsupportedSpecError(
                    f"a {type(image).__name__} needs an image cache: LocalConfig(images=...)"
                )
            self._image_lease = lease = await self._images.acquire(image)
            config = lease.config
            root = ImageRoot(lease.root, config.env, config.working_dir, config.user)
        else:
            raise UnsupportedSpecError(
                f"the local backend cannot run a {type(image).__name__} (E2B runs templates)"
            )
        workspace = self.spec.workspace
        self.image = await asyncio.to_thread(
            plan,
            root,
            image_workspace=workspace.path if isinstance(workspace, ImageWorkspace) else None,
            wants_image_workspace=isinstance(workspace, ImageWorkspace),
            default_workspace=PurePosixPath(SANDBOX_WORKSPACE),
            scratch=SCRATCH_MOUNTS[:-1],
            bind_targets=[bind.sandbox_path for bind in self.spec.read_only_binds],
            extra_scratch=self.spec.scratch_dirs,
        )
        self.runtime = await asyncio.to_thread(self.prepared.runtime)
        if not await asyncio.to_thread(_has_git, root):
            self.own_binds.append(await asyncio.to_thread(_host_git))
        if isinstance(image, RootfsImage) and image.path not in self.prepared.checked_roots:
            # A root file system of the caller's: checked once per backend (an unpacked image
            # holds no sockets: tar has no such entry).
            await asyncio.to_thread(_refuse_sockets, [image.path])
            self.prepared.checked_roots.add(image.path)

    def _repositories(self, commit: str | None) -> dict[str, Any]:
        """Where the workspace's own repository is, inside (read-only) and on the host: a
        GitWorkspace's source, or the repository the image keeps at its ImageWorkspace (its
        `.git`, seen through the image's read-only copy)."""
        if commit is not None:
            assert isinstance(self.spec.workspace, GitWorkspace)
            return {"base_repository": SOURCE_MOUNT, "source_repository": self.spec.workspace.repo}
        seed = self.image.seed if self.image is not None else None
        if seed is not None and self.snapshot is None:
            return {"base_repository": f"{_SEED_PATH}/.git", "source_repository": seed}
        if self.snapshot is not None:
            return {"base_repository": _SNAPSHOT_PATH, "source_repository": self.snapshot}
        return {"base_repository": None}

    def _snapshot_workspace(self, state: Path) -> None:
        """Commit an image's workspace directory that is no repository, as it is in the image,
        into the sandbox's state (blocking)."""
        seed = self.image.seed if self.image is not None else None
        if seed is None or inside(seed, PurePosixPath("/.git")) is not None:
            return
        snapshot_directory(seed, state / "base.git")
        self.snapshot = state / "base.git"

    def _layout(self) -> Layout:
        scratch = tuple(str(path) for path in self.spec.scratch_dirs)
        if self.image is None:
            return Layout(scratch=scratch)
        return Layout(str(self.image.workspace), str(self.image.home), scratch)

    def _init_python(self) -> Sequence[str]:
        """How init's interpreter is started: as itself on the host's root, through the
        host's loader on an image's (_runtime.py)."""
        if self.runtime is None:
            return (self.prepared.python_inside,)
        return self.runtime.argv(Path(self.prepared.python), PurePosixPath(PYTHON_MOUNT))

    def _script_python(self) -> tuple[Sequence[str], Mapping[str, str]]:
        if self.runtime is None:
            return self.prepared.script_python
        return self._init_python(), {"PATH": DEFAULT_PATH, "LC_ALL": "C.UTF-8"}

    def _plan_host_programs(self) -> None:
        """How each host program of the spec starts; on an image, the runtime then carries
        their libraries too (_runtime.py; blocking)."""
        programs = self.spec.host_programs()
        programs += [path for bind in self.own_binds for path in bind.host_program_paths()]
        self.runtime, self.host_programs = program_commands(programs, self.runtime)
        if self.runtime is not None:
            self.runtime_dir = self.runtime.materialize(_state_root(self.config))

    def _runtime_sources(self) -> list[tuple[Path, PurePosixPath]]:
        if self.runtime is None:
            return []
        assert self.runtime_dir is not None, "the runtime is materialized with the programs"
        return self.runtime.mounts(
            Path(self.prepared.python), PurePosixPath(PYTHON_MOUNT), self.runtime_dir
        )

    def _cgroup(self, name: str) -> SandboxCgroup | None:
        limits = self.spec.limits
        wanted = CgroupLimits(limits.max_processes, limits.memory_bytes, limits.cpu_cores)
        if not wanted.wanted():
            return None
        return self.prepared.cgroups.create(name, wanted)

    def _keep(self, fd: int) -> int:
        self._fds.append(fd)
        return fd

    def _memfd(self, name: str, data: bytes) -> int:
        fd = self._keep(os.memfd_create(name, 0))
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
        return fd

    def _sources(self) -> list[tuple[Path, PurePosixPath]]:
        """Host paths to bind read-only, and where each appears inside."""
        sources: list[tuple[Path, PurePosixPath]] = []
        if self.runtime is not None:
            sources += self._runtime_sources()
        elif self.prepared.python_prefix is not None:
            sources.append((self.prepared.python_prefix, PurePosixPath(PYTHON_MOUNT)))
        binds = (*self.spec.read_only_binds, *self.own_binds)
        sources += [(bind.host_path, bind.sandbox_path) for bind in binds]
        source = self.spec.workspace
        if isinstance(source, DirectoryWorkspace):
            sources.append((source.source, PurePosixPath(_SEED_PATH)))
        elif isinstance(source, ImageWorkspace):
            assert self.image is not None
            assert self.image.seed is not None
            sources.append((self.image.seed, PurePosixPath(_SEED_PATH)))
            if self.snapshot is not None:
                sources.append((self.snapshot, PurePosixPath(_SNAPSHOT_PATH)))
        elif isinstance(source, GitWorkspace):
            # Its objects only (SOURCE_MOUNT in _bwrap.py): the checkout borrows them.
            sources.append(
                (self._git_common_dir / "objects", PurePosixPath(SOURCE_MOUNT, "objects"))
            )
        elif not isinstance(source, EmptyWorkspace):
            raise UnsupportedSpecError(f"unknown workspace source: {source!r}")
        if isinstance(source, DirectoryWorkspace) and not source.source.is_dir():
            raise UnsupportedSpecError(f"workspace source is not a directory: {source.source}")
        for host_path, _ in sources:
            if not host_path.exists():
                raise UnsupportedSpecError(f"cannot bind {host_path}: it does not exist")
        return sources

    @cached_property
    def _git_common_dir(self) -> Path:
        assert isinstance(self.spec.workspace, GitWorkspace)
        return git_common_dir(self.spec.workspace.repo)

    def _init_config(self) -> str:
        limits = self.spec.limits
        rlimits: list[tuple[str, int]] = [
            (name, value)
            for field_name, name in _RLIMITS
            if (value := getattr(limits, field_name)) is not None
        ]
        controllers = self.prepared.cgroups.hierarchies
        if limits.max_processes is not None and "pids" not in controllers:
            rlimits.append(("RLIMIT_NPROC", limits.max_processes))
        if limits.memory_bytes is not None and "memory" not in controllers:
            rlimits.append(("RLIMIT_DATA", limits.memory_bytes))
        sized = []
        layout = self._layout()
        if limits.workspace_bytes is not None:
            sized.append((layout.workspace, "workspace_bytes"))
        if limits.scratch_bytes is not None:
            scratch = SCRATCH_MOUNTS[:-1] if self.image is None else self.image.scratch
            sized += [(path, "scratch_bytes") for path in (*scratch, layout.home, *layout.scratch)]
        return json.dumps({"rlimits": rlimits, "tmpfs": sized})

    async def _start(
        self,
        state: Path,
        lease: UidLease | None,
        cgroup: SandboxCgroup | None,
        commit: str | None,
    ) -> _Booted:
        prepared = self.prepared
        await asyncio.to_thread(self._plan_host_programs)
        control, control_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        info_read, info_write = os.pipe()
        block_read, block_write = os.pipe()
        fds = BootFds(
            info=self._keep(info_write),
            block=self._keep(block_read),
            seccomp=self._memfd("seccomp", prepared.seccomp),
            init_script=self._memfd("init", prepared.init_source),
            control=self._keep(control_child.detach()),
            source_head=self._memfd("head", f"{commit}\n".encode()) if commit else -1,
        )
        tree = self.image.binds if self.image is not None else []
        own = self._sources()
        interpreter = {prepared.python_prefix, *(path for path, _ in self._runtime_sources())}
        made_here = (_seed_of(self.image), self.snapshot)
        theirs = [p for p, _ in own if p not in interpreter and p not in made_here]
        await asyncio.to_thread(_refuse_sockets, theirs)
        sources = [*tree, *own]
        uid = lease.uid if lease is not None else os.geteuid()
        paths = [str(host_path) for host_path, _ in sources]
        wrap: list[str] | None = None
        if prepared.stage is not None:
            # In a subordinate-id namespace the leased id is that namespace's uid 0.
            inner = 0 if prepared.subids is not None else uid
            wrap, paths = staged_launch(inner, prepared.stage, [p for p, _ in sources])
        handshake: tuple[int, int] | None = None  # our ends: (ready to read, go to write)
        inherited_by_wrapper: tuple[int, ...] = ()
        if prepared.subids is not None and wrap is not None:
            ready_read, ready_write = os.pipe()
            go_read, go_write = os.pipe()
            handshake = ready_read, go_write
            inherited_by_wrapper = (self._keep(ready_write), self._keep(go_read))
            wrapper = prepared.subids.wrapper_argv(prepared.python, *inherited_by_wrapper)
            wrap = [*wrapper, *wrap]
        binds = [Bind(path, target) for path, (_, target) in zip(paths, sources, strict=True)]
        image = None
        if self.image is not None:
            plan = self.image
            image = ImageTree(binds[: len(tree)], plan.links, plan.scratch, plan.uid, plan.gid)
        argv = bwrap_argv(
            prepared.bwrap,
            python=self._init_python(),
            fds=fds,
            binds=binds[len(tree) :],
            limits=self.spec.limits,
            init_config=self._init_config(),
            image=image,
            layout=self._layout(),
        )
        if wrap is not None:
            argv = [*wrap, *argv]
        log = state / "bwrap.log"
        ours = (info_read, block_write, *(handshake or ()))
        try:
            process = await _spawn_bwrap(argv, log, (*fds.all(), *inherited_by_wrapper))
            logger.debug("sandbox %s: bwrap %d started", state.name, process.pid)
        except BaseException:
            control.close()
            for fd in ours:
                os.close(fd)
            raise
        for fd in (info_write, block_read, *inherited_by_wrapper):  # the child's: close ours
            self._fds.remove(fd)
            os.close(fd)
        channel: InitChannel | None = None
        pidfd = -1
        try:
            if handshake is not None and lease is not None and prepared.subids is not None:
                await self._enter_subordinate_ids(handshake, process, log, cgroup, lease.uid)
            info = await _read_info(info_read, process, self.config.boot_timeout, log)
            init_pid = info["child-pid"]
            pidfd = os.pidfd_open(init_pid)
            if cgroup is not None and handshake is None:
                await asyncio.to_thread(cgroup.attach, init_pid)
            if prepared.enforcement.oom_exempt_init:
                await asyncio.to_thread(_spare_from_oom_killer, init_pid)
            os.write(block_write, b"go")  # the payload (our init) starts only now
            channel = InitChannel(control)
            try:
                await _first_of(channel.ready(self.config.boot_timeout), process, log)
            except BaseException:
                channel.close()
                raise
        except BaseException:
            if channel is None:
                control.close()
            if pidfd < 0:  # the info may have arrived after we stopped waiting for it
                pidfd = _late_pidfd(info_read)
            await asyncio.shield(_abort_boot(process, pidfd, state.name))
            if pidfd >= 0:
                os.close(pidfd)
            raise
        finally:
            for fd in ours:
                os.close(fd)
        return _Booted(
            state_dir=state,
            process=process,
            init_pid=init_pid,
            pidfd=pidfd,
            channel=channel,
            host_uid=uid,
            cgroup=cgroup,
            lease=lease,
            image=self._image_lease,
        )

    async def _enter_subordinate_ids(
        self,
        handshake: tuple[int, int],
        process: asyncio.subprocess.Process,
        log: Path,
        cgroup: SandboxCgroup | None,
        uid: int,
    ) -> None:
        """The wrapper has made its user namespace: put it in the sandbox's cgroups while it is
        still the caller's, map the namespace to the leased id, and let it go on (_subids.py)."""
        ready, go = handshake
        assert self.prepared.subids is not None
        loop = asyncio.get_running_loop()
        signalled: asyncio.Future[None] = loop.create_future()

        def readable() -> None:
            if not signalled.done():
                signalled.set_result(None)

        loop.add_reader(ready, readable)
        timeout = self.config.boot_timeout
        try:
            await _first_of(asyncio.wait_for(signalled, timeout), process, log)
        except TimeoutError:
            raise SandboxBootError(f"no user namespace within {timeout} s") from None
        finally:
            loop.remove_reader(ready)
        if os.read(ready, 1) != b"1":
            raise SandboxBootError(f"the user namespace wrapper failed: {_tail(log)}")
        if cgroup is not None:
            await asyncio.to_thread(cgroup.attach, process.pid)
        await self.prepared.subids.map(process.pid, uid)
        os.write(go, b"1")

    async def _populate(self, sandbox: LocalSandbox, commit: str | None) -> None:
        source = self.spec.workspace
        if isinstance(source, ImageWorkspace):
            # Our interpreter, not the image's tools: an image may have no `cp` at all.
            copied = await sandbox.run_python(
                _COPY_SCRIPT, [_SEED_PATH, sandbox.workspace], timeout=self.config.boot_timeout * 30
            )
            if copied.exit_code != 0 or copied.timed_out:
                raise CheckoutError(
                    f"copying the image's workspace failed: {copied.stderr[-2000:]}"
                )
            return
        if isinstance(source, DirectoryWorkspace):
            command = f"cp -R -P --preserve=mode,timestamps,links {_SEED_PATH}/. ."
        elif isinstance(source, GitWorkspace):
            command = (
                f"{_TRUST_SOURCE}git clone --quiet --shared --no-checkout {SOURCE_MOUNT} . && "
                f"git -c advice.detachedHead=false checkout --quiet --detach {commit}"
            )
        else:
            return
        result = await sandbox.exec(command, env=_GIT_ENV, timeout=self.config.boot_timeout * 30)
        if not result.ok:
            raise CheckoutError(f"populating the workspace failed: {result.stderr.strip()}")


async def _abort_boot(process: asyncio.subprocess.Process, init_pidfd: int, name: str) -> None:
    """End a half-booted sandbox so that nothing is left unreaped: kill init first and let
    bwrap reap it and exit (killing bwrap first would orphan init); bwrap itself only if it
    does not go, or when init never existed."""
    if init_pidfd >= 0:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(init_pidfd, signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(process.wait()), _BWRAP_EXIT_S)
    with contextlib.suppress(ProcessLookupError):
        process.kill()
    await process.wait()
    logger.debug("sandbox %s: bwrap %d reaped after a failed boot", name, process.pid)


def _late_pidfd(info_read: int) -> int:
    """A pidfd for init if bwrap's info is already in the pipe, else -1."""
    try:
        info = json.loads(os.read(info_read, 65536))
        return os.pidfd_open(int(info["child-pid"]))
    except (OSError, ValueError, KeyError, TypeError):
        return -1


async def _spawn_bwrap(
    argv: list[str], log: Path, inherited: Sequence[int]
) -> asyncio.subprocess.Process:
    stderr = await asyncio.to_thread(open, log, "wb")
    try:
        return await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=stderr,
            env={"PATH": DEFAULT_PATH},
            pass_fds=inherited,
            start_new_session=True,
        )
    finally:
        stderr.close()


async def _read_info(
    fd: int, process: asyncio.subprocess.Process, timeout: float, log: Path
) -> dict[str, int]:
    """bwrap's info JSON (written once, before the payload runs), or bwrap's own error."""
    loop = asyncio.get_running_loop()
    os.set_blocking(fd, False)
    chunks: list[bytes] = []
    done: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return
        chunks.append(chunk)
        complete = not chunk or _is_json(b"".join(chunks))  # or bwrap closed it
        if complete and not done.done():
            done.set_result(None)

    loop.add_reader(fd, readable)
    try:
        await _first_of(asyncio.wait_for(done, timeout), process, log)
    except TimeoutError:
        raise SandboxBootError(f"bwrap did not start within {timeout} s: {_tail(log)}") from None
    finally:
        loop.remove_reader(fd)
    try:
        info = json.loads(b"".join(chunks))
    except ValueError:
        raise SandboxBootError(f"bwrap failed: {_tail(log)}") from None
    if not isinstance(info, dict) or not isinstance(info.get("child-pid"), int):
        raise SandboxBootError(f"bwrap sent no child pid: {info!r}")
    return info


def _is_json(data: bytes) -> bool:
    try:
        json.loads(data)
    except ValueError:
        return False
    return True


async def _first_of(awaitable: Awaitable[_T], process: asyncio.subprocess.Process, log: Path) -> _T:
    """Await `awaitable`, failing with bwrap's own message if bwrap exits first."""
    waiting = asyncio.ensure_future(awaitable)
    exited = asyncio.ensure_future(process.wait())
    try:
        await asyncio.wait((waiting, exited), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        waiting.cancel()
        exited.cancel()
        raise
    if waiting.done():
        exited.cancel()
        return waiting.result()
    waiting.cancel()
    raise SandboxBootError(f"bwrap exited ({process.returncode}): {_tail(log)}")


def _tail(log: Path) -> str:
    try:
        return log.read_text(errors="replace").strip()[-2000:] or "(no message)"
    except OSError:
        return "(no message)"


# -- host-side helpers --------------------------------------------------------------------


def _host_tmp() -> Path:
    """The host's /tmp, whatever TMPDIR says: uid leases must be shared by every process on the
    host, and the staging mount point must be reachable by every sandbox uid (a private TMPDIR
    under a 0700 directory is not)."""
    return Path("/tmp") if Path("/tmp").is_dir() else Path(tempfile.gettempdir())


def _uid_lock_dir() -> Path:
    """Shared by every process of the caller's (root's: every root process's) on the host."""
    uid = os.geteuid()
    return _host_tmp() / ("sandbox-uids" if uid == 0 else f"sandbox-uids-{uid}")


def _state_root(config: LocalConfig) -> Path:
    """Where state directories live: the configured root, or a private one of ours."""
    if config.state_root is not None:
        return config.state_root
    return private_dir(_host_tmp() / f"agent-rl-sandboxes-{os.geteuid()}")


def _make_state_dir(config: LocalConfig) -> Path:
    root = _state_root(config)
    state = Path(tempfile.mkdtemp(prefix=f"{_STATE_PREFIX}{_owner.owner_tag()}", dir=root))
    (state / "io").mkdir()
    return state


def _undo(
    state: Path | None, cgroup: SandboxCgroup | None, lease: UidLease | None, keep: bool
) -> None:
    try:
        if cgroup is not None:
            cgroup.remove()
        if state is not None and not keep:
            remove_tree(state)
    finally:
        if lease is not None:
            lease.release()


def _sweep(config: LocalConfig, cgroups: CgroupSupport) -> None:
    """Remove what runs killed before their close left behind (their owner is gone)."""
    root = _state_root(config)
    swept = 0
    with contextlib.suppress(OSError):
        for entry in os.scandir(root):
            name = entry.name
            # Only real directories of ours: a link planted under our prefix is never followed.
            if name.startswith(_STATE_PREFIX) and owned_directory(entry) and _owner.is_stale(name):
                remove_tree(Path(entry.path))
                swept += 1
    swept += cgroups.sweep(_owner.is_stale)
    if swept:
        logger.info("swept %d leftovers of sandboxes whose owner died", swept)


def _spare_from_oom_killer(pid: int) -> None:
    """Exempt init from the OOM killer (needs CAP_SYS_RESOURCE). Commands raise their score to
    the top (_init.py), so a sandbox whose memory is full, of tmpfs files say, loses a command;
    exempt, init also survives a fork that finds no memory left."""
    with open(f"/proc/{pid}/oom_score_adj", "w") as adj:
        adj.write("-1000")


def _refuse_sockets(roots: Sequence[Path]) -> None:
    """Refuse binds that hold a Unix socket: a read-only mount does not stop `connect()`, and
    a path socket is reached across network namespaces, so a host service listening in a bound
    tree would be reachable from inside. Links are not followed (inside they resolve in the
    sandbox's own tree)."""
    for root in roots:
        stack = [root]
        while stack:
            path = stack.pop()
            mode = path.lstat().st_mode
            if stat.S_ISSOCK(mode):
                raise UnsupportedSpecError(
                    f"cannot bind {root}: it holds a Unix socket ({path}), which a read-only "
                    "mount does not stop commands from connecting to"
                )
            if not stat.S_ISDIR(mode):
                continue
            try:
                entries = os.scandir(path)
            except PermissionError:
                continue  # commands (never more privileged than this caller) cannot pass either
            with entries:
                for entry in entries:
                    # d_type answers for directories, files and links without a stat call.
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(Path(entry.path))
                    elif not entry.is_file(follow_symlinks=False) and not entry.is_symlink():
                        stack.append(Path(entry.path))  # a socket, FIFO or device: look


def _materialize_on_host(spec: SandboxSpec, workspace: Path, home: Path) -> None:
    """Fill a host workspace for isolation='none' (no binds can move paths there)."""
    workspace.mkdir()
    home.mkdir()
    for bind in spec.read_only_binds:
        if Path(bind.sandbox_path) != bind.host_path.resolve():
            raise UnsupportedSpecError(
                f"without bubblewrap {bind.host_path} cannot appear at {bind.sandbox_path}"
            )
    source = spec.workspace
    if isinstance(source, DirectoryWorkspace):
        if not source.source.is_dir():
            raise UnsupportedSpecError(f"workspace source is not a directory: {source.source}")
        shutil.copytree(source.source, workspace, symlinks=True, dirs_exist_ok=True)
    elif isinstance(source, GitWorkspace):
        checkout_repo(source.repo, source.commit, workspace)
    elif not isinstance(source, EmptyWorkspace):
        raise UnsupportedSpecError(f"unknown workspace source: {source!r}")


def _has_git(root: ImageRoot) -> bool:
    """Whether the image has a `git` in a directory of its PATH (a file or a link there;
    directories reached through a link, as merged /bin is, are found by their real path)."""
    for directory in root.env.get("PATH", DEFAULT_PATH).split(":"):
        found = inside(root.path, PurePosixPath(directory)) if directory.startswith("/") else None
        if found is not None and os.path.lexists(found / "git"):
            return True
    return False


@functools.cache
def _host_git() -> ReadOnlyBind:
    """The host's git for an image without one: its exec-path directory (where Debian and
    most distributions keep a `git` beside its helpers), run on the host's loader."""
    try:
        done = subprocess.run(["git", "--exec-path"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as error:
        raise UnsupportedSpecError(
            f"the image has no git and neither has this host: {error}"
        ) from None
    core = Path(done.stdout.strip())
    if not (core / "git").is_file():
        raise UnsupportedSpecError(f"the image has no git, and the host's {core} holds none")
    return ReadOnlyBind(core, _GIT_CORE, host_programs=("git",))


def _seed_of(image: ImagePlan | None) -> Path | None:
    return image.seed if image is not None else None


@functools.cache
def _host_runtime(python: Path, prefix: Path) -> HostRuntime:
    return HostRuntime.discover(python, prefix)
