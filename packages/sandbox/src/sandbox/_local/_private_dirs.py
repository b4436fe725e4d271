"""Directories of ours inside shared ones (/tmp), made and used as if every other user were hostile.

Another local user can plant anything in /tmp before we get there: a directory with our name, a
symlink named like one of our state directories. Root following such a link would chmod or
delete where the user points (a local privilege escalation where `fs.protected_symlinks` is
off). So a directory of ours is taken only when it is a real directory, owned by us and open to
nobody else; entries are judged by `lstat`, never followed; and what we chmod, we chmod through a
descriptor opened without following links.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from pathlib import Path

from sandbox._errors import SandboxUnavailableError

_DIRECTORY = os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC


def private_dir(path: Path, *, mode: int = 0o700) -> Path:
    """`path` as a directory of ours: made with `mode` if missing; refused when it is a link,
    not a directory, owned by another user, or writable by anyone else."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=mode)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise SandboxUnavailableError(f"{path} is not a directory (a link someone planted?)")
    if info.st_uid != os.geteuid():
        raise SandboxUnavailableError(
            f"{path} belongs to uid {info.st_uid}, not to us ({os.geteuid()}): refusing to use it"
        )
    if info.st_mode & 0o022:
        raise SandboxUnavailableError(f"{path} is writable by other users: refusing to use it")
    return path


def owned_directory(entry: os.DirEntry[str]) -> bool:
    """Whether a directory entry is a real directory of ours (links are never followed)."""
    try:
        info = entry.stat(follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid()


def remove_tree(path: Path) -> None:
    """Delete a directory of ours even where a sandbox left unreadable or read-only dirs.

    Directories are made accessible with an explicit stack (nesting depth is the agent's
    choice, so no recursion), each through a descriptor opened without following links; links
    are removed, never followed; then one `shutil.rmtree`, whose descriptor-based walk does not
    follow links either.
    """
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(info.st_mode):
        path.unlink()
        return
    stack = [str(path)]
    while stack:
        directory = stack.pop()
        _grant_owner(directory)
        with os.scandir(directory) as entries:
            stack.extend(e.path for e in entries if e.is_dir(follow_symlinks=False))
    shutil.rmtree(path)


def _grant_owner(directory: str) -> None:
    """Give a directory's owner every right on it, never through a link."""
    try:
        fd = os.open(directory, _DIRECTORY)
    except OSError:
        return  # gone, or replaced by something that is not a directory: rmtree decides
    try:
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
        if mode & stat.S_IRWXU != stat.S_IRWXU:
            os.chmod(f"/proc/self/fd/{fd}", mode | stat.S_IRWXU)  # O_PATH: chmod via /proc
    finally:
        os.close(fd)
