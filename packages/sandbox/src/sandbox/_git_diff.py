"""Apply a captured patch to a fresh checkout, and the git settings every patch is made with.

Applying happens in a sandbox nobody has worked in yet (a grading sandbox), so its git and
shell are the task's own (or the host's git, mounted where the image has none:
`Sandbox.git_argv`); still every setting that could bend how a patch is read or written
is pinned on the command line, whatever a repository's config says. Capturing is in
_capture.py.
"""

from __future__ import annotations

import re
import shlex
import uuid

from sandbox._errors import SandboxCommandError, SandboxError
from sandbox._protocol import Sandbox

# Settings that would change a patch's shape (prefixes, colors, line endings, renames) or run
# programs, pinned to git's defaults whatever a repository's config says.
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
#: `-c` options pinning every setting above, for a git command line.
GIT_PINNED: tuple[str, ...] = tuple(arg for c in _PINNED_CONFIG for arg in ("-c", c))
_HEADER_RE = re.compile(rb"^(?:diff --git a/(.*) b/(.*)|(?:rename|copy) (?:from|to) (.*))$")


def diff_flags() -> tuple[str, ...]:
    """`git diff` flags of a patch that `git apply --binary` applies anywhere."""
    return (
        "--binary",
        "--full-index",
        "--no-color",
        "--no-ext-diff",
        "--no-textconv",
        "-M",
        "--src-prefix=a/",
        "--dst-prefix=b/",
    )


class UnsafePatchError(SandboxError):
    """A patch would write inside `.git` or outside the repository."""


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
    git = shlex.join([*sandbox.git_argv, *GIT_PINNED])
    script = (
        f"cd -- {q(repo_path)} && {git} apply --binary --whitespace=nowarn {q(patch_path)}; "
        f"status=$?; rm -f -- {q(patch_path)}; exit $status"
    )
    result = await sandbox.exec(script, timeout=timeout)
    if not result.ok:
        raise SandboxCommandError(f"git apply failed: {result.stderr.strip()}")
