"""An inter-process file lock that an asyncio caller can wait on and cancel.

`flock` is per open file description, so two coroutines of one process exclude each other as
well as two processes do. Waiting polls with LOCK_NB instead of blocking a thread: a blocked
`flock` in a worker thread could not be cancelled and would keep the lock request alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

from harness._errors import InstallLockTimeoutError

_POLL_SECONDS = 0.1


@contextlib.asynccontextmanager
async def file_lock(path: Path, timeout: float) -> AsyncIterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise InstallLockTimeoutError(
                        f"waited {timeout:.0f}s for the install lock {path}"
                    ) from None
                await asyncio.sleep(_POLL_SECONDS)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
