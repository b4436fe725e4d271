"""Images from a registry, over the OCI distribution API (what Docker Hub, GHCR, ECR,
Artifact Registry and Debian's ``docker-registry`` speak).

A pull asks for the manifest by tag or digest, accepting OCI and Docker manifests and indexes;
an index is narrowed to the configured platform; then the config and the layers are fetched
as blobs into the cache (three at a time, the next layers arriving while one unpacks). Each
request goes first to the registry's mirrors, in order, then to the registry: whatever fails
on a mirror (unreachable, missing, refused, a wrong digest) is tried on the next host. Every
manifest and blob is checked against its digest as it streams; a mismatch never enters the
cache.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from sandbox._images._config import ImageCacheConfig, RegistryCredentials
from sandbox._images._digest import Readable, digest_of, parse_digest
from sandbox._images._errors import PullFailure
from sandbox._images._http import Transport, chunks, read_limited
from sandbox._images._manifest import (
    ACCEPT,
    MAX_CONFIG_BYTES,
    MAX_INDEX_DEPTH,
    MAX_MANIFEST_BYTES,
    Descriptor,
    Manifest,
    ResolvedImage,
    choose_platform,
    parse_document,
    parse_image_config,
)
from sandbox._images._reference import Reference
from sandbox._images._store import Store

PARALLEL_BLOBS = 3
_T = TypeVar("_T")


class RegistrySource:
    """The image `reference` names, pulled into `store`."""

    def __init__(self, reference: Reference, config: ImageCacheConfig, store: Store) -> None:
        self.reference = reference
        self._config = config
        self._store = store
        self._transport = Transport(config)
        self._scope = f"repository:{reference.repository}:pull"
        self._cancelled = threading.Event()
        self._pool: ThreadPoolExecutor | None = None
        self._manifest_bytes = b""
        self._downloads: dict[str, Future[Path]] = {}

    # -- Source ------------------------------------------------------------------------------

    def pinned(self) -> list[str]:
        digest = self.reference.digest
        if digest is None:
            return []
        chosen = self._store.recall(digest, self._config.platform)
        return [digest, chosen] if chosen else [digest]

    def resolve(self) -> ResolvedImage:
        data, media_type, digest = self._manifest(self.reference.target)
        document = parse_document(data, media_type)
        for _ in range(MAX_INDEX_DEPTH):
            if isinstance(document, Manifest):
                break
            chosen = choose_platform(document, self._config.platform)
            data, _, digest = self._manifest(chosen.digest)
            document = parse_document(data, chosen.media_type)
        if not isinstance(document, Manifest):
            raise PullFailure(f"indexes nested more than {MAX_INDEX_DEPTH} deep")
        if self.reference.digest and self.reference.digest != digest:
            self._store.remember(self.reference.digest, self._config.platform, digest)
        self._manifest_bytes = data
        config_path = self._blob(document.config, MAX_CONFIG_BYTES)
        info = parse_image_config(config_path.read_bytes(), digest, len(document.layers))
        return ResolvedImage(digest, document, info)

    def keep(self, resolved: ResolvedImage) -> list[str]:
        manifest = resolved.manifest
        self._store.put_blob(
            resolved.digest, len(self._manifest_bytes), iter([self._manifest_bytes])
        )
        return [resolved.digest, manifest.config.digest, *(d.digest for d in manifest.layers)]

    def prefetch(self, layers: tuple[Descriptor, ...]) -> None:
        self._pool = ThreadPoolExecutor(PARALLEL_BLOBS, thread_name_prefix="image-blobs")
        for layer in layers:
            if layer.digest not in self._downloads:
                self._downloads[layer.digest] = self._pool.submit(self._blob, layer, None)

    def open_layer(self, descriptor: Descriptor) -> Readable:
        download = self._downloads.get(descriptor.digest)
        if download is not None:
            download.result()
        else:
            self._blob(descriptor, None)
        return self._store.blob_path(descriptor.digest).open("rb")

    def close(self) -> None:
        self._cancelled.set()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    # -- the protocol ------------------------------------------------------------------------

    def _hosts(self) -> list[str]:
        ref = self.reference
        mirrors = self._config.mirrors.get(ref.registry) or self._config.mirrors.get(ref.api_host)
        return [*(mirrors or ()), ref.api_host]

    def _credentials(self, host: str) -> RegistryCredentials | None:
        if host == self.reference.api_host:
            return self._transport.credentials(host, self.reference.registry)
        return self._transport.credentials(host)

    def _each_host(self, what: str, attempt: Callable[[str], _T]) -> _T:
        """`attempt` on the mirrors then the registry; the first success wins."""
        failures: list[str] = []
        for host in self._hosts():
            try:
                return attempt(host)
            except PullFailure as error:
                failures.append(f"{host}: {error}")
        if len(failures) == 1:
            raise PullFailure(f"{what}: {failures[0]}")
        raise PullFailure(f"{what}: every host failed; " + "; ".join(failures))

    def _manifest(self, target: str) -> tuple[bytes, str | None, str]:
        """(bytes, media type, digest) of the manifest or index at `target`, checked."""
        path = f"/v2/{self.reference.repository}/manifests/{target}"

        def attempt(host: str) -> tuple[bytes, str | None, str]:
            credentials = self._credentials(host)
            with self._transport.open(
                host, path, scope=self._scope, credentials=credentials, headers={"Accept": ACCEPT}
            ) as response:
                data = read_limited(response, MAX_MANIFEST_BYTES, f"manifest {target}")
                media_type = response.headers.get_content_type()
                announced = response.headers.get("Docker-Content-Digest")
            if target.startswith(("sha256:", "sha512:")):
                algorithm, _ = parse_digest(target)
                if digest_of(data, algorithm) != target:
                    raise PullFailure(
                        f"digest mismatch: manifest {target} came as {digest_of(data, algorithm)}"
                    )
                return data, media_type, target
            digest = "sha256:" + hashlib.sha256(data).hexdigest()
            if announced and announced.startswith("sha256:") and announced != digest:
                raise PullFailure(
                    f"digest mismatch: the registry says the manifest is {announced}, "
                    f"its content is {digest}"
                )
            return data, media_type, digest

        return self._each_host(f"manifest {self.reference}", attempt)

    def _blob(self, descriptor: Descriptor, limit: int | None) -> Path:
        """The blob in the cache, downloaded (and checked) unless it is there already."""
        if limit is not None and descriptor.size > limit:
            raise PullFailure(f"blob {descriptor.digest} is too large ({descriptor.size} bytes)")
        if self._store.has_blob(descriptor.digest):
            return self._store.blob_path(descriptor.digest)
        path = f"/v2/{self.reference.repository}/blobs/{descriptor.digest}"

        def attempt(host: str) -> Path:
            credentials = self._credentials(host)
            with self._transport.open(
                host, path, scope=self._scope, credentials=credentials
            ) as response:
                what = f"blob {descriptor.digest}"
                body = chunks(response, what, self._cancelled)
                return self._store.put_blob(descriptor.digest, descriptor.size, body)

        return self._each_host(f"blob {descriptor.digest}", attempt)
