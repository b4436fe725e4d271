"""Image references parsed the way Docker reads them.

``python:3.11`` is ``docker.io/library/python:3.11``; the first component names a registry only
when it looks like a host (it has a dot or a port, or is ``localhost``); no tag means
``latest``; a digest (``@sha256:...``) pins the manifest, and a tag beside it is only a label.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sandbox._images._digest import parse_digest
from sandbox._images._errors import PullFailure

DOCKER_HUB = "docker.io"
"""How references name Docker Hub; its API is served by `DOCKER_HUB_API`."""
DOCKER_HUB_API = "registry-1.docker.io"

_HOST = re.compile(
    r"^(?:\[[0-9A-Fa-f:]+\]|[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*)(?::[0-9]+)?$"
)
_COMPONENT = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


@dataclass(frozen=True, slots=True)
class Reference:
    """A parsed reference: `registry` as references name it (``docker.io``), `repository`
    (``library/python``), and a `tag` or a `digest` (a digest wins when both are given)."""

    registry: str
    repository: str
    tag: str | None
    digest: str | None

    @property
    def api_host(self) -> str:
        """The host that serves the registry's API."""
        return DOCKER_HUB_API if self.registry == DOCKER_HUB else self.registry

    @property
    def target(self) -> str:
        """What the manifest is fetched by: the digest, else the tag."""
        return self.digest or self.tag or "latest"

    def __str__(self) -> str:
        text = f"{self.registry}/{self.repository}"
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text


def parse_reference(text: str) -> Reference:
    """Parse ``[host[:port]/]repository[:tag][@digest]``; raises `PullFailure` if invalid."""
    name, _, digest = text.partition("@")
    if digest:
        try:
            parse_digest(digest)
        except ValueError as error:
            raise PullFailure(f"invalid reference {text!r}: {error}") from None
    slash = name.rfind("/")
    colon = name.rfind(":")
    tag: str | None = None
    if colon > slash:
        name, tag = name[:colon], name[colon + 1 :]
        if not _TAG.match(tag):
            raise PullFailure(f"invalid reference {text!r}: bad tag {tag!r}")
    first, sep, rest = name.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        registry, repository = first, rest
    else:
        registry, repository = DOCKER_HUB, name
    if registry == "index.docker.io":
        registry = DOCKER_HUB
    if registry == DOCKER_HUB and "/" not in repository:
        repository = f"library/{repository}"
    if not _HOST.match(registry):
        raise PullFailure(f"invalid reference {text!r}: bad registry host {registry!r}")
    if not repository or not all(_COMPONENT.match(c) for c in repository.split("/")):
        raise PullFailure(
            f"invalid reference {text!r}: bad repository {repository!r} "
            "(lowercase letters, digits and separators only)"
        )
    if tag is None and not digest:
        tag = "latest"
    return Reference(registry, repository, tag, digest or None)
