"""What the image cache is told (`ImageCacheConfig`) and what it tells back (`ImageConfig`)."""

from __future__ import annotations

import os
import platform as _platform
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from types import MappingProxyType


@dataclass(frozen=True, slots=True)
class Platform:
    """An OCI platform: what an image index's entries are chosen by."""

    os: str
    architecture: str
    variant: str | None = None

    @classmethod
    def parse(cls, text: str) -> Platform:
        """``os/architecture[/variant]``, as Docker's ``--platform`` takes it."""
        parts = text.split("/")
        if len(parts) not in (2, 3) or not all(parts):
            raise ValueError(f"a platform is os/architecture[/variant]: {text!r}")
        return cls(parts[0], parts[1], parts[2] if len(parts) == 3 else None)

    def __str__(self) -> str:
        return "/".join(p for p in (self.os, self.architecture, self.variant) if p)


# uname's machine names, in Go's GOARCH spelling (the one image indexes use).
_ARCHITECTURES: Mapping[str, tuple[str, str | None]] = {
    "x86_64": ("amd64", None),
    "amd64": ("amd64", None),
    "aarch64": ("arm64", "v8"),
    "arm64": ("arm64", "v8"),
    "armv7l": ("arm", "v7"),
    "armv6l": ("arm", "v6"),
    "i386": ("386", None),
    "i686": ("386", None),
    "ppc64le": ("ppc64le", None),
    "s390x": ("s390x", None),
    "riscv64": ("riscv64", None),
}


def host_platform() -> Platform:
    """The platform of this host: linux/amd64 on x86_64, linux/arm64/v8 on aarch64, ..."""
    machine = _platform.machine().lower()
    architecture, variant = _ARCHITECTURES.get(machine, (machine, None))
    return Platform("linux", architecture, variant)


@dataclass(frozen=True, slots=True)
class RegistryCredentials:
    """A user name and password (or token) for one registry host."""

    username: str
    password: str = field(repr=False)


@dataclass(frozen=True, slots=True)
class ImageCacheConfig:
    """Where a node keeps its images and how it reaches registries.

    `root` may be shared by every process of the node (rollout workers): they pull each image
    once between them and never evict one another's images in use. Hosts are ``host[:port]``
    as references spell them; Docker Hub may be named ``docker.io`` or
    ``registry-1.docker.io``.
    """

    root: Path
    max_bytes: int | None = None
    """Size cap of the cache: past it, after an acquire, the least recently used unpacked
    images (and blobs only they use) are evicted. An image in use is never evicted, so the
    cache may stay above the cap while leases hold it."""
    mirrors: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Registry host -> mirror hosts tried first, in order; then the registry itself."""
    credentials: Mapping[str, RegistryCredentials] = field(default_factory=dict)
    """Registry (or mirror) host -> credentials, for its token endpoint or basic auth."""
    plain_http: tuple[str, ...] = ()
    """Hosts spoken to over plain HTTP (a registry on loopback); every other one over HTTPS."""
    platform: Platform = field(default_factory=host_platform)
    """What an image index is resolved to."""
    timeout: float = 60.0
    """Seconds any one request may stay silent (connect, or between two reads)."""

    def __post_init__(self) -> None:
        if self.max_bytes is not None and self.max_bytes < 0:
            raise ValueError(f"ImageCacheConfig.max_bytes must be >= 0: {self.max_bytes}")
        if not self.timeout > 0:
            raise ValueError(f"ImageCacheConfig.timeout must be positive: {self.timeout}")
        mirrors = {host: tuple(hosts) for host, hosts in self.mirrors.items()}
        object.__setattr__(self, "mirrors", MappingProxyType(mirrors))
        object.__setattr__(self, "credentials", MappingProxyType(dict(self.credentials)))
        object.__setattr__(self, "plain_http", tuple(self.plain_http))
        object.__setattr__(self, "root", Path(os.path.abspath(self.root)))


@dataclass(frozen=True, slots=True)
class ImageConfig:
    """What the image's configuration says, for the sandbox that runs on it."""

    digest: str
    """The image manifest's digest (``sha256:...``): the image's identity in the cache."""
    env: Mapping[str, str] = field(default_factory=dict)
    working_dir: PurePosixPath | None = None
    user: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))
