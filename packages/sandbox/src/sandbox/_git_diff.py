"""Capture an agent's complete change to a repository as one binary patch, and apply it.

Capture runs git *inside* the sandbox: the repository is the agent's, and its `.git/config`
can name programs (core.fsmonitor, diff drivers, hooks) that a host-side git would execute.
Every setting that could bend the patch's format is pinned on the command line.

What is captured: the working tree as it is now against the base commit, including untracked
files, deletions, binary files, renames, mode changes and anything the agent committed, all
in one `git diff --binary` that `git apply`s onto a fresh checkout of the base. The agent's
own index is never touched: the snapshot is staged in a temporary GIT_INDEX_FILE seeded from
HEAD (so files the agent force-added stay included), minus junk such as caches and
node_modules. Files the repository ignores are left out, as `git add -A` would.
"""

from __future__ import annotations

import re
import shlex
import uuid
from dataclasses import dataclass

from sandbox._errors import SandboxCommandError, SandboxError
from sandbox._protocol import Sandbox

#: Paths never part of an agent's change, whatever .gitignore says.
DEFAULT_JUNK: tuple[str, ...] = (
    "**/__pycache__/**",
    "**/*.pyc",
    "**/.pytest_cache/**",
    "**/.mypy_cache/**",
    "**/.ruff_cache/**",
    "**/.hypothesis/**",
    "**/.tox/**",
    "**/node_modules/**",
    "**/.venv/**",
    "**/*.egg-info/**",
    "**/.DS_Store",
)

# Settings that would change the patch's shape (prefixes, colors, line endings, renames) or
# run programs, pinned to git's defaults whatever the repository's config says.
_PINNED_CONFIG: tuple[str, ...] = (
    "safe.directory=*",
    "core.fsmonitor=false",
    "core.hooksPath=/dev/null",
    "core.autocrlf=false",
    "core.safecrlf=false",
    "core.fileMode=true",
    "core.symlinks=true",
    "core.quotePath=true",
    "core.attributesFile=/dev/null",
    "core.excludesFile=/dev/null",
    "diff.noprefix=false",
    "diff.mnemonicPrefix=false",
    "diff.relative=false",
    "diff.renames=true",
    "diff.external=",
    "color.ui=never",
    "advice.detachedHead=false",
)
_GIT = "git " + " ".join(f"-c {shlex.quote(c)}" for c in _PINNED_CONFIG)
_DIFF_FLAGS = (
    "--binary --full-index --no-color --no-ext-diff --no-textconv -M "
    "--src-prefix=a/ --dst-prefix=b/"
)
_BASE_RE = re.compile(r"^[0-9a-f]{7,64}$")
_HEADER_RE = re.compile(rb"^(?:diff --git a/(.*) b/(.*)|(?:rename|copy) (?:from|to) (.*))$")


class UnsafePatchError(SandboxError):
    """A patch would write inside `.git` or outside the repository."""


@dataclass(frozen=True, slots=True)
class CapturedDiff:
    """The agent's change: a patch against `base` and the paths it touches."""

    base: str
    patch: bytes
    changed_paths: tuple[str, ...]

    @property
    def empty(self) -> bool:
        return not self.patch


def _capture_script(
    repo: str, base: str, patch_path: str, names_path: str, junk: tuple[str, ...]
) -> str:
    excludes = " ".join(shlex.quote(f":(exclude,glob){pattern}") for pattern in junk)
    q = shlex.quote
    return f"""set -eu
cd -- {q(repo)}
GIT_INDEX_FILE=$(mktemp)
export GIT_INDEX_FILE
trap 'rm -f -- "$GIT_INDEX_FILE" "$GIT_INDEX_FILE.lock"' EXIT
{_GIT} read-tree HEAD
{_GIT} add -A -- . {excludes}
tree=$({_GIT} write-tree)
{_GIT} diff {_DIFF_FLAGS} {q(base)} "$tree" -- > {q(patch_path)}
{_GIT} diff --name-only -z --no-renames {q(base)} "$tree" -- > {q(names_path)}
"""


async def capture_diff(
    sandbox: Sandbox,
    base: str,
    *,
    repo: str | None = None,
    junk: tuple[str, ...] = DEFAULT_JUNK,
    timeout: float | None = 300.0,
) -> CapturedDiff:
    """Capture everything the agent changed in `repo` (default: the workspace) since `base`.

    `base` must be a full or abbreviated hex commit id (never a ref the agent could move).
    """
    if not _BASE_RE.match(base):
        raise ValueError(f"base must be a hex commit id, got {base!r}")
    repo_path = repo if repo is not None else sandbox.workspace
    stem = f"/tmp/agent-diff-{uuid.uuid4().hex}"
    patch_path, names_path = f"{stem}.patch", f"{stem}.names"
    script = _capture_script(repo_path, base, patch_path, names_path, junk)
    result = await sandbox.exec(script, timeout=timeout)
    try:
        if not result.ok:
            raise SandboxCommandError(
                f"diff capture failed (exit {result.exit_code}, timed out {result.timed_out}): "
                f"{result.stderr.strip()}"
            )
        patch = await sandbox.read_file(patch_path)
        names = await sandbox.read_file(names_path)
    finally:
        await sandbox.exec(f"rm -f -- {shlex.quote(patch_path)} {shlex.quote(names_path)}")
    changed = tuple(n.decode("utf-8", errors="surrogateescape") for n in names.split(b"\0") if n)
    return CapturedDiff(base=base, patch=patch, changed_paths=changed)


def check_patch_paths(patch: bytes) -> None:
    """Refuse a patch that names a path inside `.git` or escaping the repository.

    git apply already refuses `..` and paths behind symlinks; `.git` is checked here because
    a patch applied for grading must not be able to plant hooks or config.
    """
    for line in patch.split(b"\n"):
        match = _HEADER_RE.match(line)
        if match is None:
            continue
        for raw in match.groups():
            if raw is None:
                continue
            parts = raw.strip(b'"').split(b"/")
            if any(p.lower() == b".git" for p in parts) or b".." in parts or raw.startswith(b"/"):
                raise UnsafePatchError(f"patch touches a forbidden path: {raw!r}")


async def apply_diff(
    sandbox: Sandbox, patch: bytes, *, repo: str | None = None, timeout: float | None = 300.0
) -> None:
    """Apply a captured patch to a (fresh) checkout inside `sandbox`; all or nothing."""
    if not patch:
        return
    check_patch_paths(patch)
    repo_path = repo if repo is not None else sandbox.workspace
    patch_path = f"/tmp/agent-apply-{uuid.uuid4().hex}.patch"
    await sandbox.write_file(patch_path, patch)
    q = shlex.quote
    script = (
        f"cd -- {q(repo_path)} && {_GIT} apply --binary --whitespace=nowarn {q(patch_path)}; "
        f"status=$?; rm -f -- {q(patch_path)}; exit $status"
    )
    result = await sandbox.exec(script, timeout=timeout)
    if not result.ok:
        raise SandboxCommandError(f"git apply failed: {result.stderr.strip()}")
