"""Lists an agent's change to its repository, from inside the sandbox, for `capture_diff`.

This file runs *inside* a sandbox (through `Sandbox.run_python`, on the sandbox's read-only
interpreter, after `kill_all`), so it imports nothing but the standard library. It trusts
nothing the agent could have touched:

- git serves only as a lister, with an empty environment, no config but ours, no index, and
  the task's repository as its git directory: a read-only copy mounted where the agent can
  neither write nor move it, so the agent's `.git` (config, hooks, attributes, forged
  objects) or its absence changes nothing;
- the workspace is walked without following a single symlink, not even in a parent
  directory, and only regular files are read: a FIFO, a device or a link to /dev/zero is
  noted, never opened; what the agent made unreadable (it owns every file) is made readable
  to its owner again rather than taken for gone;
- everything it writes goes to its stdout, bounded by MAX_BYTES of paths and content.

argv: WORKSPACE GIT_DIR BASE MAX_BYTES MAX_ENTRIES GIT_ARGV (a JSON list: how git starts here,
`Sandbox.git_argv`)

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
import json
import os
import re
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
_GIT_PATH = "/usr/local/bin:/usr/bin:/bin"
GIT_ARGV = ["git"]
_NO_INDEX = "/run/sandbox/no-index"  # never exists: a read-only file system
_GIT_TIMEOUT_S = 600
_LOCKED_DIR = re.compile(rb"could not open directory '(.*)': Permission denied")
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


def git(git_dir: str, work_tree: str, *args: str) -> tuple[bytes, bytes]:
    """git's stdout and stderr; SystemExit when it fails."""
    argv = [*GIT_ARGV, "--git-dir=" + git_dir, "--work-tree=" + work_tree]
    for setting in _GIT_CONFIG:
        argv += ["-c", setting]
    env = {
        "PATH": _GIT_PATH,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_ATTR_NOSYSTEM": "1",
        "GIT_INDEX_FILE": _NO_INDEX,
        "GIT_NO_LAZY_FETCH": "1",
        "GIT_NO_REPLACE_OBJECTS": "1",
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
    return done.stdout, done.stderr


def base_tree(git_dir: str, root: str, base: str) -> dict[bytes, tuple[int, bytes, int]]:
    """Every path of BASE: (mode, object id, size; -1 for a submodule)."""
    listing, _ = git(git_dir, root, "ls-tree", "-r", "-z", "-l", "--full-tree", base)
    tree = {}
    for entry in listing.split(b"\0"):
        if not entry:
            continue
        info, _, path = entry.partition(b"\t")
        mode, _, oid, size = info.split()
        tree[path] = (int(mode, 8), oid, int(size) if size.isdigit() else -1)
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

    def full(self, path: bytes) -> bytes:
        return self.root + b"/" + path if path else self.root

    def unlock(self, path: bytes) -> None:
        """Give the owner back search and read rights on `path` and every directory above it
        (never through a symlink): the agent owns them, and locking them is no change."""
        parts = path.split(b"/") if path else []
        for end in range(len(parts) + 1):
            target = self.full(b"/".join(parts[:end]))
            try:
                mode = os.lstat(target).st_mode
            except OSError:
                return
            if stat.S_ISDIR(mode) and mode & 0o500 != 0o500:
                os.chmod(target, stat.S_IMODE(mode) | 0o700)
            elif stat.S_ISREG(mode) and not mode & 0o400:
                os.chmod(target, stat.S_IMODE(mode) | 0o400)
            elif not stat.S_ISDIR(mode):
                return

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
                    real = stat.S_ISDIR(os.lstat(self.full(parent)).st_mode)
                except (FileNotFoundError, NotADirectoryError):
                    real = False
            self._real_dirs[parent] = real
        return real

    def lstat(self, path: bytes) -> os.stat_result | None:
        """The path's own status, or None when it, or a directory on its way, is not there
        as a real directory (gone, or replaced by a symlink or a file)."""
        for attempt in (1, 2):
            try:
                if not self._in_real_dirs(path):
                    return None
                return os.lstat(self.full(path))
            except (FileNotFoundError, NotADirectoryError):
                return None
            except PermissionError:
                if attempt == 2:
                    raise
                self.unlock(path.rpartition(b"/")[0])
        return None

    def open(self, path: bytes) -> int:
        """A descriptor of a regular file (OSError for anything else)."""
        try:
            fd = os.open(self.full(path), _OPEN_FLAGS)
        except PermissionError:
            self.unlock(path)
            fd = os.open(self.full(path), _OPEN_FLAGS)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError("not a regular file")
        return fd

    def read(self, path: bytes, limit: int) -> bytes:
        """A regular file's content, at most limit + 1 bytes."""
        fd = self.open(path)
        try:
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

    def object_id(self, path: bytes, size: int, like: bytes) -> bytes:
        """The git blob id of a regular file, hashed as it is read (never held whole)."""
        digest = hashlib.sha256() if len(like) == 64 else hashlib.sha1()
        digest.update(b"blob %d\0" % size)
        fd = self.open(path)
        try:
            while chunk := os.read(fd, _CHUNK):
                digest.update(chunk)
        finally:
            os.close(fd)
        return digest.hexdigest().encode()


def blob_id(data: bytes, like: bytes) -> bytes:
    digest = hashlib.sha256 if len(like) == 64 else hashlib.sha1
    return digest(b"blob %d\0" % len(data) + data).hexdigest().encode()


def file_mode(status: os.stat_result) -> int:
    if stat.S_ISLNK(status.st_mode):
        return 0o120000
    return 0o100755 if status.st_mode & stat.S_IXUSR else 0o100644


def changed(
    workspace: Workspace, path: bytes, status: os.stat_result, base: tuple[int, bytes, int]
) -> bool:
    """Whether a file or symlink differs from its BASE entry (mode, id, size)."""
    mode, oid, size = base
    if file_mode(status) != mode:
        return True
    if stat.S_ISLNK(status.st_mode):
        return blob_id(os.readlink(workspace.full(path)), oid) != oid
    if status.st_size != size:
        return True
    return workspace.object_id(path, status.st_size, oid) != oid


def content(workspace: Workspace, path: bytes, status: os.stat_result, writer: Writer) -> bytes:
    if stat.S_ISLNK(status.st_mode):
        return os.readlink(workspace.full(path))
    return workspace.read(path, max(writer.data_left, 0))


def untracked(git_dir: str, root: str, workspace: Workspace) -> list[bytes]:
    """What `git ls-files --others --exclude-standard` lists, with directories the agent
    locked unlocked first (git skips what it cannot open)."""
    for _ in range(64):
        out, err = git(git_dir, root, "ls-files", "-z", "--others", "--exclude-standard")
        locked = [match.group(1) for match in _LOCKED_DIR.finditer(err)]
        if not locked:
            return sorted(set(out.split(b"\0")) - {b""})
        for directory in locked:
            workspace.unlock(directory.rstrip(b"/"))
    raise SystemExit("directories stay locked after 64 passes")


def walk(root: str, git_dir: str, base: str, writer: Writer) -> None:
    workspace = Workspace(os.fsencode(root))
    workspace.unlock(b"")
    tree = base_tree(git_dir, root, base)
    for path, entry in sorted(tree.items()):
        if entry[0] == 0o160000:  # a submodule's commit: never the agent's to change here
            continue
        try:
            status = workspace.lstat(path)
            if status is None or stat.S_ISDIR(status.st_mode):  # gone, or now a directory
                writer.record(b"D", path)
            elif not (stat.S_ISREG(status.st_mode) or stat.S_ISLNK(status.st_mode)):
                writer.record(b"N", path, b"not a regular file or symlink")
                writer.record(b"D", path)
            elif changed(workspace, path, status, entry):
                data = content(workspace, path, status, writer)
                writer.record(b"C", path, data, file_mode(status))
        except OSError as error:
            writer.record(b"N", path, f"unreadable: {error.strerror or error}".encode())
    for path in untracked(git_dir, root, workspace):
        if path.endswith(b"/"):
            writer.record(b"N", path.rstrip(b"/"), b"a nested git repository")
            continue
        if path in tree or is_junk(path):
            continue
        try:
            status = workspace.lstat(path)
            if status is None:
                continue
            if not (stat.S_ISREG(status.st_mode) or stat.S_ISLNK(status.st_mode)):
                writer.record(b"N", path, b"not a regular file or symlink")
                continue
            data = content(workspace, path, status, writer)
        except OSError as error:
            writer.record(b"N", path, f"unreadable: {error.strerror or error}".encode())
            continue
        writer.record(b"C", path, data, file_mode(status))


def main() -> int:
    root, git_dir, base, max_bytes, max_entries, git_argv = sys.argv[1:7]
    GIT_ARGV[:] = json.loads(git_argv)
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
