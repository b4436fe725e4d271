"""One sandbox's boot: lay out its image, lease its uid, make its state and cgroup, start
bwrap around init (_spawn.py), connect the control channel, then fill the workspace and
forward the endpoint. Each step registers how to undo it, so a failed boot leaves nothing.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import socket
import stat
import subprocess
from collections.abc import Mapping, Sequence
from functools import cached_property
from pathlib import Path, PurePosixPath
from typing import Any

from sandbox._errors import SandboxBootError, SandboxUnavailableError, UnsupportedSpecError
from sandbox._images import ImageCache, ImageLease
from sandbox._local._booted import Booted
from sandbox._local._bwrap import (
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
from sandbox._local._cgroups import CgroupLimits, SandboxCgroup
from sandbox._local._config import DEFAULT_PATH, LocalConfig
from sandbox._local._control import InitChannel
from sandbox._local._image_root import ImagePlan, ImageRoot, inside, plan
from sandbox._local._populate import SEED_PATH, populate
from sandbox._local._prepare import Prepared
from sandbox._local._runtime import HostRuntime, program_commands
from sandbox._local._sandbox import LocalSandbox
from sandbox._local._snapshot import snapshot_directory
from sandbox._local._spawn import abort_boot, first_of, late_pidfd, read_info, spawn_bwrap, tail
from sandbox._local._stage import staged_launch
from sandbox._local._state import make_state_dir, state_root, uid_lock_dir, undo
from sandbox._local._uids import UidLease, lease_uid
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
from sandbox._workspace import git_common_dir, resolve_commit

logger = logging.getLogger(__name__)

_SNAPSHOT_PATH = f"{RUN_SANDBOX}/base.git"
_GIT_CORE = PurePosixPath(RUN_SANDBOX, "git-core")
_HOST_GIT = str(_GIT_CORE / "git")
_RLIMITS = (
    ("max_open_files", "RLIMIT_NOFILE"),
    ("max_file_size_bytes", "RLIMIT_FSIZE"),
    ("cpu_seconds", "RLIMIT_CPU"),
)


class Boot:
    """One sandbox boot: each step registers how to undo it, so a failure leaves nothing."""

    def __init__(
        self,
        config: LocalConfig,
        prepared: Prepared,
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
            lease = await asyncio.to_thread(lease_uid, self.config.uids, uid_lock_dir())
        elif self.prepared.subids is not None:
            uids = self.prepared.subids.uids
            lease = await asyncio.to_thread(lease_uid, uids, uid_lock_dir())
        state: Path | None = None
        cgroup: SandboxCgroup | None = None
        try:
            state = await asyncio.to_thread(make_state_dir, self.config)
            await asyncio.to_thread(self._snapshot_workspace, state)
            cgroup = await asyncio.to_thread(self._cgroup, state.name)
            booted = await self._start(state, lease, cgroup, commit)
        except BaseException:
            await asyncio.to_thread(undo, state, cgroup, lease, self.config.keep_state)
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
            await populate(sandbox, self.spec.workspace, commit, self.config.boot_timeout * 30)
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
            return {"base_repository": f"{SEED_PATH}/.git", "source_repository": seed}
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
            self.runtime_dir = self.runtime.materialize(state_root(self.config))

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
            sources.append((source.source, PurePosixPath(SEED_PATH)))
        elif isinstance(source, ImageWorkspace):
            assert self.image is not None
            assert self.image.seed is not None
            sources.append((self.image.seed, PurePosixPath(SEED_PATH)))
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
    ) -> Booted:
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
            # bwrap keeps the info pipe's read end too: were we killed first, its info write
            # would fail and bwrap die before it lets its child go, leaving that child waiting
            # for ever (see abort_boot); this way the sandbox boots, finds its control socket
            # closed and ends. Init closes the copy it inherits.
            inherited = (*fds.all(), *inherited_by_wrapper, info_read)
            process = await spawn_bwrap(argv, log, inherited)
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
            info = await read_info(info_read, process, self.config.boot_timeout, log)
            init_pid = info["child-pid"]
            pidfd = os.pidfd_open(init_pid)
            if cgroup is not None and handshake is None:
                await asyncio.to_thread(cgroup.attach, init_pid)
            if prepared.enforcement.oom_exempt_init:
                await asyncio.to_thread(_spare_from_oom_killer, init_pid)
            os.write(block_write, b"go")  # the payload (our init) starts only now
            channel = InitChannel(control)
            try:
                await first_of(channel.ready(self.config.boot_timeout), process, log)
            except BaseException:
                channel.close()
                raise
        except BaseException:
            if channel is None:
                control.close()
            if pidfd < 0:  # the info may have arrived after we stopped waiting for it
                pidfd = late_pidfd(info_read)
            await asyncio.shield(abort_boot(process, pidfd, state.name))
            if pidfd >= 0:
                os.close(pidfd)
            raise
        finally:
            for fd in ours:
                os.close(fd)
        return Booted(
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
            await first_of(asyncio.wait_for(signalled, timeout), process, log)
        except TimeoutError:
            raise SandboxBootError(f"no user namespace within {timeout} s") from None
        finally:
            loop.remove_reader(ready)
        if os.read(ready, 1) != b"1":
            raise SandboxBootError(f"the user namespace wrapper failed: {tail(log)}")
        if cgroup is not None:
            await asyncio.to_thread(cgroup.attach, process.pid)
        await self.prepared.subids.map(process.pid, uid)
        os.write(go, b"1")


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
