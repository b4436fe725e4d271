"""Layer decompression, chosen by the stream's first bytes rather than its media type.

Tools have been known to label layers wrongly (a Docker ``tar.gzip`` that is plain tar), and the
magic numbers cannot lie: gzip (``1f 8b``) through the standard library, zstd (``28 b5 2f fd``)
through the optional ``zstandard`` module (the package's ``zstd`` extra), anything else read as
an uncompressed tar, which the tar reader then accepts or refuses.
"""

from __future__ import annotations

import contextlib
import gzip
import importlib
import zlib
from typing import Any, cast

from sandbox._images._digest import Readable
from sandbox._images._errors import PullFailure

_GZIP = b"\x1f\x8b"
_ZSTD = b"\x28\xb5\x2f\xfd"


class _Prefixed:
    """`prefix`, then the rest of `stream`: what was read to sniff is not lost."""

    def __init__(self, prefix: bytes, stream: Readable) -> None:
        self._prefix = prefix
        self._stream = stream

    def read(self, n: int = -1) -> bytes:
        if self._prefix:
            if n < 0:
                data, self._prefix = self._prefix + self._stream.read(), b""
                return data
            data, self._prefix = self._prefix[:n], self._prefix[n:]
            return data
        return self._stream.read(n)

    def readable(self) -> bool:
        return True


def decompressed(stream: Readable) -> Readable:
    """The uncompressed bytes of a layer blob."""
    head = b""
    while len(head) < 4:
        more = stream.read(4 - len(head))
        if not more:
            break
        head += more
    source = _Prefixed(head, stream)
    if head.startswith(_GZIP):
        return gzip.GzipFile(fileobj=cast(Any, source), mode="rb")
    if head.startswith(_ZSTD):
        return _zstd_reader(source)
    return source


def _zstd_reader(source: _Prefixed) -> Readable:
    try:
        zstandard: Any = importlib.import_module("zstandard")
    except ImportError:
        raise PullFailure(
            "a layer is zstd-compressed and the zstandard module is not installed "
            "(install agent-rl-sandbox[zstd])"
        ) from None
    reader: Readable = zstandard.ZstdDecompressor().stream_reader(
        source, read_across_frames=True, closefd=False
    )
    return reader


def decompression_errors() -> tuple[type[Exception], ...]:
    """What a decompressor raises on corrupt input (zstd's only when it is installed)."""
    errors: list[type[Exception]] = [gzip.BadGzipFile, zlib.error, EOFError]
    with contextlib.suppress(ImportError):
        errors.append(importlib.import_module("zstandard").ZstdError)
    return tuple(errors)
