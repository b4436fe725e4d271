"""Test images built by the tests themselves: tar layers entry by entry, OCI layouts around them.

Layers are written with Python's tarfile (PAX format, so long names, large ids, exact times and
xattrs survive) and gzip, zstd or nothing; the layout is what ``umoci`` and ``skopeo`` read.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MTIME = 1_700_000_000
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass
class Entry:
    """One tar entry: a `tarfile.TarInfo` and, for a regular file, its content."""

    info: tarfile.TarInfo
    data: bytes | None = None


def _info(name: str, kind: bytes, mode: int, uid: int, gid: int, mtime: float) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.uid, info.gid = uid, gid
    info.mtime = mtime
    return info


def file(
    name: str,
    data: bytes = b"",
    *,
    mode: int = 0o644,
    uid: int = 0,
    gid: int = 0,
    mtime: float = MTIME,
    xattrs: dict[str, str] | None = None,
) -> Entry:
    info = _info(name, tarfile.REGTYPE, mode, uid, gid, mtime)
    info.size = len(data)
    if xattrs:
        info.pax_headers = {f"SCHILY.xattr.{k}": v for k, v in xattrs.items()}
    return Entry(info, data)


def directory(
    name: str, *, mode: int = 0o755, uid: int = 0, gid: int = 0, mtime: float = MTIME
) -> Entry:
    return Entry(_info(name, tarfile.DIRTYPE, mode, uid, gid, mtime))


def symlink(name: str, target: str, *, uid: int = 0, gid: int = 0, mtime: float = MTIME) -> Entry:
    info = _info(name, tarfile.SYMTYPE, 0o777, uid, gid, mtime)
    info.linkname = target
    return Entry(info)


def hardlink(name: str, target: str) -> Entry:
    info = _info(name, tarfile.LNKTYPE, 0o644, 0, 0, MTIME)
    info.linkname = target
    return Entry(info)


def whiteout(path: str) -> Entry:
    parent, _, name = path.rpartition("/")
    return file(f"{parent}/.wh.{name}" if parent else f".wh.{name}")


def opaque(directory_path: str) -> Entry:
    return file(f"{directory_path}/.wh..wh..opq")


def fifo(name: str, *, mode: int = 0o644) -> Entry:
    return Entry(_info(name, tarfile.FIFOTYPE, mode, 0, 0, MTIME))


def char_device(name: str, major: int, minor: int, *, mode: int = 0o666) -> Entry:
    info = _info(name, tarfile.CHRTYPE, mode, 0, 0, MTIME)
    info.devmajor, info.devminor = major, minor
    return Entry(info)


def tar_bytes(entries: list[Entry]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in entries:
            tar.addfile(entry.info, io.BytesIO(entry.data) if entry.data is not None else None)
    return buffer.getvalue()


def compress(tar: bytes, compression: str) -> tuple[bytes, str]:
    """(blob, media type) of a tar layer."""
    if compression == "gzip":
        return gzip.compress(tar, mtime=0), OCI_LAYER + "+gzip"
    if compression == "zstd":
        import zstandard

        return zstandard.ZstdCompressor().compress(tar), OCI_LAYER + "+zstd"
    return tar, OCI_LAYER


@dataclass
class Layout:
    """An OCI image layout being written at `path`."""

    path: Path
    index: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        (self.path / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
        (self.path / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
        self.save()

    def blob(self, data: bytes) -> str:
        digest = sha256(data)
        (self.path / "blobs" / "sha256" / digest.removeprefix("sha256:")).write_bytes(data)
        return digest

    def descriptor(self, data: bytes, media_type: str, **extra: Any) -> dict[str, Any]:
        return {"mediaType": media_type, "digest": self.blob(data), "size": len(data), **extra}

    def image(
        self,
        layers: list[list[Entry]],
        *,
        compression: str = "gzip",
        config: dict[str, Any] | None = None,
        architecture: str = "amd64",
        variant: str | None = None,
        diff_ids: list[str] | None = None,
    ) -> dict[str, Any]:
        """An image manifest over `layers`; its descriptor (with platform)."""
        layer_descriptors, computed = [], []
        for entries in layers:
            tar = tar_bytes(entries)
            blob, media_type = compress(tar, compression)
            layer_descriptors.append(self.descriptor(blob, media_type))
            computed.append(sha256(tar))
        platform = {"os": "linux", "architecture": architecture}
        if variant:
            platform["variant"] = variant
        image_config = {
            **platform,
            "config": config or {},
            "rootfs": {"type": "layers", "diff_ids": diff_ids or computed},
            "history": [{"created_by": "tests"} for _ in layers],
        }
        manifest = {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": self.descriptor(json.dumps(image_config).encode(), OCI_CONFIG),
            "layers": layer_descriptors,
        }
        return self.descriptor(json.dumps(manifest).encode(), OCI_MANIFEST, platform=platform)

    def image_index(self, manifests: list[dict[str, Any]]) -> dict[str, Any]:
        index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests}
        return self.descriptor(json.dumps(index).encode(), OCI_INDEX)

    def tag(self, descriptor: dict[str, Any], ref: str | None) -> dict[str, Any]:
        entry = dict(descriptor)
        entry.pop("platform", None) if entry["mediaType"] == OCI_INDEX else None
        if ref is not None:
            entry["annotations"] = {"org.opencontainers.image.ref.name": ref}
        self.index.append(entry)
        self.save()
        return entry

    def save(self) -> None:
        index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": self.index}
        (self.path / "index.json").write_text(json.dumps(index))


def build(path: Path, ref: str, layers: list[list[Entry]], **options: Any) -> str:
    """A layout at `path` holding one image named `ref`; returns its manifest digest."""
    layout = Layout(path)
    descriptor = layout.image(layers, **options)
    layout.tag(descriptor, ref)
    return str(descriptor["digest"])
