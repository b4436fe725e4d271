"""Task repositories, prepared once per (source, base commit) and shared by every sandbox.

A sandbox's checkout shares its repository's object store, read-only, so the agent can read
every object in it. If the source holds history past the base commit, that includes the fix the
task asks for. So each task's repository is first copied into a cache holding *only* the base
commit and its ancestors (a bare repository with one branch), and sandboxes check out from
that. Preparing costs one local fetch per task; later episodes reuse it.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from swe_rl.task import SweTask

_GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_TERMINAL_PROMPT": "0",
    "LC_ALL": "C",
}
_BRANCH = "refs/heads/base"


class SourceError(RuntimeError):
    """The task's repository or commit cannot be had."""


class RepoSources:
    def __init__(self, cache_dir: Path) -> None:
        self.cache_dir = cache_dir

    async def prepare(self, task: SweTask) -> Path:
        """A local bare repository whose history ends at the task's base commit."""
        return await asyncio.to_thread(self._prepare, task)

    def _prepare(self, task: SweTask) -> Path:
        if task.repo is None or task.base_commit is None:
            raise SourceError(f"task {task.instance_id} has no repository to prepare (its image)")
        source = task.repo.path or task.repo.git_url
        if source is None:
            raise SourceError(f"task {task.instance_id} has no local path or git URL")
        if task.repo.path is not None:
            source = str(Path(source).resolve())
        key = hashlib.sha256(f"{source}\0{task.base_commit}".encode()).hexdigest()[:20]
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        ready = self.cache_dir / f"{key}.git"
        with (self.cache_dir / f"{key}.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one preparer per repository, across processes
            if not (ready / "prepared").exists():
                self._fetch(source, task.base_commit, ready)
        return ready

    def _fetch(self, source: str, commit: str, ready: Path) -> None:
        full = self._resolve(source, commit)
        staging = ready.with_suffix(f".tmp{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(ready, ignore_errors=True)
        _git("init", "--quiet", "--bare", str(staging))
        # A plain fetch may only ask for branch tips; the local upload-pack is told to serve
        # any commit, which a hosting service does for reachable ones anyway.
        upload_pack = "git -c uploadpack.allowAnySHA1InWant=true upload-pack"
        _git(
            "-C",
            str(staging),
            "fetch",
            "--quiet",
            "--no-tags",
            f"--upload-pack={upload_pack}",
            source,
            f"{full}:{_BRANCH}",
        )
        _git("-C", str(staging), "symbolic-ref", "HEAD", _BRANCH)
        (staging / "prepared").write_text(f"{source}\n{full}\n")
        staging.rename(ready)

    def _resolve(self, source: str, commit: str) -> str:
        if len(commit) == 40 or not Path(source).exists():
            return commit
        try:
            return _git("-C", source, "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}")
        except SourceError as error:
            raise SourceError(f"commit {commit} not found in {source}") from error


def _git(*args: str) -> str:
    done = subprocess.run(
        ["git", *args],
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **_GIT_ENV},
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SourceError(f"git {' '.join(args[:3])} failed: {done.stderr.strip()[-2000:]}")
    return done.stdout.strip()
