"""A command's output, read from a pipe into a host file with a cap.

A command once wrote straight into a host file, so a sandbox decided how much of the host's
disk its output took (`head -c 512M /dev/zero` wrote 512 MiB there, and a background process
could keep writing to the file after it was unlinked). Now each stream is a pipe the host
reads: the first `limit` bytes go to the file, the rest is read and counted but never stored.

The pipe is read on the event loop as data arrives (the file keeps filling while a detached
command runs). Once the command's leader has exited, `settle` takes what it left in the pipe;
a background process that still holds the pipe is drained into nothing until it closes it or
the sandbox closes, so it never blocks on a full pipe and never costs the host a byte of disk.
Each chunk is one bounded write to a file in the page cache, cheap enough for the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os

_CHUNK = 256 * 1024
_SETTLE_CHUNKS = 64
"""Reads `settle` makes at most: the pipe's buffer is far smaller, so more means a background
process is still writing, whose output no longer belongs to the command."""


class PipeDrain:
    """Reads one pipe's read end into the file open as `file_fd`, keeping the first `limit`
    bytes (None: all). Owns both descriptors from here on."""

    def __init__(self, read_fd: int, file_fd: int, limit: int | None) -> None:
        self._fd = read_fd
        self._file: int | None = file_fd
        self._limit = limit
        self.kept = 0
        self.dropped = 0
        """Bytes of the command's output not kept: past `limit`, or lost to a full disk."""
        os.set_blocking(read_fd, False)
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(read_fd, self._ready)
        self._open = True
        self._keeping = True

    @property
    def truncated(self) -> bool:
        return self.dropped > 0

    @property
    def closed(self) -> bool:
        """Every writer has closed the pipe (or the sandbox closed it)."""
        return not self._open

    def settle(self) -> None:
        """The command has exited: take what it left in the pipe, then stop keeping output."""
        for _ in range(_SETTLE_CHUNKS):
            if not self._open or not self._read():
                break
        self._keeping = False
        self._close_file()

    def close(self) -> None:
        """Stop reading and release both descriptors; idempotent."""
        if self._open:
            self._open = False
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
        self._close_file()

    def _ready(self) -> None:
        self._read()

    def _read(self) -> bool:
        """One read; False when the pipe is empty for now or at its end (then closed)."""
        try:
            chunk = os.read(self._fd, _CHUNK)
        except BlockingIOError:
            return False
        except OSError:
            chunk = b""
        if not chunk:
            self.close()
            return False
        if not self._keeping:
            return True  # settled: whatever a background process writes now is nobody's
        room = len(chunk) if self._limit is None else max(0, self._limit - self.kept)
        kept = chunk[:room] if self._file is not None else b""
        try:
            view = memoryview(kept)
            while view and self._file is not None:
                view = view[os.write(self._file, view) :]
        except OSError:  # the host's disk is full: the rest is lost, never the loop
            self._close_file()
            kept = b""
        self.kept += len(kept)
        self.dropped += len(chunk) - len(kept)
        return True

    def _close_file(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                os.close(self._file)
            self._file = None
