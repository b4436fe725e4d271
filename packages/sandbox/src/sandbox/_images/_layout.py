"""Images from an OCI image layout on the host (``oci-layout``, ``index.json``, ``blobs/``).

The layout is read where it is: no blob is copied into the cache. Each manifest, index and
config is checked against its digest when read, and each layer as it is unpacked, so a layout
that changed on disk fails the same way a tampered registry would.
"""

from __future__ import annotations

import json
from collections import deque
from pathlib import Path

from sandbox._images._config import Platform
from sandbox._images._digest import Readable, VerifyingReader, parse_digest
from sandbox._images._errors import PullFailure
from sandbox._images._manifest import (
    MAX_CONFIG_BYTES,
    MAX_INDEX_DEPTH,
    MAX_MANIFEST_BYTES,
    REF_NAME,
    Descriptor,
    Index,
    Manifest,
    ResolvedImage,
    choose_platform,
    parse_document,
    parse_image_config,
)


class LayoutSource:
    """The image `ref` names in the layout at `path` (or its only image), for `platform`."""

    def __init__(self, path: Path, ref: str | None, platform: Platform) -> None:
        self.path = path
        self.ref = ref
        self.platform = platform

    def pinned(self) -> list[str]:
        return []  # reading the layout's index is cheap, and it may have changed

    def keep(self, resolved: ResolvedImage) -> list[str]:
        return []

    def prefetch(self, layers: tuple[Descriptor, ...]) -> None:
        pass

    def close(self) -> None:
        pass

    def resolve(self) -> ResolvedImage:
        marker = self.path / "oci-layout"
        try:
            version = json.loads(marker.read_bytes()).get("imageLayoutVersion")
        except (OSError, ValueError, AttributeError):
            raise PullFailure(
                f"{self.path} is not an OCI image layout (no valid oci-layout)"
            ) from None
        if not isinstance(version, str) or not version.startswith("1."):
            raise PullFailure(f"{self.path}: unsupported image layout version {version!r}")
        try:
            top = parse_document((self.path / "index.json").read_bytes(), None)
        except OSError as error:
            raise PullFailure(f"{self.path}: cannot read index.json: {error}") from None
        if not isinstance(top, Index):
            raise PullFailure(f"{self.path}: index.json is not an image index")
        descriptor = self._pick(top)
        for _ in range(MAX_INDEX_DEPTH):
            document = self._document(descriptor)
            if isinstance(document, Manifest):
                config = self._read(descriptor=document.config, limit=MAX_CONFIG_BYTES)
                info = parse_image_config(config, descriptor.digest, len(document.layers))
                return ResolvedImage(descriptor.digest, document, info)
            descriptor = choose_platform(document, self.platform)
        raise PullFailure(f"indexes nested more than {MAX_INDEX_DEPTH} deep")

    def open_layer(self, descriptor: Descriptor) -> Readable:
        """The layer blob's bytes, unchecked: the unpacker verifies them as it reads."""
        try:
            return self._blob_path(descriptor.digest).open("rb")
        except FileNotFoundError:
            raise PullFailure(f"{self.path} has no blob {descriptor.digest}") from None

    def _pick(self, top: Index) -> Descriptor:
        if self.ref is None:
            if len(top.manifests) != 1:
                raise PullFailure(
                    f"{self.path} holds {len(top.manifests)} images; name one of "
                    f"{_refs(top) or 'them'} (OciLayoutImage.ref)"
                )
            return top.manifests[0]
        # The ref names entries of index.json, or of an index nested in it.
        queue: deque[tuple[Index, int]] = deque([(top, 0)])
        while queue:
            index, depth = queue.popleft()
            named = [d for d in index.manifests if d.annotations.get(REF_NAME) == self.ref]
            if len(named) == 1:
                return named[0]
            if named:
                return choose_platform(Index(tuple(named)), self.platform)
            if depth < MAX_INDEX_DEPTH:
                for descriptor in index.manifests:
                    if _is_index(descriptor):
                        nested = self._document(descriptor)
                        if isinstance(nested, Index):
                            queue.append((nested, depth + 1))
        raise PullFailure(f"{self.path} has no image named {self.ref!r} (it has {_refs(top)})")

    def _document(self, descriptor: Descriptor) -> Manifest | Index:
        data = self._read(descriptor, MAX_MANIFEST_BYTES)
        return parse_document(data, descriptor.media_type)

    def _read(self, descriptor: Descriptor, limit: int) -> bytes:
        if descriptor.size > limit:
            raise PullFailure(f"blob {descriptor.digest} is too large ({descriptor.size} bytes)")
        path = self._blob_path(descriptor.digest)
        try:
            with path.open("rb") as file:
                reader = VerifyingReader(file, descriptor.digest, descriptor.size)
                data = reader.read()
                reader.verify()
        except FileNotFoundError:
            raise PullFailure(f"{self.path} has no blob {descriptor.digest}") from None
        return data

    def _blob_path(self, digest: str) -> Path:
        algorithm, hex_part = parse_digest(digest)
        return self.path / "blobs" / algorithm / hex_part


def _is_index(descriptor: Descriptor) -> bool:
    return descriptor.media_type.endswith(("image.index.v1+json", "manifest.list.v2+json"))


def _refs(index: Index) -> str:
    names = sorted({d.annotations[REF_NAME] for d in index.manifests if REF_NAME in d.annotations})
    return ", ".join(repr(n) for n in names) or "no named images"
