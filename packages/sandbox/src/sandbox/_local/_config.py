"""How the local backend is configured, and what it reports it enforces on this host."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Literal

from sandbox._images import ImageCacheConfig
from sandbox._local._uids import UidRange

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


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
