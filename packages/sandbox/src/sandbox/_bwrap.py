"""The bubblewrap command line that boots a local sandbox, and the nsenter prefix to enter it.

One long-lived `bwrap` per sandbox holds the namespaces (user, pid, ipc, uts, net, cgroup);
every command enters them with `nsenter`, so commands share /tmp, the process table and
loopback like on one machine (a server started with `start` is reachable from a later
`exec`). bwrap's own reaper is pid 1: when it dies the kernel kills everything in the pid
namespace, which is how `close()` and `--die-with-parent` take detached processes down too.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from sandbox._forward import SANDBOX_SOCKET_DIR
from sandbox.spec import ReadOnlyBind, ResourceLimits

SANDBOX_WORKSPACE = "/workspace"
SANDBOX_HOME = "/root"
READY_LINE = b"sandbox-ready\n"

# Host files that stay hidden even though /etc is visible: the sandbox's root maps to the
# caller's uid, so when that is host root these would otherwise be readable inside.
_MASKED_FILES = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-")
_MASKED_DIRS = ("/etc/ssl/private",)
_MERGED_USR_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


def bwrap_argv(
    bwrap: str,
    *,
    workspace: Path,
    forward_dir: Path | None,
    binds: Sequence[ReadOnlyBind],
    limits: ResourceLimits,
    info_fd: int,
) -> list[str]:
    """Arguments that boot an idle sandbox which prints READY_LINE once fully set up."""
    argv = [
        bwrap,
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-net",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--new-session",
        "--hostname",
        "sandbox",
        "--info-fd",
        str(info_fd),
        "--ro-bind",
        "/usr",
        "/usr",
    ]
    for path in _MERGED_USR_DIRS:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    argv += ["--ro-bind", "/etc", "/etc"]
    for path in _MASKED_FILES:
        if os.path.exists(path):
            argv += ["--ro-bind", "/dev/null", path]
    for path in _MASKED_DIRS:
        if os.path.isdir(path):
            argv += ["--tmpfs", path]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    if limits.tmp_size_bytes is not None:
        argv += ["--size", str(limits.tmp_size_bytes)]
    argv += ["--tmpfs", "/tmp", "--tmpfs", "/var/tmp", "--tmpfs", SANDBOX_HOME, "--tmpfs", "/run"]
    argv += ["--bind", str(workspace), SANDBOX_WORKSPACE]
    if forward_dir is not None:
        argv += ["--ro-bind", str(forward_dir), SANDBOX_SOCKET_DIR]
    for bind in binds:
        argv += ["--ro-bind", str(bind.host_path), str(bind.sandbox_path)]
    argv += ["--chdir", SANDBOX_WORKSPACE]
    argv += ["/bin/sh", "-c", f"printf '{READY_LINE.decode().strip()}\\n'; exec sleep infinity"]
    return argv


def nsenter_prefix(nsenter: str, init_pid: int) -> list[str]:
    """Enter every namespace of the sandbox whose pid 1 has host pid `init_pid`.

    `-r -w` take root and cwd from the target, so the command sees the sandbox's file tree.
    """
    return [
        nsenter,
        "-t",
        str(init_pid),
        "-U",
        "-m",
        "-n",
        "-p",
        "-i",
        "-u",
        "--preserve-credentials",
        "-r",
        "-w",
        "--",
    ]


def prlimit_prefix(prlimit: str, limits: ResourceLimits) -> list[str]:
    """A `prlimit ... --` prefix applying the per-process limits; empty when none are set."""
    options = []
    if limits.max_open_files is not None:
        options.append(f"--nofile={limits.max_open_files}")
    if limits.max_file_size_bytes is not None:
        options.append(f"--fsize={limits.max_file_size_bytes}")
    if limits.max_address_space_bytes is not None:
        options.append(f"--as={limits.max_address_space_bytes}")
    return [prlimit, *options, "--"] if options else []
