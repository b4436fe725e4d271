"""Manifests, indexes and image configurations: parsed strictly, trusted only as far as needed.

Everything here comes from a registry or a layout we do not control, so each field is checked
for its type before use, digests are validated before they name a file, and anything this
cache cannot run (schema 1 manifests, artifacts that are not container images, unknown layer
types) is refused with a reason rather than half understood.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from sandbox._images._config import ImageConfig, Platform
from sandbox._images._digest import parse_digest
from sandbox._images._errors import PullFailure

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
INDEX_TYPES = frozenset({OCI_INDEX, DOCKER_LIST})
MANIFEST_TYPES = frozenset({OCI_MANIFEST, DOCKER_MANIFEST})
ACCEPT = ", ".join((OCI_INDEX, OCI_MANIFEST, DOCKER_LIST, DOCKER_MANIFEST))
"""What a manifest request accepts: both indexes, both manifests."""

CONFIG_TYPES = frozenset(
    {"application/vnd.oci.image.config.v1+json", "application/vnd.docker.container.image.v1+json"}
)
LAYER_TYPES = frozenset(
    {
        "application/vnd.oci.image.layer.v1.tar",
        "application/vnd.oci.image.layer.v1.tar+gzip",
        "application/vnd.oci.image.layer.v1.tar+zstd",
        "application/vnd.oci.image.layer.nondistributable.v1.tar",
        "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
        "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd",
        "application/vnd.docker.image.rootfs.diff.tar",
        "application/vnd.docker.image.rootfs.diff.tar.gzip",
        "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip",
    }
)
REF_NAME = "org.opencontainers.image.ref.name"

MAX_INDEX_DEPTH = 8
"""Indexes nested deeper than this are refused (a loop of indexes would never end)."""
MAX_MANIFEST_BYTES = 4 << 20
"""Largest manifest or index read (the limit registries apply to what they accept)."""
MAX_CONFIG_BYTES = 64 << 20


@dataclass(frozen=True, slots=True)
class Descriptor:
    media_type: str
    digest: str
    size: int
    platform: Platform | None = None
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Manifest:
    config: Descriptor
    layers: tuple[Descriptor, ...]


@dataclass(frozen=True, slots=True)
class Index:
    manifests: tuple[Descriptor, ...]


def parse_document(data: bytes, media_type: str | None = None) -> Manifest | Index:
    """An index or an image manifest; `media_type` is what the transport said (the document's
    own ``mediaType`` wins; without either, its shape decides)."""
    document = _json_object(data, "manifest")
    kind = document.get("mediaType") or media_type
    if isinstance(kind, str) and kind.startswith("application/vnd.docker.distribution.manifest.v1"):
        raise PullFailure("schema 1 manifests are not supported (re-push the image)")
    if kind in INDEX_TYPES or (kind not in MANIFEST_TYPES and "manifests" in document):
        entries = _list(document, "manifests")
        return Index(tuple(_descriptor(entry) for entry in entries))
    if kind in MANIFEST_TYPES or "layers" in document:
        config = _descriptor(document.get("config"))
        if config.media_type not in CONFIG_TYPES:
            raise PullFailure(f"not a container image: its config is a {config.media_type!r}")
        layers = tuple(_descriptor(layer) for layer in _list(document, "layers"))
        for layer in layers:
            if layer.media_type not in LAYER_TYPES:
                raise PullFailure(f"layer {layer.digest} has unsupported type {layer.media_type}")
        return Manifest(config, layers)
    raise PullFailure(f"not a manifest or an index (media type {kind!r})")


def choose_platform(index: Index, wanted: Platform) -> Descriptor:
    """The entry of `index` for `wanted`: os and architecture equal, variants equal once
    defaults are filled in (arm64 is v8, arm is v7); without a wanted variant, an entry
    without one is preferred, then the first. Without a match, a nested index that names no
    platform (to be searched in turn)."""
    candidates = [d for d in index.manifests if d.platform and _matches(d.platform, wanted)]
    if candidates:
        candidates.sort(key=lambda d: bool(d.platform and d.platform.variant))
        return candidates[0]
    # An index may group its platforms in nested indexes that carry no platform themselves.
    nested = [d for d in index.manifests if d.platform is None and d.media_type in INDEX_TYPES]
    if nested:
        return nested[0]
    offered = sorted({str(d.platform) for d in index.manifests if d.platform})
    raise PullFailure(
        f"no manifest for platform {wanted} in the index (it has: {', '.join(offered) or 'none'})"
    )


def _matches(have: Platform, wanted: Platform) -> bool:
    if (have.os, have.architecture) != (wanted.os, wanted.architecture):
        return False
    if wanted.variant is None:
        return True
    return _variant(have) == _variant(wanted)


def _variant(platform: Platform) -> str | None:
    defaults = {"arm64": "v8", "arm": "v7"}
    return platform.variant or defaults.get(platform.architecture)


@dataclass(frozen=True, slots=True)
class ImageInfo:
    """An image configuration: what the sandbox needs and the layers' uncompressed digests."""

    config: ImageConfig
    diff_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ResolvedImage:
    """An image found and checked: its manifest's digest, the manifest, its configuration."""

    digest: str
    manifest: Manifest
    info: ImageInfo


def parse_image_config(data: bytes, manifest_digest: str, layer_count: int) -> ImageInfo:
    document = _json_object(data, "image config")
    section = document.get("config") or {}
    if not isinstance(section, dict):
        raise PullFailure("image config: 'config' is not an object")
    env: dict[str, str] = {}
    for item in section.get("Env") or []:
        if not isinstance(item, str):
            raise PullFailure("image config: an Env entry is not a string")
        name, sep, value = item.partition("=")
        if not sep or not name or "\0" in item:
            raise PullFailure(f"image config: invalid Env entry {item[:100]!r}")
        env[name] = value
    working_dir = section.get("WorkingDir") or None
    user = section.get("User") or None
    if working_dir is not None and not isinstance(working_dir, str):
        raise PullFailure("image config: WorkingDir is not a string")
    if user is not None and not isinstance(user, str):
        raise PullFailure("image config: User is not a string")
    rootfs = document.get("rootfs")
    diff_ids = rootfs.get("diff_ids") if isinstance(rootfs, dict) else None
    if not isinstance(diff_ids, list):
        raise PullFailure("image config: rootfs.diff_ids is not a list")
    for diff_id in diff_ids:
        _digest_field(diff_id, "diff_id")
    if len(diff_ids) != layer_count:
        raise PullFailure(
            f"image config lists {len(diff_ids)} layer digests (diff_ids) for {layer_count} layers"
        )
    path = PurePosixPath(working_dir) if working_dir else None
    config = ImageConfig(digest=manifest_digest, env=env, working_dir=path, user=user)
    return ImageInfo(config, tuple(diff_ids))


def _json_object(data: bytes, what: str) -> dict[str, Any]:
    try:
        document = json.loads(data)
    except (ValueError, UnicodeDecodeError) as error:
        raise PullFailure(f"{what} is not valid JSON: {error}") from None
    if not isinstance(document, dict):
        raise PullFailure(f"{what} is not a JSON object")
    return document


def _list(document: dict[str, Any], key: str) -> list[Any]:
    value = document.get(key)
    if not isinstance(value, list):
        raise PullFailure(f"manifest: {key!r} is not a list")
    return value


def _digest_field(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise PullFailure(f"manifest: a {what} is not a string")
    try:
        parse_digest(value)
    except ValueError as error:
        raise PullFailure(f"manifest: {error}") from None
    return value


def _descriptor(value: object) -> Descriptor:
    if not isinstance(value, dict):
        raise PullFailure("manifest: a descriptor is not an object")
    media_type = value.get("mediaType")
    size = value.get("size")
    if not isinstance(media_type, str):
        raise PullFailure("manifest: a descriptor has no mediaType")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise PullFailure("manifest: a descriptor has no valid size")
    digest = _digest_field(value.get("digest"), "digest")
    platform = None
    if isinstance(raw := value.get("platform"), dict):
        os_name, arch, variant = raw.get("os"), raw.get("architecture"), raw.get("variant")
        if isinstance(os_name, str) and isinstance(arch, str):
            platform = Platform(os_name, arch, variant if isinstance(variant, str) else None)
    raw_annotations = value.get("annotations")
    annotations = (
        {k: v for k, v in raw_annotations.items() if isinstance(v, str)}
        if isinstance(raw_annotations, dict)
        else {}
    )
    return Descriptor(media_type, digest, size, platform, annotations)
