"""Where a local sandbox keeps its state on the host (a directory per sandbox, uid lock files),
how a failed boot's is undone, and how leftovers of runs that died are swept."""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from pathlib import Path

from sandbox._local import _owner
from sandbox._local._cgroups import CgroupSupport, SandboxCgroup
from sandbox._local._config import LocalConfig
from sandbox._local._private_dirs import owned_directory, private_dir, remove_tree
from sandbox._local._uids import UidLease

logger = logging.getLogger(__name__)

_STATE_PREFIX = "sandbox-"


def host_tmp() -> Path:
    """The host's /tmp, whatever TMPDIR says: uid leases must be shared by every process on the
    host, and the staging mount point must be reachable by every sandbox uid (a private TMPDIR
    under a 0700 directory is not)."""
    return Path("/tmp") if Path("/tmp").is_dir() else Path(tempfile.gettempdir())


def uid_lock_dir() -> Path:
    """Shared by every process of the caller's (root's: every root process's) on the host."""
    uid = os.geteuid()
    return host_tmp() / ("sandbox-uids" if uid == 0 else f"sandbox-uids-{uid}")


def state_root(config: LocalConfig) -> Path:
    """Where state directories live: the configured root, or a private one of ours."""
    if config.state_root is not None:
        return config.state_root
    return private_dir(host_tmp() / f"agent-rl-sandboxes-{os.geteuid()}")


def make_state_dir(config: LocalConfig) -> Path:
    root = state_root(config)
    state = Path(tempfile.mkdtemp(prefix=f"{_STATE_PREFIX}{_owner.owner_tag()}", dir=root))
    (state / "io").mkdir()
    return state


def undo(
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


def sweep(config: LocalConfig, cgroups: CgroupSupport) -> None:
    """Remove what runs killed before their close left behind (their owner is gone)."""
    root = state_root(config)
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
