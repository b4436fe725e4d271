"""What the local backend finds out once, before its first sandbox: bubblewrap, the interpreter
init runs on, the seccomp filter, cgroups and uids; and the `Enforcement` that follows."""

from __future__ import annotations

import functools
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path, PurePosixPath

from sandbox._errors import SandboxUnavailableError
from sandbox._local._bwrap import PYTHON_MOUNT
from sandbox._local._cgroups import CONTROLLERS, CgroupSupport
from sandbox._local._config import DEFAULT_PATH, Enforcement, LocalConfig
from sandbox._local._forward import RelayBudget
from sandbox._local._runtime import HostRuntime
from sandbox._local._seccomp import compile_filter
from sandbox._local._stage import stage_dir
from sandbox._local._state import host_tmp, sweep
from sandbox._local._subids import SubordinateIds


@dataclass(frozen=True, slots=True)
class Prepared:
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
    def discover(cls, config: LocalConfig) -> Prepared:
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
        sweep(config, cgroups)
        return cls(
            bwrap=bwrap,
            python=python,
            python_prefix=None if visible else prefix,
            prefix=prefix,
            seccomp=compile_filter(),
            init_source=resources.files("sandbox._local").joinpath("_init.py").read_bytes(),
            as_root=as_root,
            subids=subids if isinstance(subids, SubordinateIds) else None,
            stage=stage_dir(host_tmp()) if own_uids else None,
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


@functools.cache
def _host_runtime(python: Path, prefix: Path) -> HostRuntime:
    return HostRuntime.discover(python, prefix)
