"""The node's image cache on disk: content-addressed, shared by processes, crash-safe.

::

    <root>/blobs/sha256/<hex>        verified blobs pulled from registries
    <root>/images/<hex>/rootfs/      an unpacked root, keyed by its manifest digest
    <root>/images/<hex>/image.json   its configuration, size, blobs; its mtime is its last use
    <root>/resolved/<...>            which manifest a pinned index digest chose for a platform
    <root>/locks/                    <hex>.lease, <hex>.pull, gc
    <root>/tmp/                      downloads and unpacks in progress

Nothing half-made is ever at a final path: a blob is renamed into ``blobs/`` once its digest
checked, an image into ``images/`` once every layer is in. The pull lock of an image
(exclusive) makes one process pull it while the others wait and then use it. Every lease holds
a shared lock on the image's lease file, which eviction must take exclusively, without
waiting, before it removes the image: an image in use is never removed, by any process. Pulls
hold the gc lock shared, and eviction (with the sweep of ``tmp/`` and of blobs no image uses)
runs only when it can take that lock exclusively, so it never takes a blob from under a pull;
when a pull is running it is left to the next acquire.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Protocol

from sandbox._images._config import ImageConfig, Platform
from sandbox._images._digest import Readable, VerifyingReader, parse_digest
from sandbox._images._errors import PullFailure
from sandbox._images._locks import take_lock
from sandbox._images._manifest import Descriptor, ResolvedImage
from sandbox._images._scoped import DIR_FLAGS, disk_usage, remove_tree
from sandbox._images._unpack import Unpacker

_CHUNK = 1 << 20


class Source(Protocol):
    """Where an image comes from: a registry or a layout."""

    def pinned(self) -> list[str]:
        """Manifest digests this image may have, known without asking anyone."""
        ...

    def resolve(self) -> ResolvedImage: ...

    def keep(self, resolved: ResolvedImage) -> list[str]:
        """Store what the cache keeps of this image besides its layers; the digests of all
        the blobs it keeps (none for a layout, which is read where it is)."""
        ...

    def prefetch(self, layers: tuple[Descriptor, ...]) -> None: ...

    def open_layer(self, descriptor: Descriptor) -> Readable: ...

    def close(self) -> None: ...


@dataclass(slots=True)
class HeldImage:
    """An unpacked image and the descriptor that holds its shared lease lock."""

    root: Path
    config: ImageConfig
    lock_fd: int


class Store:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._blobs = root / "blobs"
        self._images = root / "images"
        self._locks = root / "locks"
        self._tmp = root / "tmp"
        self._resolved = root / "resolved"
        _own_directory(root, 0o755)
        for path, mode in (
            (self._blobs, 0o755),
            (self._images, 0o755),
            (self._locks, 0o755),
            (self._tmp, 0o700),
            (self._resolved, 0o755),
        ):
            _own_directory(path, mode)

    # -- images ------------------------------------------------------------------------------

    def acquire(self, source: Source) -> HeldImage:
        """The image `source` names, pulled and unpacked unless the cache has it."""
        for digest in source.pinned():
            if held := self.try_lease(digest):
                return held
        # From the first blob a pull writes to its lease, eviction keeps out of the way.
        gc_fd = take_lock(self._locks / "gc", shared=True)
        assert gc_fd is not None
        try:
            resolved = source.resolve()
            if held := self.try_lease(resolved.digest):
                return held
            pull_fd = take_lock(self._locks / f"{_hex(resolved.digest)}.pull", shared=False)
            assert pull_fd is not None
            try:
                if held := self.try_lease(resolved.digest):
                    return held  # another process pulled it while we waited
                return self._build(source, resolved)
            finally:
                os.close(pull_fd)
        finally:
            os.close(gc_fd)

    def try_lease(self, digest: str) -> HeldImage | None:
        """A lease on the cached image `digest`, or None if the cache does not have it."""
        hex_part = _hex(digest)
        fd = take_lock(self._locks / f"{hex_part}.lease", shared=True)
        assert fd is not None
        image = self._images / hex_part
        try:
            record = json.loads((image / "image.json").read_bytes())
            now = time.time_ns()  # the kernel's own "now" is only as fine as its tick
            os.utime(image / "image.json", ns=(now, now))
        except FileNotFoundError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        return HeldImage(image / "rootfs", _config(record), fd)

    def remember(self, index_digest: str, platform: Platform, digest: str) -> None:
        """Note the manifest a pinned index chose for `platform` (both never change)."""
        _write_atomically(self._resolved / _resolved_name(index_digest, platform), digest.encode())

    def recall(self, index_digest: str, platform: Platform) -> str | None:
        try:
            text = (self._resolved / _resolved_name(index_digest, platform)).read_text()
            parse_digest(text)
        except (OSError, ValueError):
            return None
        return text

    def _build(self, source: Source, resolved: ResolvedImage) -> HeldImage:
        hex_part = _hex(resolved.digest)
        for stale in self._tmp.glob(f"{hex_part}.*"):
            remove_tree(str(stale))  # a dead puller's: only the pull lock's holder makes them
        work = self._tmp / f"{hex_part}.{secrets.token_hex(8)}"
        try:
            work.mkdir(mode=0o700)
            (work / "rootfs").mkdir(mode=0o755)
            root_fd = os.open(work / "rootfs", DIR_FLAGS)
            try:
                unpacker = Unpacker(root_fd)
                layers = resolved.manifest.layers
                source.prefetch(layers)
                for layer, diff_id in zip(layers, resolved.info.diff_ids, strict=True):
                    stream = source.open_layer(layer)
                    try:
                        unpacker.apply(stream, layer.digest, layer.size, diff_id)
                    finally:
                        close = getattr(stream, "close", None)
                        if close:
                            close()
                unpacker.finish()
                size = disk_usage(root_fd)
            finally:
                os.close(root_fd)
            work.chmod(0o755)
            config = resolved.info.config
            record = {
                "digest": resolved.digest,
                "env": dict(config.env),
                "working_dir": str(config.working_dir) if config.working_dir else None,
                "user": config.user,
                "size": size,
                "blobs": source.keep(resolved),
            }
            (work / "image.json").write_text(json.dumps(record, indent=1))
            lease_fd = take_lock(self._locks / f"{hex_part}.lease", shared=True)
            assert lease_fd is not None
            try:
                os.rename(work, self._images / hex_part)
            except BaseException:
                os.close(lease_fd)
                raise
            return HeldImage(self._images / hex_part / "rootfs", config, lease_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                remove_tree(str(work))
            raise

    # -- blobs -------------------------------------------------------------------------------

    def blob_path(self, digest: str) -> Path:
        algorithm, hex_part = parse_digest(digest)
        return self._blobs / algorithm / hex_part

    def has_blob(self, digest: str) -> bool:
        return self.blob_path(digest).is_file()

    def put_blob(self, digest: str, size: int | None, chunks: Iterator[bytes]) -> Path:
        """Write a blob from `chunks`, checking it as it streams; only a blob whose digest
        (and size) check is renamed into the cache."""
        target = self.blob_path(digest)
        target.parent.mkdir(mode=0o755, exist_ok=True)
        temporary = self._tmp / f"blob-{_hex(digest)[:16]}.{secrets.token_hex(8)}"
        try:
            with temporary.open("xb") as file:
                reader = VerifyingReader(_ChunkReader(chunks), digest, size)
                while data := reader.read(_CHUNK):
                    file.write(data)
                reader.verify()
                file.flush()
                os.fsync(file.fileno())
            os.rename(temporary, target)
        finally:
            temporary.unlink(missing_ok=True)
        return target

    # -- eviction ----------------------------------------------------------------------------

    def sweep(self, max_bytes: int | None) -> None:
        """Tidy up, and evict least-recently-used images not in use until the cache fits
        `max_bytes`; skipped (left to a later acquire) while any pull is running."""
        gc_fd = take_lock(self._locks / "gc", shared=False, wait=False)
        if gc_fd is None:
            return
        try:
            for entry in list(self._tmp.iterdir()):
                remove_tree(str(entry))  # no pull is running: all of it is left over
            images = self._list_images()
            blob_sizes = self._blob_sizes()
            needed = {blob for image in images for blob in image.blobs}
            for blob in set(blob_sizes) - needed:
                self.blob_path(blob).unlink(missing_ok=True)
                del blob_sizes[blob]
            total = sum(i.size for i in images) + sum(blob_sizes.values())
            if max_bytes is None or total <= max_bytes:
                return
            for image in sorted(images, key=lambda i: i.last_used):
                if total <= max_bytes:
                    break
                if not self._evict(image.digest):
                    continue
                images.remove(image)
                total -= image.size
                still_needed = {blob for other in images for blob in other.blobs}
                for blob in set(image.blobs) - still_needed:
                    if blob in blob_sizes:
                        self.blob_path(blob).unlink(missing_ok=True)
                        total -= blob_sizes.pop(blob)
        finally:
            os.close(gc_fd)

    def _evict(self, digest: str) -> bool:
        hex_part = _hex(digest)
        lease_path = self._locks / f"{hex_part}.lease"
        fd = take_lock(lease_path, shared=False, wait=False)
        if fd is None:
            return False  # in use, here or in another process
        try:
            doomed = self._tmp / f"evicted-{hex_part}.{secrets.token_hex(8)}"
            os.rename(self._images / hex_part, doomed)  # gone at once, then removed
            remove_tree(str(doomed))
            lease_path.unlink(missing_ok=True)
        finally:
            os.close(fd)
        pull_path = self._locks / f"{hex_part}.pull"
        pull_fd = take_lock(pull_path, shared=False, wait=False)
        if pull_fd is not None:
            pull_path.unlink(missing_ok=True)
            os.close(pull_fd)
        return True

    def _list_images(self) -> list[_Cached]:
        images = []
        for entry in self._images.iterdir():
            try:
                record_path = entry / "image.json"
                record = json.loads(record_path.read_bytes())
                images.append(
                    _Cached(
                        digest=record["digest"],
                        size=int(record["size"]),
                        blobs=tuple(record["blobs"]),
                        last_used=record_path.stat().st_mtime_ns,
                    )
                )
            except (OSError, ValueError, KeyError, TypeError):
                continue  # just evicted by another process, or not ours
        return images

    def _blob_sizes(self) -> dict[str, int]:
        sizes = {}
        for algorithm_dir in self._blobs.iterdir():
            for blob in algorithm_dir.iterdir():
                with contextlib.suppress(OSError):
                    sizes[f"{algorithm_dir.name}:{blob.name}"] = blob.stat().st_blocks * 512
        return sizes

    def usage(self) -> int:
        """Bytes the cache holds: unpacked images as recorded, plus blobs."""
        return sum(i.size for i in self._list_images()) + sum(self._blob_sizes().values())


@dataclass(frozen=True, slots=True)
class _Cached:
    digest: str
    size: int
    blobs: tuple[str, ...]
    last_used: int


class _ChunkReader:
    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buffer = b""

    def read(self, n: int = -1) -> bytes:
        while n < 0 or len(self._buffer) < n:
            chunk = next(self._chunks, None)
            if chunk is None:
                break
            self._buffer += chunk
        if n < 0:
            data, self._buffer = self._buffer, b""
        else:
            data, self._buffer = self._buffer[:n], self._buffer[n:]
        return data


def _config(record: dict[str, object]) -> ImageConfig:
    env = record.get("env")
    working_dir = record.get("working_dir")
    user = record.get("user")
    return ImageConfig(
        digest=str(record["digest"]),
        env={str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {},
        working_dir=PurePosixPath(working_dir) if isinstance(working_dir, str) else None,
        user=user if isinstance(user, str) else None,
    )


def _hex(digest: str) -> str:
    algorithm, hex_part = parse_digest(digest)
    return hex_part if algorithm == "sha256" else f"{algorithm}-{hex_part}"


def _resolved_name(index_digest: str, platform: Platform) -> str:
    slug = "-".join(p for p in (platform.os, platform.architecture, platform.variant) if p)
    return f"{_hex(index_digest)}.{slug.replace('/', '_')}"


def _write_atomically(path: Path, data: bytes) -> None:
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    temporary.write_bytes(data)
    os.rename(temporary, path)


def _own_directory(path: Path, mode: int) -> None:
    """A real directory (never a planted link), made with `mode` if missing, owned by us or
    root and writable by nobody else: the cache trusts what it finds in it."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=mode, parents=path.parent != path)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise PullFailure(f"image cache: {path} is not a directory")
    if info.st_uid not in (os.geteuid(), 0) or info.st_mode & 0o022:
        raise PullFailure(
            f"image cache: {path} must belong to this user (or root) and be writable only by it"
        )
