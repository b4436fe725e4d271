"""Shared fixtures: the real CLIs installed from npm into a stable per-user cache, and a
local sandbox backend (bubblewrap when it works here, the loud plain-process fallback
otherwise).

The install cache is ~/.cache/agent-rl/npm so that re-runs (and CI with a cached home) skip
the ~25 s of downloads. Without npm the tests that need a real CLI are skipped with a
reason nobody can miss; nothing else is ever skipped.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
import uuid
import warnings
from pathlib import Path, PurePosixPath

import pytest

from harness import CLAUDE_CODE_CLI, CODEX_CLI, CliMount, InstallConfig, InstalledCli, install_cli
from sandbox import LocalBackend, LocalConfig

NPM_CACHE = Path.home() / ".cache" / "agent-rl" / "npm"

GIT_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
}


def require_npm() -> None:
    if shutil.which("npm") is None:
        reason = (
            "!!! NPM IS NOT AVAILABLE: the real Claude Code / Codex CLIs cannot be installed, "
            "so every test that runs them is SKIPPED. Install Node.js + npm to run them. !!!"
        )
        warnings.warn(reason, stacklevel=2)
        pytest.skip(reason)


@pytest.fixture(scope="session")
def install_config() -> InstallConfig:
    require_npm()
    return InstallConfig(cache_dir=NPM_CACHE)


@pytest.fixture(scope="session")
def claude_install(install_config: InstallConfig) -> InstalledCli:
    return asyncio.run(install_cli(CLAUDE_CODE_CLI, install_config))


@pytest.fixture(scope="session")
def codex_install(install_config: InstallConfig) -> InstalledCli:
    return asyncio.run(install_cli(CODEX_CLI, install_config))


@pytest.fixture
def backend(tmp_path: Path) -> LocalBackend:
    root = tmp_path / "state"
    root.mkdir()
    return LocalBackend(LocalConfig(state_root=root))


async def mount_for(backend: LocalBackend, installed: InstalledCli) -> CliMount:
    """A read-only bind at a unique sandbox path (so a test can find its processes by
    command line), or the host path where the backend runs without isolation."""
    if backend.isolated:
        return CliMount.under(installed, PurePosixPath(f"/opt/harness-test-{uuid.uuid4().hex}"))
    return CliMount.at_host_path(installed)


def processes_running_from(prefix: str) -> list[int]:
    """Host pids (every pid namespace is visible here) executing a program under `prefix`:
    its argv[0], or argv[1] for an interpreter such as node running a launcher script.
    (The sandbox's own bwrap mentions the prefix too, but only as a mount argument.)"""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if any(arg.startswith(prefix.encode()) for arg in cmdline.split(b"\0")[:2]):
            found.append(int(proc.name))
    return found


async def wait_until_gone(prefix: str, timeout: float = 2.0) -> list[int]:
    """Poll until no process runs from `prefix`; return the survivors after `timeout`.

    A SIGKILLed group dies asynchronously: the sandbox waits for the group leader, and the
    others may need a few milliseconds more to be scheduled and die. A process that escaped
    the kill (setsid) is still there after the timeout.
    """
    deadline = time.monotonic() + timeout
    while (alive := processes_running_from(prefix)) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return alive


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", *args], cwd=repo, env=GIT_ENV, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


@pytest.fixture
def tiny_repo(tmp_path: Path) -> tuple[Path, str]:
    """A real git repository with one commit; yields (path, commit)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "greeting.py").write_text('GREETING = "hello"\n')
    (repo / "README.md").write_text("A tiny repository for agent runs.\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    return repo, git(repo, "rev-parse", "HEAD")
