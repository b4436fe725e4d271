"""The engine's connect timeout, counted only in time the event loop actually ran.

aiohttp's own connect timer fires at start + timeout whatever the loop did meanwhile. The loop
that serves the adapter on a rollout node also runs its episodes, and a garbage collection or a
burst of work can hold it longer than the timeout: the connect to a healthy engine completes in
the kernel during the stall, but the loop sees the completion and the expired timer in the same
iteration, and the timer wins. The agent gets a 529 for an engine that was fine.

So aiohttp's timer is off, and aiohttp's connection trace arms a :class:`ConnectDeadline` as the
connect starts (after waiting for a pool slot: a full pool is not an unreachable engine) and
disarms it once the connection is made. The deadline ticks every ``timeout / 8``: a tick adds
the time since the previous one, or a single tick's worth when it came late (the loop was
stalled: what the stall hid is still waiting to be seen, so the next tick is a whole interval
away), and the connect fails only at a tick that came on time once the ticks add up to
``timeout``. A dead engine is still reported within
about ``timeout`` of running loop; a stall only delays the verdict.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace, TracebackType
from typing import Self

import aiohttp

TICKS = 8
"""Ticks per timeout."""
LATE = 1.5
"""A tick this many intervals after the previous one found the loop stalled."""


class ConnectDeadline:
    """One request's connect deadline (``async with`` around the request's connect phase;
    pass it to aiohttp as ``trace_request_ctx`` with :func:`connect_trace` installed).

    On expiry the connecting task is cancelled and the ``async with`` raises aiohttp's own
    :class:`aiohttp.ConnectionTimeoutError`, so callers map it as they map aiohttp's.
    """

    __slots__ = ("_cancelling", "_counted", "_handle", "_last", "_task", "expired", "timeout")

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.expired = False
        self._task: asyncio.Task[object] | None = None
        self._cancelling = 0
        self._handle: asyncio.TimerHandle | None = None
        self._counted = 0.0
        self._last = 0.0

    @property
    def _interval(self) -> float:
        return self.timeout / TICKS

    def started(self) -> None:
        """The connect starts (the trace's ``on_connection_create_start``, in its task)."""
        self._disarm()
        self._task = asyncio.current_task()
        if self._task is None:
            return
        self._cancelling = self._task.cancelling()
        loop = asyncio.get_running_loop()
        self._counted = 0.0
        self._last = loop.time()
        self._handle = loop.call_at(self._last + self._interval, self._tick)

    def connected(self) -> None:
        """The connection is made (``on_connection_create_end``)."""
        self._disarm()

    def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        elapsed, self._last = now - self._last, now
        late = elapsed >= LATE * self._interval
        self._counted += self._interval if late else elapsed
        if self._counted >= self.timeout and not late and self._task is not None:
            self.expired = True
            self._handle = None
            self._task.cancel("engine connect timeout")
            return
        # After a stall, a whole interval of running loop before any verdict: the connect it hid
        # needs a few iterations to be seen through.
        delay = self._interval if late else min(self._interval, self.timeout - self._counted)
        self._handle = loop.call_at(now + delay, self._tick)

    def _disarm(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._disarm()
        if not self.expired or exc_type is not asyncio.CancelledError or self._task is None:
            return
        if self._task.uncancel() <= self._cancelling:  # ours, not the caller's cancellation
            raise aiohttp.ConnectionTimeoutError(
                f"no connection within {self.timeout}s of running event loop"
            ) from None


def connect_trace() -> aiohttp.TraceConfig:
    """The trace that arms and disarms each request's :class:`ConnectDeadline`."""

    async def started(
        session: aiohttp.ClientSession,
        context: SimpleNamespace,
        params: aiohttp.TraceConnectionCreateStartParams,
    ) -> None:
        if isinstance(context.trace_request_ctx, ConnectDeadline):
            context.trace_request_ctx.started()

    async def connected(
        session: aiohttp.ClientSession,
        context: SimpleNamespace,
        params: aiohttp.TraceConnectionCreateEndParams,
    ) -> None:
        if isinstance(context.trace_request_ctx, ConnectDeadline):
            context.trace_request_ctx.connected()

    trace = aiohttp.TraceConfig()
    trace.on_connection_create_start.append(started)
    trace.on_connection_create_end.append(connected)
    trace.freeze()
    return trace
