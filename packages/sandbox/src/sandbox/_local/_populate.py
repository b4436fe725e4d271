"""Filling a booted local sandbox's workspace, from inside it: a bound directory or the image's
own is copied, a repository is cloned (shared: its objects are mounted read-only)."""

from __future__ import annotations

from sandbox._local._bwrap import RUN_SANDBOX, SOURCE_MOUNT
from sandbox._local._sandbox import LocalSandbox
from sandbox._spec import DirectoryWorkspace, GitWorkspace, ImageWorkspace, WorkspaceSource
from sandbox._workspace import CheckoutError

#: Where a workspace's source (a directory, or the image's workspace) is bound read-only.
SEED_PATH = f"{RUN_SANDBOX}/seed"

# Git settings for populating the workspace inside: no system config, and a global config
# that trusts the read-only source (another uid owns it). Only a global config will do: git
# hides command-line and environment config from the process that reads a local source.
_GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "LC_ALL": "C",
}
_TRUST_SOURCE = (
    'export GIT_CONFIG_GLOBAL="$(mktemp)" && '
    "printf '[safe]\\n\\tdirectory = *\\n' > \"$GIT_CONFIG_GLOBAL\" && "
    "trap 'rm -f \"$GIT_CONFIG_GLOBAL\"' EXIT && "
)
# Copies an image's workspace directory into the sandbox's own (run by our interpreter, so an
# image needs no tools): files, directories and links with their modes and times; anything
# else (a FIFO, a device) is left out, never opened.
_COPY_SCRIPT = r"""
import os, shutil, stat, sys
source, target = sys.argv[1], sys.argv[2]
for top, dirs, files in os.walk(source):
    here = os.path.join(target, os.path.relpath(top, source))
    for name in dirs + files:
        src, dst = os.path.join(top, name), os.path.join(here, name)
        info = os.lstat(src)
        if stat.S_ISLNK(info.st_mode):
            os.symlink(os.readlink(src), dst)
        elif stat.S_ISDIR(info.st_mode):
            os.mkdir(dst)
        elif stat.S_ISREG(info.st_mode):
            shutil.copyfile(src, dst, follow_symlinks=False)
        else:
            continue
        if not stat.S_ISLNK(info.st_mode):
            os.utime(dst, ns=(info.st_atime_ns, info.st_mtime_ns))
    for name in dirs:
        os.chmod(os.path.join(here, name), stat.S_IMODE(os.lstat(os.path.join(top, name)).st_mode))
    for name in files:
        info = os.lstat(os.path.join(top, name))
        if stat.S_ISREG(info.st_mode):
            os.chmod(os.path.join(here, name), stat.S_IMODE(info.st_mode))
for top, dirs, _ in os.walk(target, topdown=False):
    for name in dirs:
        info = os.lstat(os.path.join(source, os.path.relpath(os.path.join(top, name), target)))
        os.utime(os.path.join(top, name), ns=(info.st_atime_ns, info.st_mtime_ns))
"""


async def populate(
    sandbox: LocalSandbox, source: WorkspaceSource, commit: str | None, timeout: float
) -> None:
    """Fill a booted sandbox's workspace from its source, by commands inside the sandbox."""
    if isinstance(source, ImageWorkspace):
        # Our interpreter, not the image's tools: an image may have no `cp` at all.
        copied = await sandbox.run_python(
            _COPY_SCRIPT, [SEED_PATH, sandbox.workspace], timeout=timeout
        )
        if copied.exit_code != 0 or copied.timed_out:
            raise CheckoutError(f"copying the image's workspace failed: {copied.stderr[-2000:]}")
        return
    if isinstance(source, DirectoryWorkspace):
        command = f"cp -R -P --preserve=mode,timestamps,links {SEED_PATH}/. ."
    elif isinstance(source, GitWorkspace):
        command = (
            f"{_TRUST_SOURCE}git clone --quiet --shared --no-checkout {SOURCE_MOUNT} . && "
            f"git -c advice.detachedHead=false checkout --quiet --detach {commit}"
        )
    else:
        return
    result = await sandbox.exec(command, env=_GIT_ENV, timeout=timeout)
    if not result.ok:
        raise CheckoutError(f"populating the workspace failed: {result.stderr.strip()}")
