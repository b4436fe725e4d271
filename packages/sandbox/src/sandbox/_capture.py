"""Capture an agent's complete change to a repository as one binary patch, owned by the host.

The agent's sandbox is still open when its change is captured, and anything the agent left
in it is hostile: a daemon appending to files, a `~/.bash_profile` that redefines `git`, a
`.git/config` naming programs, forged objects, attributes that make git convert or fail, a
FIFO where a file was. So the capture

1. kills every process of the sandbox first (`Sandbox.kill_all`): nothing of the agent's runs
   while its change is read;
2. reads the workspace with a script of ours on the sandbox's read-only interpreter, started
   without a shell or rc file, in an empty environment (`Sandbox.run_python`, _capture_walker.py):
   git only lists paths, against the task's read-only repository, never the agent's `.git`;
   no symlink is followed, only regular files are read, and the output is bounded;
3. builds the patch on the host, in a bare repository of its own that borrows the task
   repository's objects: the content becomes blobs, the blobs a tree, and `git diff` of the
   base against that tree is the patch. Nothing of the agent's configures that git.

What is captured is what `git add -A` would stage against the base: tracked files changed,
deleted or retyped, untracked files no .gitignore hides, symlinks as links, executable bits;
commits the agent made count as their content. Junk (caches, node_modules, virtualenvs,
egg-info) is left out. A nested repository, a FIFO or an unreadable file is noted, never a
failure: whatever the agent did to its own workspace, its change can be captured and graded.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import struct
import subprocess
import tempfile
import zlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from sandbox._errors import SandboxCommandError, SandboxError, UnsupportedSpecError
from sandbox._git_diff import GIT_PINNED, diff_flags
from sandbox._protocol import Sandbox
from sandbox._workspace import git_common_dir

_BASE_RE = re.compile(r"^[0-9a-f]{7,64}$")
_MAGIC = b"agent-rl-snapshot 1\n"
_HEADER = struct.Struct(">c6sI")
_LENGTH = struct.Struct(">Q")
_TOO_LARGE_EXIT = 3
_GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_ATTR_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "HOME": os.devnull,
    "LC_ALL": "C",
}


class ChangeTooLargeError(SandboxError):
    """The agent's change is larger than the capture's limits (the agent's doing)."""


@dataclass(frozen=True, slots=True)
class CaptureLimits:
    """How much change a capture accepts: bytes of content (and paths) and files touched."""

    max_bytes: int = 64 << 20
    max_files: int = 100_000

    def __post_init__(self) -> None:
        if self.max_bytes <= 0 or self.max_files <= 0:
            raise ValueError("CaptureLimits must be positive")


@dataclass(frozen=True, slots=True)
class CapturedDiff:
    """The agent's change: a patch against `base`, the paths it touches, and what was seen
    in the workspace but is not part of it (path, why)."""

    base: str
    patch: bytes
    changed_paths: tuple[str, ...]
    left_out: tuple[tuple[str, str], ...] = ()

    @property
    def empty(self) -> bool:
        return not self.patch


@dataclass(frozen=True, slots=True)
class _Change:
    path: bytes
    mode: int
    """0 for a deleted path."""
    data: bytes


async def capture_diff(
    sandbox: Sandbox,
    repository: Path,
    base: str,
    *,
    limits: CaptureLimits | None = None,
    timeout: float | None = 300.0,
) -> CapturedDiff:
    """Capture everything the agent changed in the sandbox's workspace since `base`.

    `repository` is the host repository the workspace was checked out from (a GitWorkspace's
    `repo`); inside, the capture lists against the sandbox's read-only copy of it
    (`Sandbox.base_repository`). `base` must be a hex commit id, never a ref. Every process
    of the sandbox is killed first. Raises ChangeTooLargeError when the change is over
    `limits`, UnsupportedSpecError for a sandbox without its repository mounted (E2B, a
    workspace not from git), SandboxError when the sandbox or the repository fails.
    """
    if not _BASE_RE.match(base):
        raise ValueError(f"base must be a hex commit id, got {base!r}")
    inside = sandbox.base_repository
    if inside is None:
        raise UnsupportedSpecError(
            "capture_diff needs the task's repository mounted read-only in the sandbox "
            "(a GitWorkspace on the local backend); this sandbox has none"
        )
    limits = limits or CaptureLimits()
    git_dir = await asyncio.to_thread(git_common_dir, repository)
    await sandbox.kill_all()
    walker = resources.files("sandbox").joinpath("_capture_walker.py").read_text()
    args = [sandbox.workspace, inside, base, str(limits.max_bytes), str(limits.max_files)]
    args.append(json.dumps(sandbox.git_argv))
    bound = limits.max_bytes + (limits.max_files + 2) * (_HEADER.size + _LENGTH.size) + 4096
    result = await sandbox.run_python(walker, args, timeout=timeout, max_output_bytes=bound)
    if result.timed_out or result.truncated or result.exit_code not in (0, _TOO_LARGE_EXIT):
        raise SandboxCommandError(
            f"diff capture failed (exit {result.exit_code}, timed out {result.timed_out}, "
            f"output over its bound {result.truncated}): {result.stderr.strip()[-2000:]}"
        )
    changes, left_out, too_large = _parse(result.stdout)
    if too_large is not None:
        raise ChangeTooLargeError(f"the change is too large: {too_large}")
    patch, changed = await asyncio.to_thread(_build_patch, git_dir, base, changes)
    return CapturedDiff(base, patch, changed, left_out)


def _parse(output: bytes) -> tuple[list[_Change], tuple[tuple[str, str], ...], str | None]:
    """The walker's records: changes, notes, and the too-large message if it stopped."""
    if not output.startswith(_MAGIC):
        raise SandboxCommandError("diff capture wrote no snapshot")
    view = memoryview(output)
    offset = len(_MAGIC)
    changes: list[_Change] = []
    notes: list[tuple[str, str]] = []
    while offset + _HEADER.size + _LENGTH.size <= len(view):
        tag, mode, path_length = _HEADER.unpack_from(view, offset)
        offset += _HEADER.size
        path = bytes(view[offset : offset + path_length])
        offset += path_length
        (data_length,) = _LENGTH.unpack_from(view, offset)
        offset += _LENGTH.size
        data = bytes(view[offset : offset + data_length])
        offset += data_length
        if len(path) != path_length or len(data) != data_length:
            break
        if tag == b"E":
            return changes, tuple(notes), None
        if tag == b"T":
            return changes, tuple(notes), data.decode("utf-8", "replace")
        if tag == b"N":
            notes.append((os.fsdecode(path), data.decode("utf-8", "replace")))
        elif tag in (b"C", b"D"):
            changes.append(_Change(path, int(mode, 8) if tag == b"C" else 0, data))
        else:
            raise SandboxCommandError(f"diff capture wrote an unknown record {tag!r}")
    raise SandboxCommandError("diff capture's snapshot ends early")


def _git(git_dir: Path, *args: str, stdin: bytes = b"", index: Path | None = None) -> bytes:
    env = {"PATH": os.environ.get("PATH", os.defpath), **_GIT_ENV, "GIT_DIR": str(git_dir)}
    if index is not None:
        env["GIT_INDEX_FILE"] = str(index)
    done = subprocess.run(
        ["git", *GIT_PINNED, *args], input=stdin, env=env, capture_output=True, check=False
    )
    if done.returncode != 0:
        message = done.stderr.decode("utf-8", "replace").strip()[-2000:]
        raise SandboxCommandError(f"git {args[0]} failed while building the patch: {message}")
    return done.stdout


def _build_patch(source: Path, base: str, changes: list[_Change]) -> tuple[bytes, tuple[str, ...]]:
    """The patch from `base` to `base` + `changes`, built in a repository of our own that
    borrows the source's objects (blocking: run it in a thread)."""
    if not changes:
        return b"", ()
    form = _git(source, "rev-parse", "--show-object-format").decode().strip()
    algorithm = "sha256" if form == "sha256" else "sha1"
    null_oid = b"0" * hashlib.new(algorithm).digest_size * 2
    with tempfile.TemporaryDirectory(prefix="agent-rl-capture-") as scratch:
        git_dir = Path(scratch) / "git"
        _git(git_dir, "init", "--quiet", "--bare", f"--object-format={form}", str(git_dir))
        (git_dir / "objects" / "info" / "alternates").write_text(f"{source / 'objects'}\n")
        index = Path(scratch) / "index"
        _git(git_dir, "read-tree", base, index=index)
        removals, additions = [], []
        for change in changes:
            if change.mode == 0:
                removals.append(b"0 %s\t%s\0" % (null_oid, change.path))
            else:
                oid = _write_blob(git_dir, algorithm, change.data)
                additions.append(b"%o %s\t%s\0" % (change.mode, oid, change.path))
        _git(git_dir, "update-index", "-z", "--index-info", stdin=b"".join(removals), index=index)
        _git(git_dir, "update-index", "-z", "--index-info", stdin=b"".join(additions), index=index)
        tree = _git(git_dir, "write-tree", index=index).decode().strip()
        patch = _git(git_dir, "diff", *diff_flags(), base, tree, "--")
        names = _git(git_dir, "diff", "--name-only", "-z", "--no-renames", base, tree, "--")
    return patch, tuple(os.fsdecode(name) for name in names.split(b"\0") if name)


def _write_blob(git_dir: Path, algorithm: str, data: bytes) -> bytes:
    """Store `data` as a loose blob (what `git hash-object -w --no-filters` does); its id."""
    raw = b"blob %d\0" % len(data) + data
    oid = hashlib.new(algorithm, raw).hexdigest()
    folder = git_dir / "objects" / oid[:2]
    folder.mkdir(exist_ok=True)
    target = folder / oid[2:]
    if not target.exists():
        target.write_bytes(zlib.compress(raw, 1))
    return oid.encode()
