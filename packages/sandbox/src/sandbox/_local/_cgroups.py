"""Per-sandbox cgroups: process, memory and CPU limits the kernel enforces on a whole sandbox.

rlimits bound one process (or, for the process count, one host user); a fork bomb or a test
suite that leaks memory is many processes. A cgroup per sandbox bounds all of them together, so
one runaway episode cannot take the node or its neighbours.

Works with cgroup v1 (a hierarchy per controller, as on this project's CI machine) and v2 (one
unified hierarchy whose controllers must be delegated to us), and with hybrids: each controller
is taken from whichever hierarchy has it. Per-sandbox groups are made under a parent that is
ours to write: by default `agent-sandboxes/` below the cgroup this process runs in, or a
delegated path given in the config. What cannot be had is reported per controller, never
silently assumed (the backend then falls back to rlimits and says so).

All of this is file I/O on cgroupfs; callers run it in a worker thread.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Literal

#: The controllers a sandbox uses and the limit each enforces.
CONTROLLERS = ("pids", "memory", "cpu")
_CPU_PERIOD_US = 100_000
_DEFAULT_PARENT = "agent-sandboxes"


@dataclass(frozen=True, slots=True)
class CgroupLimits:
    max_processes: int | None = None
    memory_bytes: int | None = None
    cpu_cores: float | None = None

    def wanted(self) -> tuple[str, ...]:
        """The controllers these limits need."""
        pairs = (
            ("pids", self.max_processes),
            ("memory", self.memory_bytes),
            ("cpu", self.cpu_cores),
        )
        return tuple(controller for controller, value in pairs if value is not None)


@dataclass(frozen=True, slots=True)
class Hierarchy:
    """Where per-sandbox groups of one controller are created."""

    controller: str
    version: Literal[1, 2]
    parent: Path


@dataclass(frozen=True, slots=True)
class Counters:
    """Kernel counters of limits hit: OOM kills and refused forks."""

    oom_kills: int = 0
    forks_refused: int = 0

    def hits_since(self, before: Counters) -> tuple[str, ...]:
        hits = []
        if self.forks_refused > before.forks_refused:
            hits.append("max_processes")
        if self.oom_kills > before.oom_kills:
            hits.append("memory_bytes")
        return tuple(hits)


@dataclass(slots=True)
class CgroupSupport:
    """What this host lets us use, discovered once per backend."""

    hierarchies: dict[str, Hierarchy] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)

    @classmethod
    def discover(cls, parent: PurePosixPath | None = None) -> CgroupSupport:
        """Find, per controller, where this process may create per-sandbox groups."""
        support = cls()
        mounts = parse_mounts(Path("/proc/self/mountinfo").read_text())
        own = parse_own_cgroups(Path("/proc/self/cgroup").read_text())
        unified = next((m for m in mounts if m.version == 2), None)
        unified_dir = (
            unified.directory_of(own.get("", "/")) if unified is not None and "" in own else None
        )
        for controller in CONTROLLERS:
            try:
                if unified_dir is not None and controller in _read_words(
                    unified_dir / "cgroup.controllers"
                ):
                    assert unified is not None
                    base = unified.directory_of(str(parent)) if parent else unified_dir
                    support.hierarchies[controller] = _prepare_v2(controller, base, parent is None)
                    continue
                mount = next((m for m in mounts if controller in m.controllers), None)
                if mount is None:
                    support.problems[controller] = f"no cgroup hierarchy has {controller}"
                    continue
                base = mount.directory_of(str(parent) if parent else own.get(controller, "/"))
                support.hierarchies[controller] = _prepare_v1(controller, base, parent is None)
            except OSError as error:
                support.problems[controller] = f"cgroup {controller}: {error}"
        return support

    def create(self, name: str, limits: CgroupLimits) -> SandboxCgroup:
        """A fresh group per needed controller with `limits` written; attach the sandbox next."""
        group = SandboxCgroup({})
        try:
            for controller in limits.wanted():
                hierarchy = self.hierarchies.get(controller)
                if hierarchy is None:
                    continue
                directory = hierarchy.parent / name
                with contextlib.suppress(FileExistsError):
                    directory.mkdir()
                group.directories[controller] = (hierarchy.version, directory)
                write_limit(hierarchy.version, controller, directory, limits)
        except BaseException:
            group.remove()
            raise
        return group

    def sweep(self, is_stale: Callable[[str], bool]) -> int:
        """Remove leftover groups of owners that are gone (a SIGKILLed run); returns the count."""
        removed = 0
        for hierarchy in {h.parent: h for h in self.hierarchies.values()}.values():
            with contextlib.suppress(OSError):
                for entry in os.scandir(hierarchy.parent):
                    if entry.is_dir() and is_stale(entry.name):
                        directory = (hierarchy.version, Path(entry.path))
                        group = SandboxCgroup({hierarchy.controller: directory})
                        group.kill_all()
                        if group.remove():
                            removed += 1
        return removed


@dataclass(slots=True)
class SandboxCgroup:
    """The cgroups of one sandbox (one directory per controller; shared on cgroup v2)."""

    directories: dict[str, tuple[Literal[1, 2], Path]]

    @property
    def controllers(self) -> tuple[str, ...]:
        return tuple(self.directories)

    def _unique(self) -> list[Path]:
        return list(dict.fromkeys(directory for _, directory in self.directories.values()))

    def attach(self, pid: int) -> None:
        """Move process `pid` (before it forks anything) into every group of the sandbox."""
        for directory in self._unique():
            (directory / "cgroup.procs").write_text(f"{pid}\n")

    def counters(self) -> Counters:
        oom = forks = 0
        if "memory" in self.directories:
            version, directory = self.directories["memory"]
            name = "memory.oom_control" if version == 1 else "memory.events"
            oom = _read_keyed(directory / name).get("oom_kill", 0)
        if "pids" in self.directories:
            _, directory = self.directories["pids"]
            forks = _read_keyed(directory / "pids.events").get("max", 0)
        return Counters(oom_kills=oom, forks_refused=forks)

    def kill_all(self) -> None:
        """SIGKILL whatever is still in the groups (only for sweeping a dead owner's groups)."""
        for directory in self._unique():
            with contextlib.suppress(OSError):
                for line in (directory / "cgroup.procs").read_text().split():
                    with contextlib.suppress(OSError):
                        os.kill(int(line), 9)

    def remove(self, timeout: float = 2.0) -> bool:
        """rmdir every group, waiting briefly for exiting processes to leave; True if all gone."""
        deadline = time.monotonic() + timeout
        remaining = self._unique()
        while remaining:
            left = []
            for directory in remaining:
                try:
                    directory.rmdir()
                except FileNotFoundError:
                    pass
                except OSError as error:
                    if error.errno != errno.EBUSY:
                        raise
                    left.append(directory)
            remaining = left
            if remaining:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.005)
        self.directories.clear()
        return True


# -- discovery ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Mount:
    version: Literal[1, 2]
    root: str
    mountpoint: Path
    controllers: frozenset[str]

    def directory_of(self, cgroup_path: str) -> Path:
        """The directory of a cgroup path (as /proc/self/cgroup names it) in this mount."""
        relative = os.path.relpath(cgroup_path, self.root) if self.root != "/" else cgroup_path
        relative = relative.lstrip("/")
        return self.mountpoint / relative if relative not in ("", ".") else self.mountpoint


def parse_mounts(mountinfo: str) -> list[Mount]:
    """The cgroup file systems listed in a /proc/<pid>/mountinfo text."""
    return list(_cgroup_mounts(mountinfo))


def _cgroup_mounts(mountinfo: str) -> Iterator[Mount]:
    for line in mountinfo.splitlines():
        before, _, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        fstype, superoptions = tail[0], tail[2].split(",")
        root, mountpoint = _unescape(fields[3]), Path(_unescape(fields[4]))
        if fstype == "cgroup2":
            yield Mount(2, root, mountpoint, frozenset())
        elif fstype == "cgroup":
            yield Mount(1, root, mountpoint, frozenset(superoptions) & set(CONTROLLERS))


def parse_own_cgroups(cgroup: str) -> dict[str, str]:
    """Controller -> cgroup path from a /proc/<pid>/cgroup text; "" is the v2 hierarchy."""
    own: dict[str, str] = {}
    for line in cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        if not controllers:
            own[""] = path
        for controller in controllers.split(","):
            own.setdefault(controller, path)
    return own


def _prepare_v1(controller: str, own_or_parent: Path, default_parent: bool) -> Hierarchy:
    parent = own_or_parent / _DEFAULT_PARENT if default_parent else own_or_parent
    parent.mkdir(exist_ok=True)
    _probe(parent)
    return Hierarchy(controller, 1, parent)


def _prepare_v2(controller: str, own_or_parent: Path, default_parent: bool) -> Hierarchy:
    """v2 lets a group's children use a controller only if the group enables it for them."""
    if default_parent:
        if controller not in _read_words(own_or_parent / "cgroup.subtree_control"):
            # Fails (EBUSY) while processes sit in our own group: that is the v2 rule that
            # a delegated subtree (e.g. systemd's Delegate=yes) exists to satisfy.
            (own_or_parent / "cgroup.subtree_control").write_text(f"+{controller}\n")
        parent = own_or_parent / _DEFAULT_PARENT
    else:
        parent = own_or_parent
    parent.mkdir(exist_ok=True)
    if controller not in _read_words(parent / "cgroup.subtree_control"):
        (parent / "cgroup.subtree_control").write_text(f"+{controller}\n")
    _probe(parent)
    return Hierarchy(controller, 2, parent)


def _probe(parent: Path) -> None:
    """Prove we may create groups here (mkdir may succeed where writes do not)."""
    probe = parent / f"probe-{os.getpid()}-{time.monotonic_ns()}"
    probe.mkdir()
    try:
        if not os.access(probe / "cgroup.procs", os.W_OK):
            raise PermissionError(errno.EACCES, "cgroup.procs is not writable", str(probe))
    finally:
        probe.rmdir()


def write_limit(
    version: Literal[1, 2], controller: str, directory: Path, limits: CgroupLimits
) -> None:
    if controller == "pids" and limits.max_processes is not None:
        (directory / "pids.max").write_text(f"{limits.max_processes}\n")
    elif controller == "memory" and limits.memory_bytes is not None:
        value = f"{limits.memory_bytes}\n"
        if version == 1:
            (directory / "memory.limit_in_bytes").write_text(value)
            # Swap too, where swap accounting is on: otherwise the limit only moves pages out.
            with contextlib.suppress(FileNotFoundError, PermissionError):
                (directory / "memory.memsw.limit_in_bytes").write_text(value)
        else:
            (directory / "memory.max").write_text(value)
            with contextlib.suppress(FileNotFoundError, PermissionError):
                (directory / "memory.swap.max").write_text("0\n")
    elif controller == "cpu" and limits.cpu_cores is not None:
        quota = max(1000, round(limits.cpu_cores * _CPU_PERIOD_US))
        if version == 1:
            (directory / "cpu.cfs_period_us").write_text(f"{_CPU_PERIOD_US}\n")
            (directory / "cpu.cfs_quota_us").write_text(f"{quota}\n")
        else:
            (directory / "cpu.max").write_text(f"{quota} {_CPU_PERIOD_US}\n")


def _read_words(path: Path) -> set[str]:
    try:
        return set(path.read_text().split())
    except OSError:
        return set()


def _read_keyed(path: Path) -> dict[str, int]:
    values: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            with contextlib.suppress(ValueError):
                values[key] = int(value)
    return values


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field
