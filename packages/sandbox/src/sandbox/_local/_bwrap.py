"""The bubblewrap command line that boots a local sandbox around its init (see _init.py).

One `bwrap` per sandbox creates fresh user, pid, ipc, uts, net and cgroup namespaces, builds
the file tree below, then drops every capability (bounding set included), sets no_new_privs,
forbids further user namespaces, installs the seccomp filter and executes our init as pid 1.
Every command is started by that init, so all of it applies to everything that ever runs
inside. bubblewrap runs as the sandbox's own unprivileged host uid (see _uids.py), which maps
to uid 0 inside: "root" in the sandbox owns nothing on the host.

When root creates the sandbox, bind sources are first staged where the unprivileged uid can
reach them (see _stage.py); the binds below then name the staged paths.

The file tree: host /usr (and its merged-/usr links) and /etc read-only, with shadow files
masked; a fresh /proc (bubblewrap makes /proc/sys, sysrq-trigger, irq and bus read-only, and
the kernel-memory files below are masked); a minimal /dev; size-limited tmpfs for the
workspace, /tmp, /var/tmp, the home, /run and /dev/shm; nothing else of the host.

What the host relies on inside cannot be moved or replaced by a command: the root itself is
remounted read-only once built (the merged-/usr links, `/lib64` with the dynamic loader every
program starts through, stay what they are), and our own files (init, our interpreter, a
read-only copy of the task's repository) live in RUN_SANDBOX, a file system of its own,
read-only, whose mount point no rename can take away.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from sandbox._spec import ResourceLimits

SANDBOX_WORKSPACE = "/workspace"
SANDBOX_HOME = "/root"
SCRATCH_MOUNTS = ("/dev/shm", "/tmp", "/var/tmp", SANDBOX_HOME)
"""The tmpfs each sized `ResourceLimits.scratch_bytes` (the home last: not world-writable)."""
#: Our own read-only file system inside: init, our interpreter, the task's repository.
RUN_SANDBOX = "/run/sandbox"
INIT_PATH = f"{RUN_SANDBOX}/init.py"
#: Where our interpreter is mounted when it lives outside /usr (a pyenv or uv install).
PYTHON_MOUNT = f"{RUN_SANDBOX}/python"
#: A GitWorkspace's source repository as a minimal git directory: its object store (read-only),
#: HEAD at the workspace's commit, no refs. The checkout borrows its objects; the host's own
#: work (the diff capture) reads them. Nothing else of the source (config with a remote's
#: credentials, hooks, reflogs, other refs) is mounted.
SOURCE_MOUNT = f"{RUN_SANDBOX}/source"
_RUN_SANDBOX_BYTES = 1 << 20
#: Small: /run holds only sockets and pid files of what the agent starts.
_RUN_BYTES = 64 << 20

_MASKED_FILES = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-")
_MASKED_DIRS = ("/etc/ssl/private",)
_MASKED_PROC = ("/proc/kcore", "/proc/kallsyms", "/proc/timer_list", "/proc/sched_debug")
_MERGED_USR_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


@dataclass(frozen=True, slots=True)
class Bind:
    """A host path to mount read-only at `target` inside."""

    source: str
    target: PurePosixPath


@dataclass(frozen=True, slots=True)
class BootFds:
    """Descriptors bubblewrap inherits to set the sandbox up (see the module docstring)."""

    info: int
    block: int
    seccomp: int
    init_script: int
    control: int
    source_head: int = -1
    """The HEAD file of SOURCE_MOUNT, for a GitWorkspace (-1: none)."""

    def all(self) -> tuple[int, ...]:
        fds = (self.info, self.block, self.seccomp, self.init_script, self.control)
        return (*fds, self.source_head) if self.source_head >= 0 else fds


@dataclass(frozen=True, slots=True)
class ImageTree:
    """A root other than the host's (see _image_root.py): its top-level directories bound
    read-only, its top-level links recreated, the scratch mounts it has room for, and who
    commands run as."""

    binds: Sequence[Bind]
    links: Sequence[tuple[str, PurePosixPath]]
    scratch: Sequence[str]
    """Which of SCRATCH_MOUNTS' world-writable ones the image has a directory for."""
    uid: int = 0
    gid: int = 0


@dataclass(frozen=True, slots=True)
class Layout:
    """Where the sandbox's own file systems are mounted inside."""

    workspace: str = SANDBOX_WORKSPACE
    home: str = SANDBOX_HOME
    scratch: tuple[str, ...] = ()
    """The spec's own scratch directories (SandboxSpec.scratch_dirs)."""


def bwrap_argv(
    bwrap: str,
    *,
    python: Sequence[str],
    fds: BootFds,
    binds: Sequence[Bind],
    limits: ResourceLimits,
    init_config: str,
    image: ImageTree | None = None,
    layout: Layout = Layout(),
) -> list[str]:
    """Arguments that boot a sandbox whose pid 1 is our init, serving on `fds.control`; on
    the host's /usr and /etc, or on `image`."""
    uid, gid = (image.uid, image.gid) if image is not None else (0, 0)
    argv = [
        bwrap,
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-net",
        "--unshare-cgroup-try",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--as-pid-1",
        "--cap-drop",
        "ALL",
        "--uid",
        str(uid),
        "--gid",
        str(gid),
        "--hostname",
        "sandbox",
        "--info-fd",
        str(fds.info),
        "--block-fd",
        str(fds.block),
        "--seccomp",
        str(fds.seccomp),
    ]
    argv += _host_tree() if image is None else _image_tree(image)
    argv += ["--proc", "/proc"]
    argv += [arg for path in _MASKED_PROC if os.path.exists(path) for arg in _mask(path)]
    argv += ["--dev", "/dev"]
    scratch = SCRATCH_MOUNTS[:-1] if image is None else image.scratch
    for path in scratch:  # world-writable and sticky, as usual
        argv += ["--perms", "1777", *_size(limits.scratch_bytes), "--tmpfs", path]
    argv += [*_size(limits.scratch_bytes), "--tmpfs", layout.home]
    for path in layout.scratch:
        argv += [*_size(limits.scratch_bytes), "--tmpfs", path]
    argv += [*_size(_RUN_BYTES), "--tmpfs", "/run"]
    argv += [*_size(_RUN_SANDBOX_BYTES), "--tmpfs", RUN_SANDBOX]
    argv += [*_size(limits.workspace_bytes), "--tmpfs", layout.workspace]
    argv += ["--ro-bind-data", str(fds.init_script), INIT_PATH]
    for bind in binds:
        argv += ["--ro-bind", bind.source, str(bind.target)]
    if fds.source_head >= 0:
        argv += ["--dir", f"{SOURCE_MOUNT}/refs"]
        argv += ["--ro-bind-data", str(fds.source_head), f"{SOURCE_MOUNT}/HEAD"]
    argv += ["--remount-ro", RUN_SANDBOX, "--remount-ro", "/"]
    argv += ["--chdir", layout.workspace]
    if image is None:
        # For init alone (commands get their own environment): our interpreter's shared
        # library may be linked by the absolute path of its host installation. (In an image
        # the loader is told where the libraries are: _runtime.py.)
        argv += ["--setenv", "LD_LIBRARY_PATH", f"{PYTHON_MOUNT}/lib"]
    argv += ["--", *python, "-I", "-S", INIT_PATH, str(fds.control), init_config]
    return argv


def _host_tree() -> list[str]:
    """The host's /usr (with its merged-/usr links) and /etc, shadow files masked."""
    argv = ["--ro-bind", "/usr", "/usr"]
    for path in _MERGED_USR_DIRS:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    argv += ["--ro-bind", "/etc", "/etc"]
    argv += [arg for path in _MASKED_FILES if os.path.exists(path) for arg in _mask(path)]
    argv += [arg for path in _MASKED_DIRS if os.path.isdir(path) for arg in ("--tmpfs", path)]
    return argv


def _image_tree(image: ImageTree) -> list[str]:
    argv: list[str] = []
    for bind in image.binds:
        argv += ["--ro-bind", bind.source, str(bind.target)]
    for target, path in image.links:
        argv += ["--symlink", target, str(path)]
    return argv


def _mask(path: str) -> tuple[str, ...]:
    return ("--ro-bind", "/dev/null", path)


def _size(limit: int | None) -> tuple[str, ...]:
    return ("--size", str(limit)) if limit is not None else ()
