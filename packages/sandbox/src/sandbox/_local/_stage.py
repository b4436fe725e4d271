"""How root starts bubblewrap as a sandbox's unprivileged uid without losing its bind sources
(and so does root of a non-root caller's user namespace: _subids.py).

bubblewrap runs as the sandbox's own uid (never root: see _uids.py), and it resolves every
bind source as that uid. Sources under a directory only root may enter (a project or an npm
cache under /root) would be out of reach. So root first enters a private mount namespace,
mounts a small tmpfs at a fixed staging directory, bind-mounts each source there (root can
reach them), and only then drops to the sandbox uid and executes bubblewrap, which binds the
staged copies. Nothing is mounted in the host's namespace; the private one dies with the
sandbox. Only util-linux and sh are used, each exec'd in place, so the process we spawn is
bubblewrap in the end.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Sequence
from pathlib import Path

from sandbox._errors import SandboxUnavailableError

# Positional parameters only: no path is ever parsed as shell.
_STAGE_SCRIPT = r"""set -e
stage=$1; uid=$2; shift 2
mount -t tmpfs -o mode=0711,size=1m sandbox-stage "$stage"
i=0
while [ "$1" != "--" ]; do
  if [ -d "$1" ]; then mkdir -m 0755 "$stage/$i"; else : > "$stage/$i"; fi
  mount --bind "$1" "$stage/$i"
  i=$((i + 1)); shift
done
shift
exec setpriv --reuid="$uid" --regid="$uid" --clear-groups -- "$@"
"""


def stage_dir(temp_root: Path) -> Path:
    """The staging mount point: a directory of the caller's (root's: `sandbox-stage`, another
    user's: `sandbox-stage-<uid>`) that every sandbox uid may traverse and nobody else may
    change; never a link someone planted."""
    uid = os.geteuid()
    path = temp_root / ("sandbox-stage" if uid == 0 else f"sandbox-stage-{uid}")
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o711)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != uid or info.st_mode & 0o022:
        raise SandboxUnavailableError(
            f"{path} must be a directory owned by uid {uid} and writable only by it"
        )
    return path


def staged_launch(uid: int, stage: Path, sources: Sequence[Path]) -> tuple[list[str], list[str]]:
    """An argv prefix that runs the command after it as `uid` with `sources` staged, and the
    staged path of each source (in order): the command must name the sources by those."""
    staged = [str(stage / str(index)) for index in range(len(sources))]
    argv = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--",
        "/bin/sh",
        "-c",
        _STAGE_SCRIPT,
        "sh",
        str(stage),
        str(uid),
        *(str(source) for source in sources),
        "--",
    ]
    return argv, staged
