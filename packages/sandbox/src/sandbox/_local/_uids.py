"""Host uids for sandboxes created by root: one unprivileged uid per live sandbox.

Root never runs sandboxed code as itself: each sandbox's processes run as a uid of their own,
leased from a configured range. Host files the sandbox can see are then protected by plain
permissions (it owns none of them), and the per-user process cap of the kernel (RLIMIT_NPROC)
becomes a per-sandbox cap. A lease is an exclusive flock on one lock file per uid, so several
processes on a node (rollout workers) share the range safely, and the kernel releases a lease
when its holder dies, however it dies. A released lease removes its file (still holding the
lock), so a node that runs for weeks does not keep one file per uid it ever used; a taker that
locked a file just unlinked sees that the path no longer names it and tries again.
"""

from __future__ import annotations

import fcntl
import os
import random
from dataclasses import dataclass
from pathlib import Path

from sandbox._errors import SandboxUnavailableError
from sandbox._local._private_dirs import private_dir


@dataclass(frozen=True, slots=True)
class UidRange:
    """Host uids (used as gids too) that sandboxes run as when the caller is root.

    The default block starts at one billion: far above login users and the subordinate-id
    ranges tools allocate from 100000 upwards. Pick another block if your hosts use that one.
    """

    first: int = 1_000_000_000
    count: int = 65536
    lock_dir: Path | None = None
    """Where the lease files live; all users of one range on a host must share it (default:
    /tmp/sandbox-uids, whatever TMPDIR says)."""

    def __post_init__(self) -> None:
        if self.first < 1000 or self.count < 1 or self.first + self.count > 2**31 - 1:
            raise ValueError(f"unusable uid range: {self.first}+{self.count}")


class UidLease:
    """An exclusively held uid; `release()` (idempotent) gives it back."""

    def __init__(self, uid: int, lock_file: Path, lock_fd: int) -> None:
        self.uid = uid
        self._lock_file = lock_file
        self._lock_fd = lock_fd

    def release(self) -> None:
        if self._lock_fd >= 0:
            self._lock_file.unlink(missing_ok=True)  # under the lock: nobody else holds it
            os.close(self._lock_fd)
            self._lock_fd = -1


def lease_uid(uids: UidRange, default_lock_dir: Path) -> UidLease:
    """Take a free uid of the range (blocking file I/O: call it in a worker thread)."""
    lock_dir = uids.lock_dir or default_lock_dir
    lock_dir.parent.mkdir(parents=True, exist_ok=True)
    private_dir(lock_dir)  # another user's directory, or a link, would hand them our leases
    start = random.randrange(uids.count)  # spread concurrent callers over the range
    for step in range(uids.count):
        uid = uids.first + (start + step) % uids.count
        lease = _try_lock(lock_dir / str(uid))
        if lease is not None:
            return UidLease(uid, *lease)
    raise SandboxUnavailableError(
        f"all {uids.count} sandbox uids from {uids.first} are in use (see UidRange)"
    )


def _try_lock(path: Path) -> tuple[Path, int] | None:
    """Lock the file at `path` (created if missing) unless another holder has it.

    Another holder may unlink the file between our open and our lock; then we hold a lock on a
    file nobody else can find, which guards nothing. So the lock counts only while `path` still
    names the file we locked; otherwise we try again on the file there now.
    """
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        locked = os.fstat(fd)
        try:
            current = os.stat(path)
        except FileNotFoundError:
            current = None
        if current is not None and (current.st_dev, current.st_ino) == (
            locked.st_dev,
            locked.st_ino,
        ):
            return path, fd
        os.close(fd)
