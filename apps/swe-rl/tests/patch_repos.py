"""Real `git diff` patches of small trees, made with the flags the episode captures a change with.

A tree is a mapping of byte paths (names need not be UTF-8) to file contents or symlinks; a
change is a list of operations on the working tree. `make_patch` commits the base tree in a
fresh repository, applies the change and returns `git diff --cached` of it.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

#: The flags sandbox's capture makes every patch with (sandbox/_git_diff.py: diff_flags).
CAPTURE_FLAGS = (
    "--binary",
    "--full-index",
    "--no-color",
    "--no-ext-diff",
    "--no-textconv",
    "-M",
    "--src-prefix=a/",
    "--dst-prefix=b/",
)
_GIT_ENV = {
    "PATH": os.environ.get("PATH", os.defpath),
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_AUTHOR_NAME": "test",
    "GIT_AUTHOR_EMAIL": "test@example.invalid",
    "GIT_COMMITTER_NAME": "test",
    "GIT_COMMITTER_EMAIL": "test@example.invalid",
    "LC_ALL": "C",
}


@dataclass(frozen=True, slots=True)
class Link:
    """A symlink in a tree."""

    target: bytes


Tree = Mapping[bytes, bytes | Link]


@dataclass(frozen=True, slots=True)
class Write:
    path: bytes
    content: bytes


@dataclass(frozen=True, slots=True)
class Symlink:
    path: bytes
    target: bytes


@dataclass(frozen=True, slots=True)
class Delete:
    path: bytes


@dataclass(frozen=True, slots=True)
class Move:
    old: bytes
    new: bytes


@dataclass(frozen=True, slots=True)
class Chmod:
    path: bytes
    mode: int


Op = Write | Symlink | Delete | Move | Chmod


def git(repo: Path, *args: str, quote_path: bool = True) -> bytes:
    quoting = f"core.quotePath={'true' if quote_path else 'false'}"
    done = subprocess.run(
        ["git", "-c", quoting, "-c", "core.symlinks=true", *args],
        cwd=repo,
        env=_GIT_ENV,
        capture_output=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return done.stdout


def write_tree(root: Path, tree: Tree) -> None:
    for path, content in tree.items():
        op = Symlink(path, content.target) if isinstance(content, Link) else Write(path, content)
        apply_op(root, op)


def apply_op(root: Path, op: Op) -> None:
    base = os.fsencode(root)
    if isinstance(op, Write | Symlink):
        full = os.path.join(base, op.path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        if isinstance(op, Write):
            with open(full, "wb") as file:
                file.write(op.content)
        else:
            os.symlink(op.target, full)
    elif isinstance(op, Delete):
        os.unlink(os.path.join(base, op.path))
    elif isinstance(op, Move):
        new = os.path.join(base, op.new)
        os.makedirs(os.path.dirname(new), exist_ok=True)
        os.rename(os.path.join(base, op.old), new)
    else:
        os.chmod(os.path.join(base, op.path), op.mode)


def make_repo(root: Path, base: Tree) -> Path:
    """A repository at `root` with `base` committed."""
    root.mkdir(parents=True)
    git(root, "init", "--quiet")
    write_tree(root, base)
    git(root, "add", "--all")
    git(root, "commit", "--quiet", "--allow-empty", "-m", "base")
    return root


def make_patch(
    root: Path,
    base: Tree,
    change: Sequence[Op],
    *,
    diff_args: Sequence[str] = (),
    quote_path: bool = True,
) -> bytes:
    """The patch of `change` on `base`, as git writes it with the capture's flags."""
    repo = make_repo(root, base)
    for op in change:
        apply_op(repo, op)
    git(repo, "add", "--all")
    return git(repo, "diff", "--cached", *CAPTURE_FLAGS, *diff_args, quote_path=quote_path)
