"""The one error an image acquire raises, and the internal failure it is built from.

Code deep in a pull knows what failed (a digest, a status code) but not which image the caller
asked for; it raises `PullFailure` with the reason, and the cache names the image once, at the
top, in the `ImagePullError` the caller sees.
"""

from __future__ import annotations

from sandbox._errors import SandboxError


class ImagePullError(SandboxError):
    """An image could not be pulled or unpacked: not found, unauthorized, a digest mismatch,
    no manifest for the platform, a malformed layer, the network. `image` names what was asked
    for and `reason` says what failed."""

    def __init__(self, image: str, reason: str) -> None:
        super().__init__(f"cannot get image {image}: {reason}")
        self.image = image
        self.reason = reason


class PullFailure(Exception):
    """Why a pull failed, before the cache names the image (never leaves the subpackage)."""
