"""File locks that hold across the processes of a node, and die with their holder.

An ``flock`` on a file is released by the kernel however its holder exits, so a crashed
worker never leaves an image locked. Lock files can be unlinked by whoever holds them
exclusively (eviction tidies up after itself); a taker that locked a file just unlinked sees
that the path no longer names it and takes the new one.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC


def take_lock(path: Path, *, shared: bool, wait: bool = True) -> int | None:
    """An open descriptor holding a shared or exclusive flock on `path` (made if missing), or
    None when `wait` is False and someone else holds a conflicting lock. Waiting blocks."""
    operation = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    if not wait:
        operation |= fcntl.LOCK_NB
    while True:
        fd = os.open(path, _FLAGS, 0o644)
        try:
            fcntl.flock(fd, operation)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        try:
            current = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            os.close(fd)
            continue
        held = os.fstat(fd)
        if (held.st_dev, held.st_ino) == (current.st_dev, current.st_ino):
            return fd
        os.close(fd)
