"""Repository checkouts for SWE tasks, and running a task's setup commands in a sandbox.

Checkout method, measured (tools/bench/sandbox_bench.py, checkout table, 3000 files): `git
clone --shared` + detached checkout ~600 ms, within noise of `git worktree add` and a
hard-linked `clone --local` (writing the working tree dominates all three), and about half a
full copy's time; it is the one of them that is safe to hand to an agent. A worktree would
write the agent's index and HEAD into the source repository's own `.git/worktrees/`, and a
hard-linked `clone --local` lets the sandbox's root rewrite object files shared with the
source. A shared clone has its own
`.git`; it only reads the source's object store, which the local backend mounts read-only
inside the sandbox at the same absolute path so the alternates link resolves there too.

Host-side git runs only on repositories we created and the agent has not touched yet; a repo
the agent worked in is only ever driven by git *inside* the sandbox (see git_diff.py), because
its `.git/config` can name programs (core.fsmonitor, diff drivers) git would run.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sandbox._errors import SandboxError
from sandbox._protocol import Sandbox
from sandbox._result import ExecResult

# Host git must not pick up the caller's global or system config (hooks, templates, signing).
_GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_TERMINAL_PROMPT": "0",
    "LC_ALL": "C",
}


class CheckoutError(SandboxError):
    """The source repository or the base commit is unusable."""


class SetupFailedError(SandboxError):
    """A setup command exited non-zero or timed out."""

    def __init__(self, command: str, result: ExecResult) -> None:
        reason = "timed out" if result.timed_out else f"exited {result.exit_code}"
        super().__init__(f"setup command {reason}: {command!r}\n{result.stderr[-2000:]}")
        self.command = command
        self.result = result


@dataclass(frozen=True, slots=True)
class Checkout:
    """A fresh checkout and the source object directory it reads (mount it read-only)."""

    path: Path
    commit: str
    shared_objects: Path


def _git(args: Sequence[str], *, cwd: Path | None = None) -> str:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **_GIT_ENV}
    done = subprocess.run(
        ["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise CheckoutError(f"git {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def resolve_commit(source: Path, commit: str) -> str:
    """The full id of `commit` in the local repository `source` (CheckoutError if absent)."""
    source = source.resolve()
    if not source.exists():
        raise CheckoutError(f"source repository does not exist: {source}")
    try:
        return _git(["rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"], cwd=source)
    except CheckoutError as error:
        raise CheckoutError(f"commit {commit!r} not found in {source}") from error


def git_common_dir(source: Path) -> Path:
    """The git directory holding `source`'s objects and refs (its `.git`, or itself if bare)."""
    source = source.resolve()
    if not source.exists():
        raise CheckoutError(f"source repository does not exist: {source}")
    own = source / ".git"
    if own.is_dir() and not own.is_symlink() and not (own / "commondir").exists():
        # A main work tree's own git directory: no need to ask git, which refuses a
        # repository another user owns (an image's, unpacked as root) to a non-root caller.
        return own
    return Path(_git(["rev-parse", "--path-format=absolute", "--git-common-dir"], cwd=source))


def checkout_repo(source: Path, commit: str, dest: Path) -> Checkout:
    """Check out `commit` of the local repository `source` into the empty directory `dest`.

    The result has HEAD detached at the full commit id, a clean working tree, and its own
    `.git` whose object store borrows the source's (read-only) through alternates.
    """
    full = resolve_commit(source, commit)
    if dest.exists() and any(dest.iterdir()):
        raise CheckoutError(f"checkout destination is not empty: {dest}")
    common = git_common_dir(source)
    _git(["clone", "--quiet", "--shared", "--no-checkout", str(common), str(dest)])
    _git(["-c", "advice.detachedHead=false", "checkout", "--quiet", "--detach", full], cwd=dest)
    return Checkout(path=dest, commit=full, shared_objects=common / "objects")


async def checkout_repo_async(source: Path, commit: str, dest: Path) -> Checkout:
    """`checkout_repo` off the event loop."""
    return await asyncio.to_thread(checkout_repo, source, commit, dest)


async def run_setup(
    sandbox: Sandbox,
    commands: Sequence[str],
    *,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
) -> list[ExecResult]:
    """Run a task's setup commands in order; the first failure raises SetupFailedError.

    `timeout` applies to each command. Results of the successful commands are returned so
    the caller can keep them for diagnostics.
    """
    results: list[ExecResult] = []
    for command in commands:
        result = await sandbox.exec(command, cwd=cwd, env=env, timeout=timeout)
        if not result.ok:
            raise SetupFailedError(command, result)
        results.append(result)
    return results
