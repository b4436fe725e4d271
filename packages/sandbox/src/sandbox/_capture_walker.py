"""Lists an agent's change to its repository, from inside the sandbox, for `capture_diff`.

This file runs *inside* a sandbox (through `Sandbox.run_python`, on the sandbox's read-only
interpreter, after `kill_all`), so it imports nothing but the standard library. It trusts
nothing the agent could have touched:

- git serves only as a lister, with an empty environment, no config but ours, and the task's
  repository as its git directory: a read-only copy the agent could never write, so the
  agent's `.git` (config, hooks, attributes, forged objects) or its absence changes nothing;
- the workspace is walked without following a single symlink, not even in a parent
  directory, and only regular files are read: a FIFO, a device or a link to /dev/zero is
  noted, never opened;
- everything it writes goes to its stdout, bounded by MAX_BYTES of file content.

argv: WORKSPACE GIT_DIR BASE MAX_BYTES MAX_ENTRIES

What counts as the change is what `git add -A` would stage, against BASE: tracked files
modified, deleted or retyped; untracked files that no .gitignore rule hides; never the junk
below, never a nested repository (noted instead, as git cannot stage one without a commit).

stdout: b"agent-rl-snapshot 1\\n", then records of
    tag (1 byte) | mode (6 ASCII octal digits) | path length (4 bytes, big-endian) | path |
    data length (8 bytes, big-endian) | data
tags: C a file as it is now (data: its content, or a symlink's target), D a tracked path
that is gone, N a note on a path (data: why it is not part of the change), T the change is
over MAX_BYTES or MAX_ENTRIES (data: which; nothing follows), E the end.
Exit status: 0 with E; 3 after T; anything else is a failure, explained on stderr.
"""

from __future__ import annotations

import hashlib
import os
import stat
import struct
import subprocess
import sys

MAGIC = b"agent-rl-snapshot 1\n"
TOO_LARGE = 3
JUNK_DIRS = frozenset(
    {
        b"__pycache__",
        b".pytest_cache",
        b".mypy_cache",
        b".ruff_cache",
        b".hypothesis",
        b".tox",
        b".nox",
        b"node_modules",
        b".venv",
    }
)
JUNK_SUFFIXES = (b".pyc", b".pyo", b".egg-info")
JUNK_NAMES = frozenset({b".DS_Store"})
_GIT_CONFIG = (
    "safe.directory=*",
    "core.fsmonitor=false",
    "core.untrackedCache=false",
    "core.excludesFile=/dev/null",
    "core.quotePath=false",
    "core.bare=false",
)
_GIT_TIMEOUT_S = 600
_CHUNK = 1 << 20
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class TooLarge(Exception):
    pass


class Writer:
    def __init__(self, max_bytes: int, max_entries: int) -> None:
        self.out = sys.stdout.buffer
        self.data_left = max_bytes
        self.entries_left = max_entries
        self.out.write(MAGIC)

    def record(self, tag: bytes, path: bytes, data: bytes = b"", mode: int = 0) -> None:
        """Write one record; every record counts against MAX_ENTRIES and its bytes (path
        and data) against MAX_BYTES, so the output is bounded whatever the workspace holds."""
        self.data_left -= len(path) + len(data)
        self.entries_left -= 1
        if self.data_left < 0 or self.entries_left < 0:
            raise TooLarge()
        header = tag + b"%06o" % mode + struct.pack(">I", len(path))
        self.out.write(header + path + struct.pack(">Q", len(data)))
        self.out.write(data)

    def end(self, tag: bytes, data: bytes = b"") -> None:
        self.out.write(tag + b"000000" + struct.pack(">IQ", 0, len(data)) + data)
        self.out.flush()


def git(git_dir: str, work_tree: str, *args: str) -> bytes:
    argv = ["git", "--git-dir=" + git_dir, "--work-tree=" + work_tree]
    for setting in _GIT_CONFIG:
        argv += ["-c", setting]
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_ATTR_NOSYSTEM": "1",
        "GIT_OPTIONAL_LOCKS": "0",
        "GIT_TERMINAL_PROMPT": "0",
        "HOME": "/nonexistent",
        "LC_ALL": "C",
    }
    done = subprocess.run(
        argv + list(args),
        cwd="/",
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=_GIT_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        message = done.stderr.decode("utf-8", "replace").strip()
        raise SystemExit(f"git {args[0]} failed: {message}")
    return done.stdout


def base_tree(git_dir: str, work_tree: str, base: str) -> dict[bytes, tuple[int, bytes]]:
    """Every path of BASE: (mode, object id)."""
    listing = git(git_dir, work_tree, "ls-tree", "-r", "-z", "--full-tree", base)
    tree = {}
    for entry in listing.split(b"\0"):
        if not entry:
            continue
        info, _, path = entry.partition(b"\t")
        mode, _, oid = info.split(b" ")
        tree[path] = (int(mode, 8), oid)
    return tree


def is_junk(path: bytes) -> bool:
    parts = path.split(b"/")
    if parts[-1] in JUNK_NAMES or parts[-1].endswith(JUNK_SUFFIXES):
        return True
    return any(part in JUNK_DIRS or part.endswith(b".egg-info") for part in parts[:-1])


class Workspace:
    """The workspace, read without following symlinks anywhere along a path."""

    def __init__(self, root: bytes) -> None:
        self.root = root
        self._real_dirs: dict[bytes, bool] = {b"": True}

    def _in_real_dirs(self, path: bytes) -> bool:
        """Whether every directory above `path` is a real directory (no symlink, no file)."""
        parents = []
        parent = path.rpartition(b"/")[0]
        while parent not in self._real_dirs:
            parents.append(parent)
            parent = parent.rpartition(b"/")[0]
        real = self._real_dirs[parent]
        for parent in reversed(parents):  # from the top down
            if real:
                try:
                    real = stat.S_ISDIR(os.lstat(self.root + b"/" + parent).st_mode)
                except OSError:
                    real = False
            self._real_dirs[parent] = real
        return real

    def lstat(self, path: bytes) -> os.stat_result | None:
        """The path's own status, or None when it, or a directory on its way, is not there
        as a real directory (gone, or replaced by a symlink or a file). PermissionError when
        a directory on the way cannot be searched."""
        if not self._in_real_dirs(path):
            return None
        try:
            return os.lstat(self.root + b"/" + path)
        except (FileNotFoundError, NotADirectoryError):
            return None

    def read(self, path: bytes, limit: int) -> bytes:
        """A regular file's content (at most limit + 1 bytes); OSError if it cannot be read."""
        fd = os.open(self.root + b"/" + path, _OPEN_FLAGS)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError("not a regular file")
            chunks = []
            size = 0
            while size <= limit:
                chunk = os.read(fd, min(_CHUNK, limit + 1 - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)


def object_id(data: bytes, like: bytes) -> bytes:
    digest = hashlib.sha256 if len(like) == 64 else hashlib.sha1
    return digest(b"blob %d\0" % len(data) + data).hexdigest().encode()


def snapshot(
    workspace: Workspace, path: bytes, status: os.stat_result, writer: Writer
) -> tuple[int, bytes] | None:
    """(mode, content) of a file or symlink. None, with a note, for anything else (the path
    holds no file the change could carry) or for a file that cannot be read (left as it was:
    an unreadable file is never taken for a deleted one)."""
    if stat.S_ISLNK(status.st_mode):
        return 0o120000, os.readlink(workspace.root + b"/" + path)
    if not stat.S_ISREG(status.st_mode):
        writer.record(b"N", path, b"not a regular file or symlink")
        return None
    try:
        data = workspace.read(path, max(writer.data_left, 0))
    except OSError as error:
        writer.record(b"N", path, f"unreadable: {error.strerror or error}".encode())
        return None
    mode = 0o100755 if status.st_mode & stat.S_IXUSR else 0o100644
    return mode, data


def walk(root: str, git_dir: str, base: str, writer: Writer) -> None:
    workspace = Workspace(os.fsencode(root))
    tree = base_tree(git_dir, root, base)
    for path, (mode, oid) in sorted(tree.items()):
        if mode == 0o160000:  # a submodule's commit: never the agent's to change here
            continue
        try:
            status = workspace.lstat(path)
        except PermissionError:  # left as it was: never taken for a deletion
            writer.record(b"N", path, b"unreadable: Permission denied")
            continue
        if status is None or stat.S_ISDIR(status.st_mode):  # gone, or now a directory
            writer.record(b"D", path)
            continue
        now = snapshot(workspace, path, status, writer)
        if now is None:
            if not stat.S_ISREG(status.st_mode):
                writer.record(b"D", path)
            continue
        new_mode, data = now
        if new_mode != mode or object_id(data, oid) != oid:
            writer.record(b"C", path, data, new_mode)
    others = git(git_dir, root, "ls-files", "-z", "--others", "--exclude-standard")
    for path in sorted(set(others.split(b"\0")) - {b""}):
        if path.endswith(b"/"):
            writer.record(b"N", path.rstrip(b"/"), b"a nested git repository")
            continue
        if path in tree or is_junk(path):
            continue
        try:
            status = workspace.lstat(path)
        except PermissionError:
            writer.record(b"N", path, b"unreadable: Permission denied")
            continue
        if status is None:
            continue
        now = snapshot(workspace, path, status, writer)
        if now is not None:
            writer.record(b"C", path, now[1], now[0])


def main() -> int:
    root, git_dir, base, max_bytes, max_entries = sys.argv[1:6]
    writer = Writer(int(max_bytes), int(max_entries))
    try:
        walk(root, git_dir, base, writer)
    except TooLarge:
        message = f"more than {max_bytes} bytes or {max_entries} files changed"
        writer.end(b"T", message.encode())
        return TOO_LARGE
    writer.end(b"E")
    return 0


if __name__ == "__main__":
    sys.exit(main())
