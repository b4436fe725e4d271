"""A base to capture a change against, for an image's working directory that is no repository.

A change is captured as a diff against the repository the workspace came from. Many images
keep their task's files in a plain directory (a Harbor task's ``/app``, written by the
image's Dockerfile), with no ``.git``: there is nothing to diff against. So the local backend
commits that directory, as the image has it, to a bare repository of its own on the host,
before the sandbox boots and before anything of the agent's exists: the commit holds what
``git add -A`` would stage there (``.gitignore`` rules of the image honoured, symlinks as
links, executable bits), with a fixed author and date, so the same content is always the
same commit. The repository is mounted read-only where the capture reads it and removed
with the sandbox; the agent's workspace stays what the image has (no ``.git`` appears in it).

Only the image's own files are read here (never anything a sandbox has touched), by host
git with no configuration but ours.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from sandbox._errors import SandboxError
from sandbox._workspace import _GIT_ENV

_AUTHOR = {
    "HOME": os.devnull,
    "GIT_AUTHOR_NAME": "image",
    "GIT_AUTHOR_EMAIL": "image@snapshot.invalid",
    "GIT_AUTHOR_DATE": "1970-01-01T00:00:00+00:00",
    "GIT_COMMITTER_NAME": "image",
    "GIT_COMMITTER_EMAIL": "image@snapshot.invalid",
    "GIT_COMMITTER_DATE": "1970-01-01T00:00:00+00:00",
}
# The image's files may belong to any user; nothing of this repository's config is read.
_SAFE = ("-c", "safe.directory=*", "-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null")


class SnapshotError(SandboxError):
    """The image's working directory could not be committed as a base."""


def snapshot_directory(directory: Path, repository: Path) -> str:
    """Commit `directory`'s content to a new bare repository at `repository`; the commit id.
    Blocking: run it in a thread."""
    index = repository / "snapshot.index"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **_GIT_ENV, **_AUTHOR}

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", *_SAFE, f"--git-dir={repository}", f"--work-tree={directory}", *args],
            cwd=directory,
            env={**env, "GIT_INDEX_FILE": str(index)},
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise SnapshotError(
                f"committing the image's {directory} as the base failed: git {args[0]}: "
                f"{done.stderr.strip()[-500:]}"
            )
        return done.stdout.strip()

    done = subprocess.run(
        ["git", "init", "--quiet", "--bare", "--initial-branch=base", str(repository)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SnapshotError(f"git init {repository} failed: {done.stderr.strip()[-500:]}")
    git("add", "--all", ".")
    tree = git("write-tree")
    commit = git("commit-tree", tree, "-m", f"the image's {directory.name or '/'}")
    git("update-ref", "refs/heads/base", commit)
    index.unlink()
    return commit
