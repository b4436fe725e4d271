"""A directory written to as if it were the root of the file system, never beyond it.

A layer's tar is hostile input: names may be absolute or climb with ``..``, and an earlier entry
may have planted a symlink (``etc -> /etc``, ``x -> ../../..``) that a later entry writes
through. Every operation here starts from a descriptor of the root and walks one component at
a time with ``O_NOFOLLOW``, so the kernel never resolves a path we did not check. A symlink met
as a *parent* component is resolved by us, inside the root, the way a chroot would see it (an
absolute target restarts at the root, ``..`` stops at it), which is what container runtimes do
for well-formed images (``lib -> usr/lib``); the final component is never followed. Names are
cleaned lexically first: ``/a``, ``./a`` and ``../../a`` all mean ``a``.
"""

from __future__ import annotations

import errno
import os
import stat
from collections import deque
from collections.abc import Callable

from sandbox._images._errors import PullFailure

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_SYMLINKS = 40
"""Symlinks followed while resolving one path (the kernel's own limit)."""

Parts = tuple[str, ...]


def clean(name: str) -> list[str]:
    """The components of `name` relative to the root: empty and ``.`` dropped, ``..`` undoing
    the previous component and stopping at the root."""
    parts: list[str] = []
    for part in name.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if parts:
                parts.pop()
            continue
        parts.append(part)
    return parts


class ScopedRoot:
    """The root directory, held by a descriptor; paths are component lists relative to it."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def open_dir(self, parts: list[str], *, create: bool) -> tuple[int, Parts] | None:
        """A new descriptor of the directory `parts` name, with the path it resolved to.

        Missing components are made (mode 0755) when `create`, else the answer is None. A
        component that exists but is neither a directory nor a symlink raises `PullFailure`.
        """
        pending = deque(parts)
        resolved: list[str] = []
        current = os.open(".", DIR_FLAGS, dir_fd=self.fd)
        links = 0
        try:
            while pending:
                part = pending.popleft()
                try:
                    child = os.open(part, DIR_FLAGS, dir_fd=current)
                except FileNotFoundError:
                    if not create:
                        return None
                    os.mkdir(part, 0o700, dir_fd=current)
                    child = os.open(part, DIR_FLAGS, dir_fd=current)
                    os.fchmod(child, 0o755)
                except OSError as error:
                    if error.errno not in (errno.ELOOP, errno.ENOTDIR):
                        raise
                    info = os.stat(part, dir_fd=current, follow_symlinks=False)
                    if not stat.S_ISLNK(info.st_mode):
                        shown = "/".join([*resolved, part])
                        raise PullFailure(f"{shown} is not a directory") from None
                    links += 1
                    if links > MAX_SYMLINKS:
                        raise PullFailure(
                            f"too many symlinks resolving {'/'.join(parts)}"
                        ) from None
                    target = os.readlink(part, dir_fd=current)
                    base = [] if target.startswith("/") else resolved
                    pending.extendleft(reversed(clean("/".join([*base, target]))))
                    resolved = []
                    os.close(current)
                    current = os.open(".", DIR_FLAGS, dir_fd=self.fd)
                    continue
                os.close(current)
                current = child
                resolved.append(part)
            result = current
            current = -1
            return result, tuple(resolved)
        finally:
            if current >= 0:
                os.close(current)

    def open_resolved(self, parts: Parts) -> int | None:
        """A descriptor of the real directory at `parts` (no symlink followed), or None."""
        current = os.open(".", DIR_FLAGS, dir_fd=self.fd)
        for part in parts:
            try:
                child = os.open(part, DIR_FLAGS, dir_fd=current)
            except OSError:
                os.close(current)
                return None
            os.close(current)
            current = child
        return current


def lstat_at(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def remove_at(dir_fd: int, name: str, path: Parts, on_dir_removed: Callable[[Parts], None]) -> None:
    """Remove the entry `name` of `dir_fd` (whose path is `path`), a whole tree if it is a
    directory, never following a link. Depth-first with one descriptor open at a time (it
    climbs back with ``..``), so a tree thousands of levels deep needs neither recursion nor
    thousands of descriptors. `on_dir_removed` hears each directory that goes."""
    info = lstat_at(dir_fd, name)
    if info is None:
        return
    if not stat.S_ISDIR(info.st_mode):
        os.unlink(name, dir_fd=dir_fd)
        return
    current = _open_to_empty(dir_fd, name, info)
    try:
        levels: list[tuple[list[str], Parts]] = [(os.listdir(current), path)]
        while levels:
            children, here = levels[-1]
            if children:
                child = children.pop()
                child_info = os.stat(child, dir_fd=current, follow_symlinks=False)
                if stat.S_ISDIR(child_info.st_mode):
                    below = _open_to_empty(current, child, child_info)
                    os.close(current)
                    current = below
                    levels.append((os.listdir(current), (*here, child)))
                else:
                    os.unlink(child, dir_fd=current)
                continue
            levels.pop()
            above = os.open("..", DIR_FLAGS, dir_fd=current) if levels else os.dup(dir_fd)
            os.close(current)
            current = above
            os.rmdir(here[-1] if levels else name, dir_fd=current)
            on_dir_removed(here)
    finally:
        os.close(current)


def _open_to_empty(dir_fd: int, name: str, info: os.stat_result) -> int:
    """Open a directory to list and empty it: one of ours that a finished unpack left
    read-only (or unreadable) is first opened up to its owner, through an ``O_PATH``
    descriptor, never a link. Root needs no such help."""
    if os.geteuid() != 0 and info.st_mode & 0o700 != 0o700 and info.st_uid == os.geteuid():
        path_fd = os.open(
            name, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd
        )
        try:
            os.chmod(f"/proc/self/fd/{path_fd}", 0o700)
        finally:
            os.close(path_fd)
    return os.open(name, DIR_FLAGS, dir_fd=dir_fd)


def remove_tree(path: str) -> None:
    """Remove `path` (a tree of ours, never followed if it is a link) however its modes are."""
    parent, _, name = path.rstrip("/").rpartition("/")
    fd = os.open(parent or "/", DIR_FLAGS)
    try:
        remove_at(fd, name, (), lambda _: None)
    finally:
        os.close(fd)


def disk_usage(fd: int) -> int:
    """Bytes a tree uses on disk, `du`-style: allocated blocks, each inode counted once (the
    same one-descriptor walk as `remove_at`)."""
    seen: set[tuple[int, int]] = set()
    current = os.open(".", DIR_FLAGS, dir_fd=fd)
    total = os.fstat(current).st_blocks * 512
    try:
        levels = [os.listdir(current)]
        while levels:
            if levels[-1]:
                child = levels[-1].pop()
                info = os.stat(child, dir_fd=current, follow_symlinks=False)
                if stat.S_ISDIR(info.st_mode):
                    below = os.open(child, DIR_FLAGS, dir_fd=current)
                    os.close(current)
                    current = below
                    total += info.st_blocks * 512
                    levels.append(os.listdir(current))
                elif (info.st_dev, info.st_ino) not in seen:
                    seen.add((info.st_dev, info.st_ino))
                    total += info.st_blocks * 512
                continue
            levels.pop()
            if levels:
                above = os.open("..", DIR_FLAGS, dir_fd=current)
                os.close(current)
                current = above
    finally:
        os.close(current)
    return total
