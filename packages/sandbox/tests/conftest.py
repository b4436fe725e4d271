"""Shared fixtures: a real local backend (bubblewrap when present) and real git repositories."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandbox.local import LocalBackend, LocalConfig, LocalSandbox
from sandbox.spec import SandboxSpec

HAS_BWRAP = shutil.which("bwrap") is not None

requires_bwrap = pytest.mark.skipif(not HAS_BWRAP, reason="bubblewrap not installed")


@pytest.fixture
def backend(tmp_path: Path) -> LocalBackend:
    root = tmp_path / "state"
    root.mkdir()
    return LocalBackend(LocalConfig(isolation="bwrap" if HAS_BWRAP else "auto", state_root=root))


@pytest.fixture
async def box(backend: LocalBackend) -> AsyncIterator[LocalSandbox]:
    async with await backend.create(SandboxSpec()) as sandbox:
        yield sandbox


GIT_ENV = {
    "PATH": os.environ["PATH"],
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
}


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", *args], cwd=repo, env=GIT_ENV, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


@pytest.fixture
def source_repo(tmp_path: Path) -> tuple[Path, str]:
    """A real repository with two commits; returns (path, base commit = first commit)."""
    repo = tmp_path / "source"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "keep.py").write_text("print('keep')\n")
    (repo / "edit.py").write_text("x = 1\n")
    (repo / "gone.txt").write_text("delete me\n")
    (repo / "old_name.txt").write_text("rename me, long enough to be detected as a rename\n" * 5)
    (repo / "script.sh").write_text("#!/bin/sh\necho hi\n")
    (repo / "blob.bin").write_bytes(bytes(range(256)) * 4)
    (repo / ".gitignore").write_text("ignored.log\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    base = git(repo, "rev-parse", "HEAD")
    (repo / "later.txt").write_text("after base\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "later")
    return repo, base
