"""Container images for the local backend: pulled or read, unpacked once per node, shared.

`ImageCache.acquire` turns a `RegistryImage` or an `OciLayoutImage` into a root directory on
the host and an `ImageConfig`, under an `ImageLease` that keeps it from eviction. See
docs/images.md for the cache on disk, the registry protocol and the unpack rules.
"""

from sandbox._images._cache import ImageCache, ImageLease
from sandbox._images._config import (
    ImageCacheConfig,
    ImageConfig,
    Platform,
    RegistryCredentials,
    host_platform,
)
from sandbox._images._errors import ImagePullError

__all__ = [
    "ImageCache",
    "ImageCacheConfig",
    "ImageConfig",
    "ImageLease",
    "ImagePullError",
    "Platform",
    "RegistryCredentials",
    "host_platform",
]
