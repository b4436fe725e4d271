"""Shared fixtures: a real local backend (bubblewrap, every layer on) and real git repositories.

The sandbox tests need bubblewrap (`apt-get install bubblewrap`): without it they fail, naming
it, rather than pass by testing nothing. CI runs them as root and again as an unprivileged
user; `SANDBOX_TEST_CGROUP_PARENT` names a cgroup subtree delegated to that user, and
`SANDBOX_TEST_SUBORDINATE_IDS=1` says that it has subordinate ids.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from sandbox import LocalBackend, LocalConfig, LocalSandbox, SandboxSpec

#: A cgroup subtree delegated to the (non-root) user running the tests, if any.
CGROUP_PARENT = os.environ.get("SANDBOX_TEST_CGROUP_PARENT") or None
#: Set where the (non-root) user running the tests has subordinate ids and newuidmap: tests of
#: a sandbox's own uid then fail, rather than skip, when it does not get one.
SUBORDINATE_IDS = os.environ.get("SANDBOX_TEST_SUBORDINATE_IDS") == "1"


def local_config(state_root: Path, **overrides: Any) -> LocalConfig:
    """The config every sandbox test uses: full isolation, state under the test's tmp_path."""
    parent = PurePosixPath(CGROUP_PARENT) if CGROUP_PARENT else None
    return replace(LocalConfig(state_root=state_root, cgroup_parent=parent), **overrides)


@pytest.fixture
def backend(tmp_path: Path) -> LocalBackend:
    root = tmp_path / "state"
    root.mkdir()
    return LocalBackend(local_config(root))


@pytest.fixture
async def box(backend: LocalBackend) -> AsyncIterator[LocalSandbox]:
    sandbox = await backend.create(SandboxSpec())
    assert isinstance(sandbox, LocalSandbox)
    async with sandbox:
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
