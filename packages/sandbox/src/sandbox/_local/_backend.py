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
import logging
import shutil
from pathlib import Path

from sandbox._errors import SandboxUnavailableError, UnsupportedSpecError
from sandbox._images import ImageCache
from sandbox._local._boot import Boot
from sandbox._local._commands import CommandSandbox
from sandbox._local._config import Enforcement, LocalConfig
from sandbox._local._host import HostSandbox
from sandbox._local._prepare import Prepared
from sandbox._local._private_dirs import remove_tree
from sandbox._local._state import make_state_dir
from sandbox._spec import DirectoryWorkspace, EmptyWorkspace, GitWorkspace, SandboxSpec
from sandbox._workspace import checkout_repo, git_common_dir

logger = logging.getLogger(__name__)


class LocalBackend:
    """Creates local sandboxes. One backend can serve many concurrent sandboxes."""

    def __init__(self, config: LocalConfig | None = None) -> None:
        self.config = config or LocalConfig()
        self._images = ImageCache(self.config.images) if self.config.images else None
        self._prepared: Prepared | None = None
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
        return await Boot(self.config, prepared, spec, self._images).run()

    async def _prepare(self) -> Prepared:
        async with self._prepare_lock:
            if self._prepared is None:
                prepared = await asyncio.to_thread(Prepared.discover, self.config)
                await Boot(self.config, prepared, SandboxSpec()).probe()
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
        state = await asyncio.to_thread(make_state_dir, self.config)
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
