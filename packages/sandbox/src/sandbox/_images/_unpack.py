"""Layers applied in order to a root directory, with the OCI layer semantics.

Each entry replaces what was at its path (a directory stays a directory and takes the new
metadata; anything else is removed first, so a new file never writes through an old hard link
or symlink). ``.wh.<name>`` removes ``<name>`` from the layers below and ``.wh..wh..opq``
empties its directory of them; what this layer itself added is kept, in whatever order the tar
lists it. Hard links point at files of this or earlier layers. Every path is resolved inside
the root (see `_scoped`), so no entry can write, link or remove outside it.

Ownership: as root, files get the tar's uid and gid (as ``umoci unpack`` does); otherwise they
belong to the caller, whose sandboxes map it to the image's root. Modes are kept whole
(setuid, setgid, sticky) and set after the owner, which would clear them. Character and block
devices are made only by root and skipped otherwise; FIFOs are always made. Extended attributes
(PAX ``SCHILY.xattr.*``) are applied where the file system and privileges allow, skipped where
they do not. Modification times are the tar's; directories take theirs once every layer is in,
as adding children changes them, and until then stay open to their owner so that a non-root
unpack can write below a read-only directory of an earlier layer.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tarfile
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation

from sandbox._images._compression import decompressed, decompression_errors
from sandbox._images._digest import Readable, VerifyingReader
from sandbox._images._errors import PullFailure
from sandbox._images._scoped import (
    Parts,
    ScopedRoot,
    clean,
    lstat_at,
    remove_at,
)

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
MAX_NAME_BYTES = 4096
"""Longest entry or link name accepted (PATH_MAX): anything longer is a malformed layer."""
_IGNORED_XATTRS = frozenset({"security.selinux"})
"""Labels of the build host mean nothing here, and setting them may fail."""
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(slots=True)
class _DirMetadata:
    mode: int
    uid: int
    gid: int
    times_ns: tuple[int, int]
    xattrs: dict[str, bytes] = field(default_factory=dict)


class Unpacker:
    """Applies layers to the directory `root` (empty to start with), then `finish()`."""

    def __init__(self, root_fd: int, *, privileged: bool | None = None) -> None:
        self._root = ScopedRoot(root_fd)
        self._privileged = os.geteuid() == 0 if privileged is None else privileged
        self._dirs: dict[Parts, _DirMetadata] = {}
        self._upper: set[Parts] = set()

    def apply(self, blob: Readable, digest: str, size: int, diff_id: str | None) -> None:
        """Apply one layer blob, checking it against `digest` and its uncompressed tar against
        `diff_id` as it streams; `PullFailure` for a malformed layer or a mismatch (the root is
        then half written: the caller discards it)."""
        raw = VerifyingReader(blob, digest, size)
        # Besides the readers' own errors: numbers out of range (a device, a time) and names
        # that are not text; all of them say the layer is malformed.
        corrupt: tuple[type[Exception], ...] = (
            tarfile.TarError,
            *decompression_errors(),
            OverflowError,
            ValueError,
            UnicodeError,
        )
        try:
            tar_bytes = decompressed(raw)
            checked = VerifyingReader(tar_bytes, diff_id, None) if diff_id else None
            self._apply_tar(checked or tar_bytes)
            _drain(checked or tar_bytes)  # the tar's zero padding counts in its digest
            _drain(raw)
        except corrupt as error:
            raise PullFailure(f"layer {digest} is malformed: {error}") from None
        raw.verify()
        if checked:
            try:
                checked.verify()
            except PullFailure as error:
                raise PullFailure(f"layer {digest}: uncompressed {error}") from None

    def finish(self) -> None:
        """Give every directory its recorded metadata, deepest first (a read-only directory
        must not be closed before its children are done). A root no layer describes is 0755
        with the epoch as its times, as umoci leaves it: the same image, the same root."""
        self._dirs.setdefault((), _DirMetadata(0o755, os.geteuid(), os.getegid(), (0, 0)))
        for parts in sorted(self._dirs, key=len, reverse=True):
            fd = self._root.open_resolved(parts)
            if fd is None:
                continue
            try:
                self._set_metadata(fd, self._dirs[parts])
            finally:
                os.close(fd)

    def _apply_tar(self, stream: Readable) -> None:
        self._upper = set()
        with tarfile.open(fileobj=stream, mode="r|") as tar:  # type: ignore[call-overload]
            while (member := tar.next()) is not None:
                tar.members.clear()  # a stream needs none kept: memory stays flat
                self._entry(tar, member)

    def _entry(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        if (
            len(os.fsencode(member.name)) > MAX_NAME_BYTES
            or len(os.fsencode(member.linkname)) > MAX_NAME_BYTES
        ):
            raise PullFailure(f"an entry name is longer than {MAX_NAME_BYTES} bytes")
        parts = clean(member.name)
        if not parts:
            if not member.isdir():
                raise PullFailure("an entry would change the type of the root directory")
            self._dirs[()] = self._metadata(member)
            return
        *parent, name = parts
        if name.startswith(WHITEOUT):
            self._whiteout(parent, name)
            return
        opened = self._root.open_dir(parent, create=True)
        assert opened is not None  # create=True never answers None
        dir_fd, where = opened
        try:
            path = (*where, name)
            if self._write(tar, member, dir_fd, name, path):
                for depth in range(1, len(path) + 1):
                    self._upper.add(path[:depth])
        finally:
            os.close(dir_fd)

    def _write(
        self, tar: tarfile.TarFile, member: tarfile.TarInfo, dir_fd: int, name: str, path: Parts
    ) -> bool:
        """Create the entry; False when it is skipped (a device node without root)."""
        existing = lstat_at(dir_fd, name)
        if member.isdir() and existing is not None and stat.S_ISDIR(existing.st_mode):
            self._dirs[path] = self._metadata(member)
            return True
        if (member.ischr() or member.isblk()) and not self._privileged:
            return False
        if existing is not None:
            remove_at(dir_fd, name, path, self._forget)
        if member.isreg():
            self._write_file(tar, member, dir_fd, name)
        elif member.isdir():
            os.mkdir(name, 0o700, dir_fd=dir_fd)
            self._dirs[path] = self._metadata(member)
        elif member.issym():
            os.symlink(member.linkname, name, dir_fd=dir_fd)
            self._set_link_metadata(dir_fd, name, member)
        elif member.islnk():
            self._hard_link(member, dir_fd, name)
        elif member.ischr() or member.isblk() or member.isfifo():
            kind = stat.S_IFCHR if member.ischr() else stat.S_IFBLK if member.isblk() else 0
            kind = kind or stat.S_IFIFO
            device = os.makedev(member.devmajor, member.devminor) if kind != stat.S_IFIFO else 0
            os.mknod(name, kind | 0o600, device, dir_fd=dir_fd)
            fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            try:
                self._set_node_metadata(fd, member)
            finally:
                os.close(fd)
        else:
            raise PullFailure(f"entry {member.name!r} has unsupported tar type {member.type!r}")
        return True

    def _write_file(
        self, tar: tarfile.TarFile, member: tarfile.TarInfo, dir_fd: int, name: str
    ) -> None:
        source = tar.extractfile(member)
        fd = os.open(name, _FILE_FLAGS, 0o600, dir_fd=dir_fd)
        try:
            if source is not None:
                with open(fd, "wb", closefd=False) as target:
                    shutil.copyfileobj(source, target, 1 << 20)
            self._set_metadata(fd, self._metadata(member))
        finally:
            os.close(fd)

    def _hard_link(self, member: tarfile.TarInfo, dir_fd: int, name: str) -> None:
        target = clean(member.linkname)
        if not target:
            raise PullFailure(f"hard link {member.name!r} has no target")
        *target_parent, target_name = target
        opened = self._root.open_dir(target_parent, create=False)
        if opened is None:
            raise PullFailure(f"hard link {member.name!r}: no {member.linkname!r} to link to")
        target_fd, _ = opened
        try:
            info = lstat_at(target_fd, target_name)
            if info is None or stat.S_ISDIR(info.st_mode):
                what = "a directory" if info else "missing"
                raise PullFailure(f"hard link {member.name!r}: its target is {what}")
            os.link(
                target_name, name, src_dir_fd=target_fd, dst_dir_fd=dir_fd, follow_symlinks=False
            )
        finally:
            os.close(target_fd)

    def _whiteout(self, parent: list[str], name: str) -> None:
        opened = self._root.open_dir(parent, create=False)
        if opened is None:
            return  # nothing below to hide
        dir_fd, where = opened
        try:
            if name == OPAQUE:
                self._purge_below(where)
            elif name.startswith(WHITEOUT + WHITEOUT):
                return  # other AUFS bookkeeping (.wh..wh.plnk): not part of the image
            else:
                hidden = name[len(WHITEOUT) :]
                if hidden in ("", ".", ".."):
                    raise PullFailure(f"malformed whiteout {name!r}")
                path = (*where, hidden)
                info = lstat_at(dir_fd, hidden)
                if info is None:
                    return
                if path not in self._upper:
                    remove_at(dir_fd, hidden, path, self._forget)
                elif stat.S_ISDIR(info.st_mode):
                    self._purge_below(path)
        finally:
            os.close(dir_fd)

    def _purge_below(self, top: Parts) -> None:
        """Remove from the directory `top`, and from the directories this layer added below
        it, what the layers below put there; keep what this layer added. An explicit stack:
        the directories of one layer may nest as deep as its names allow."""
        stack = [top]
        while stack:
            here = stack.pop()
            fd = self._root.open_resolved(here)
            if fd is None:
                continue
            try:
                for child in os.listdir(fd):
                    path = (*here, child)
                    info = lstat_at(fd, child)
                    if info is None:
                        continue
                    if path not in self._upper:
                        remove_at(fd, child, path, self._forget)
                    elif stat.S_ISDIR(info.st_mode):
                        stack.append(path)
            finally:
                os.close(fd)

    def _forget(self, path: Parts) -> None:
        self._dirs.pop(path, None)

    def _metadata(self, member: tarfile.TarInfo) -> _DirMetadata:
        mtime = _pax_time(member, "mtime") or int(member.mtime * 1_000_000_000)
        atime = _pax_time(member, "atime") or mtime
        xattrs = {
            key[len("SCHILY.xattr.") :]: value.encode("utf-8", "surrogateescape")
            for key, value in member.pax_headers.items()
            if key.startswith("SCHILY.xattr.")
        }
        return _DirMetadata(member.mode & 0o7777, member.uid, member.gid, (atime, mtime), xattrs)

    def _set_metadata(self, fd: int, meta: _DirMetadata) -> None:
        """Owner first (it clears setuid and setgid), then mode, attributes, times."""
        if self._privileged:
            os.fchown(fd, meta.uid, meta.gid)
        os.fchmod(fd, meta.mode)
        for key, value in meta.xattrs.items():
            _set_xattr(fd, key, value)
        os.utime(fd, ns=meta.times_ns)

    def _set_node_metadata(self, fd: int, member: tarfile.TarInfo) -> None:
        # An O_PATH descriptor: chmod and utime go through its /proc name, which names the
        # node itself (the node was made a moment ago in a directory only we write to).
        meta = self._metadata(member)
        proc = f"/proc/self/fd/{fd}"
        if self._privileged:
            os.chown(proc, meta.uid, meta.gid)
        os.chmod(proc, meta.mode)
        os.utime(proc, ns=meta.times_ns)

    def _set_link_metadata(self, dir_fd: int, name: str, member: tarfile.TarInfo) -> None:
        meta = self._metadata(member)
        if self._privileged:
            os.chown(name, meta.uid, meta.gid, dir_fd=dir_fd, follow_symlinks=False)
        os.utime(name, ns=meta.times_ns, dir_fd=dir_fd, follow_symlinks=False)


def _pax_time(member: tarfile.TarInfo, key: str) -> int | None:
    """A PAX time in nanoseconds, exactly (a float would round it)."""
    text = member.pax_headers.get(key)
    if text is None:
        return None
    try:
        return int(Decimal(text) * 1_000_000_000)
    except (InvalidOperation, ValueError):
        raise PullFailure(f"entry {member.name!r} has an invalid {key}: {text!r}") from None


def _set_xattr(fd: int, key: str, value: bytes) -> None:
    if key in _IGNORED_XATTRS:
        return
    try:
        os.setxattr(fd, key, value)
    except OSError as error:
        # A file system without xattrs, or a namespace we may not write (trusted.* as a user).
        if error.errno not in (errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM, errno.EACCES):
            raise


def _drain(stream: Readable) -> None:
    while stream.read(1 << 20):
        pass
