"""Where a request's CPU-bound work runs: never on the event loop, and never several huge ones
fighting the event loop for the GIL at once.

Decoding a body and rendering its prompt run on worker threads, started with the server (a thread
born during a burst has to win the GIL from the busy ones before it can even start, and the event
loop waits for it meanwhile). A body larger than :attr:`LargeBodies.threshold` is different:
parsing 20 MB of JSON holds the GIL for ~40 ms in one C call and rendering it makes several 20 MB
copies, so a few of those on parallel threads keep the event loop from the GIL for hundreds of
milliseconds and every other session stalls. Large bodies therefore take turns on one thread of
their own, and their JSON is parsed in steps (``body.loads_in_steps``), so the event loop gets
the GIL back between steps.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from protocol_adapters._dialects.parse_memo import ParseMemo
from protocol_adapters._types import NeutralRequest

from .body import decode_body

T = TypeVar("T")

INLINE_BYTES = 256 * 1024
"""Bodies up to this size are decoded on the loop: a thread hop would cost more than the parse."""


@dataclass(frozen=True, slots=True)
class LargeBodies:
    """``threshold``: bodies above this many bytes are decoded and rendered on the one
    large-body thread. Agent requests stay below it (Claude Code's reach a few MB after hundreds
    of turns); what passes it is usually far over any context and refused."""

    threshold: int = 8 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.threshold < INLINE_BYTES:
            raise ValueError(f"threshold must be at least {INLINE_BYTES} bytes")


class Workers:
    """The worker threads of one server: a pool for ordinary requests, one for large bodies."""

    def __init__(self, large: LargeBodies | None = None, threads: int | None = None) -> None:
        self.large = large or LargeBodies()
        self._size = threads or min(32, (os.cpu_count() or 1) + 4)
        self._pool = ThreadPoolExecutor(self._size, thread_name_prefix="adapter-worker")
        self._lane = ThreadPoolExecutor(1, thread_name_prefix="adapter-large-body")

    async def start(self) -> None:
        """Start every thread now, while nothing else wants the GIL."""
        loop = asyncio.get_running_loop()
        everyone = threading.Barrier(self._size)
        await asyncio.gather(
            *(loop.run_in_executor(self._pool, everyone.wait) for _ in range(self._size)),
            loop.run_in_executor(self._lane, int),
        )

    def is_large(self, body_bytes: int) -> bool:
        return body_bytes > self.large.threshold

    async def decode(
        self, dialect: str, raw: bytes | bytearray, memo: ParseMemo | None = None
    ) -> NeutralRequest:
        """The body as the dialect's neutral request (see :func:`decode_body`). A large body
        is parsed without the memo and replaces none: its memo would hold as much again."""
        if len(raw) <= INLINE_BYTES:
            return decode_body(dialect, raw, memo=memo)
        large = self.is_large(len(raw))
        in_steps = functools.partial(decode_body, in_steps=large, memo=None if large else memo)
        return await self.run(len(raw), in_steps, dialect, raw)

    async def run(self, body_bytes: int, work: Callable[..., T], *args: object) -> T:
        """``work(*args)`` off the loop: on the large-body thread for a large body."""
        executor = self._lane if self.is_large(body_bytes) else self._pool
        return await asyncio.get_running_loop().run_in_executor(executor, work, *args)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._lane.shutdown(wait=False, cancel_futures=True)
