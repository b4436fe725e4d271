"""Content digests, checked on every byte as it streams past.

A blob is trusted only once the bytes read hash to the digest its descriptor named, so readers
wrap each stream in `VerifyingReader`: it hashes and counts as it goes, refuses a stream longer
than the declared size before reading past it, and `verify()` says whether all was well.
"""

from __future__ import annotations

import hashlib
import re
from typing import Protocol

from sandbox._images._errors import PullFailure


class Readable(Protocol):
    """A binary stream, as far as reading goes."""

    def read(self, n: int = -1, /) -> bytes: ...


_DIGEST = re.compile(r"^(sha256:[a-f0-9]{64}|sha512:[a-f0-9]{128})$")


def parse_digest(digest: str) -> tuple[str, str]:
    """(algorithm, hex) of a sha256 or sha512 digest; ValueError for anything else (a digest
    names a file in the cache and in a layout: only these exact forms are safe)."""
    if not _DIGEST.match(digest):
        raise ValueError(f"not a sha256 or sha512 digest: {digest[:150]!r}")
    algorithm, _, hex_part = digest.partition(":")
    return algorithm, hex_part


def digest_of(data: bytes, algorithm: str = "sha256") -> str:
    return f"{algorithm}:{hashlib.new(algorithm, data).hexdigest()}"


class VerifyingReader:
    """A read-only stream over `source` that must hash to `digest` and, when `size` is known,
    hold exactly `size` bytes."""

    def __init__(self, source: Readable, digest: str, size: int | None) -> None:
        algorithm, _ = parse_digest(digest)
        self._source = source
        self._hash = hashlib.new(algorithm)
        self.digest = digest
        self.size = size
        self.count = 0

    def read(self, n: int = -1) -> bytes:
        if self.size is not None:
            left = self.size - self.count
            # One byte more than declared is enough to know the stream is too long.
            n = left + 1 if n < 0 else min(n, left + 1)
        data = self._source.read(n)
        self.count += len(data)
        if self.size is not None and self.count > self.size:
            raise PullFailure(f"blob {self.digest} is longer than its declared {self.size} bytes")
        self._hash.update(data)
        return data

    def readable(self) -> bool:
        return True

    def verify(self) -> None:
        """Raise `PullFailure` naming the digest unless the bytes read are the blob."""
        if self.size is not None and self.count != self.size:
            raise PullFailure(
                f"blob {self.digest} ended after {self.count} of its {self.size} bytes"
            )
        actual = f"{self._hash.name}:{self._hash.hexdigest()}"
        if actual != self.digest:
            raise PullFailure(f"digest mismatch: expected {self.digest}, the content is {actual}")
