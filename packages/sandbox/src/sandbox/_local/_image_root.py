"""A task's image as the sandbox's root: which of its paths appear where, and as whom.

The root is built as on the host (see _bwrap.py): a fresh file system whose top-level entries
are the image's, each directory bound read-only, each link recreated as it is, and then
remounted read-only. The directories the sandbox makes its own (``/proc``, ``/dev``, ``/sys``,
``/tmp``, ``/run``, the home, the workspace) are never taken from the image.

Everything read from the image on the host goes through :func:`inside`, which refuses a path
with a symbolic link on the way: the image is the task's (and a task's image may be built by
anyone), and a link resolved on the host would point into the host's own files.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from sandbox._errors import UnsupportedSpecError

#: Top-level names the sandbox provides itself, never the image's.
OWN_TOP_LEVEL = frozenset({"proc", "dev", "sys", "tmp", "run"})
ROOT_HOME = PurePosixPath("/root")


@dataclass(frozen=True, slots=True)
class ImageRoot:
    """An image's root file system on the host, and what its configuration asks for."""

    path: Path
    env: Mapping[str, str] = field(default_factory=dict)
    working_dir: PurePosixPath | None = None
    user: str | None = None

    def entries(
        self, replaced: frozenset[str]
    ) -> tuple[list[tuple[Path, PurePosixPath]], list[tuple[str, PurePosixPath]]]:
        """The top-level binds (host path, path inside) and links (target, path inside) that
        rebuild this root, without the sandbox's own names and those `replaced`."""
        binds: list[tuple[Path, PurePosixPath]] = []
        links: list[tuple[str, PurePosixPath]] = []
        skip = OWN_TOP_LEVEL | replaced
        with os.scandir(self.path) as found:
            for entry in sorted(found, key=lambda entry: entry.name):
                if entry.name in skip:
                    continue
                target = PurePosixPath("/", entry.name)
                if entry.is_symlink():
                    links.append((os.readlink(entry.path), target))
                elif entry.is_dir(follow_symlinks=False) or entry.is_file(follow_symlinks=False):
                    binds.append((Path(entry.path), target))
        return binds, links

    def ids(self) -> tuple[int, int, PurePosixPath]:
        """The uid and gid commands run as inside, and their home (the image's ``User``:
        ``name``, ``uid``, ``name:group`` or ``uid:gid``, names read from the image's
        /etc/passwd and /etc/group; root when unset)."""
        if not self.user:
            return 0, 0, ROOT_HOME
        name, _, group = self.user.partition(":")
        users = self._table("etc/passwd")
        uid, gid, home = -1, -1, ROOT_HOME
        for fields in users:
            if len(fields) >= 6 and (fields[0] == name or fields[2] == name):
                uid, gid, home = int(fields[2]), int(fields[3]), PurePosixPath(fields[5] or "/")
                break
        else:
            if not name.isdigit():
                raise UnsupportedSpecError(f"the image's user {name!r} is not in its /etc/passwd")
            uid, gid = int(name), int(name)
        if group:
            groups = {fields[0]: int(fields[2]) for fields in self._table("etc/group")}
            if group.isdigit():
                gid = int(group)
            elif group in groups:
                gid = groups[group]
            else:
                raise UnsupportedSpecError(f"the image's group {group!r} is not in its /etc/group")
        return uid, gid, home if uid != 0 else ROOT_HOME

    def _table(self, relative: str) -> list[list[str]]:
        path = inside(self.path, PurePosixPath("/", relative), kind=stat.S_IFREG)
        if path is None:
            return []
        with open(path, encoding="utf-8", errors="replace") as file:
            return [line.rstrip("\n").split(":") for line in file if not line.startswith("#")]


def inside(root: Path, path: PurePosixPath, *, kind: int = stat.S_IFDIR) -> Path | None:
    """`path` of the image under `root` on the host, when every component is a real directory
    (and the last one of `kind`); None when it is missing or goes through a link."""
    current = root
    parts = path.relative_to("/").parts
    for index, part in enumerate(parts):
        if part in ("", ".", ".."):
            return None
        current = current / part
        try:
            info = os.lstat(current)
        except FileNotFoundError:
            return None
        wanted = kind if index == len(parts) - 1 else stat.S_IFDIR
        if stat.S_IFMT(info.st_mode) != wanted:
            return None
    return current


@dataclass(frozen=True, slots=True)
class ImagePlan:
    """How one sandbox is laid out on an image: what of it is bound where, the scratch mounts
    it has room for, who commands run as, where the workspace and home are, the image's copy
    of the workspace (an ImageWorkspace) and the environment the image asks for."""

    binds: list[tuple[Path, PurePosixPath]]
    links: list[tuple[str, PurePosixPath]]
    scratch: tuple[str, ...]
    uid: int
    gid: int
    workspace: PurePosixPath
    home: PurePosixPath
    seed: Path | None
    env: Mapping[str, str]


def plan(
    root: ImageRoot,
    *,
    image_workspace: PurePosixPath | None,
    wants_image_workspace: bool,
    default_workspace: PurePosixPath,
    scratch: tuple[str, ...],
    bind_targets: Sequence[PurePosixPath] = (),
    extra_scratch: Sequence[PurePosixPath] = (),
) -> ImagePlan:
    """Lay a sandbox out on `root` (see ImagePlan). `image_workspace` is an ImageWorkspace's
    path (None: the image's working directory) when `wants_image_workspace`; `bind_targets`
    are where the spec's read-only binds are mounted, `extra_scratch` its scratch directories."""
    if not root.path.is_dir():
        raise UnsupportedSpecError(f"the image's root {root.path} is not a directory")
    uid, gid, home = root.ids()
    seed = None
    workspace = default_workspace
    if wants_image_workspace:
        chosen = image_workspace or root.working_dir
        if chosen is None:
            raise UnsupportedSpecError(
                "ImageWorkspace() without a path needs an image with a working directory"
            )
        seed = inside(root.path, chosen)
        if seed is None:
            raise UnsupportedSpecError(
                f"the image has no directory {chosen} for the workspace (or it goes through a "
                "symbolic link)"
            )
        workspace = chosen
    top = PurePosixPath("/")
    own = (workspace, home, *extra_scratch)
    replaced = frozenset(path.name for path in own if path.parent == top)
    binds, links = root.entries(replaced)
    for path in own:
        _check_mount_point(root, path)
    for path in bind_targets:
        _check_bind_target(root, path)
    room = tuple(path for path in scratch if _has_room(root, PurePosixPath(path)))
    return ImagePlan(binds, links, room, uid, gid, workspace, home, seed, dict(root.env))


def _check_mount_point(root: ImageRoot, path: PurePosixPath) -> None:
    """A mount point below a top-level directory of the image must be one of its directories
    (the image's directories are read-only: nothing can be created in them)."""
    if path.parent == PurePosixPath("/") or inside(root.path, path) is not None:
        return
    if inside(root.path, PurePosixPath("/", path.parts[1])) is None:
        return  # the top level is not the image's: the sandbox's own root can hold it
    raise UnsupportedSpecError(f"the image has no directory {path} to mount the sandbox's on")


def _check_bind_target(root: ImageRoot, path: PurePosixPath) -> None:
    """A bind lands on what the image has at `path`, or where the sandbox can make room: in
    its own directories (/run, /tmp) or below a top-level name the image lacks."""
    if path.parts[1] in OWN_TOP_LEVEL or path.parent == PurePosixPath("/"):
        return
    if inside(root.path, path) is not None:
        return
    if inside(root.path, path, kind=stat.S_IFREG) is not None:
        return
    if inside(root.path, PurePosixPath("/", path.parts[1])) is None:
        return
    raise UnsupportedSpecError(
        f"cannot bind at {path}: the image's directories are read-only and it has nothing "
        f"there to mount on; bind under /run or a top-level directory the image lacks"
    )


def _has_room(root: ImageRoot, path: PurePosixPath) -> bool:
    """Whether a scratch file system can be mounted at `path` over this image."""
    top = PurePosixPath("/", path.parts[1])
    if top.name in OWN_TOP_LEVEL or path.parent == PurePosixPath("/"):
        return True
    if not os.path.lexists(root.path / top.name):
        return True
    return inside(root.path, path) is not None
