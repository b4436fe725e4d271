"""What the adapter adds to a model call's latency, turn by turn (off unless asked for).

Two spans of each answered call are the adapter's: from the request's arrival to the engine
call (reading and decoding the body, routing, rendering, building the engine request), and from
the engine's last token to the last byte written to the client (parsing, recording, encoding and
flushing the answer). Everything between is the engine's. Reading the body is timed apart: it
goes at the pace of the client and of whatever relays its bytes (a sandbox's forwarded port).
On a node whose event loop also runs episodes, every span grows with every stall of that loop:
they are what a placement decision and the node bench measure.

The handler starts a clock in its task's context; :class:`TimedEngine`, wrapped around the
engine, stamps the engine call and its last token in the same task; the handler stamps the
flush and hands the finished :class:`TurnTiming` to a :class:`TurnTimings` recorder. A few
``perf_counter`` reads per call; nothing at all without a recorder.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import AsyncIterator
from contextvars import ContextVar
from dataclasses import dataclass

from protocol_adapters._engine.protocol import Engine
from protocol_adapters._engine.types import GenerateChunk, GenerateRequest, GenerateResult


@dataclass(frozen=True, slots=True)
class TurnTiming:
    """One answered model call's timestamps (``time.perf_counter`` seconds)."""

    dialect: str
    stream: bool
    received: float
    body_read: float
    engine_called: float
    engine_done: float
    flushed: float

    @property
    def reading_body(self) -> float:
        """Request in -> its whole body read: the client's and the network's pace (a sandbox's
        relay included), not the adapter's work."""
        return self.body_read - self.received

    @property
    def before_engine(self) -> float:
        """Request in -> engine call."""
        return self.engine_called - self.received

    @property
    def processing(self) -> float:
        """The adapter's own share: body read -> engine call, and last token -> flushed."""
        return self.engine_called - self.body_read + self.after_engine

    @property
    def after_engine(self) -> float:
        """Engine's last token -> the answer's last byte written."""
        return self.flushed - self.engine_done

    @property
    def added(self) -> float:
        """What the adapter added to the call's latency."""
        return self.before_engine + self.after_engine


class TurnTimings:
    """The most recent ``capacity`` answered calls' timings (``turns``), oldest first."""

    def __init__(self, capacity: int = 100_000) -> None:
        self.turns: deque[TurnTiming] = deque(maxlen=capacity)

    def record(self, timing: TurnTiming) -> None:
        self.turns.append(timing)


@dataclass(slots=True)
class Clock:
    """One call's timestamps so far (see the module docstring)."""

    received: float
    body_read: float | None = None
    engine_called: float | None = None
    engine_done: float | None = None

    def finish(self, dialect: str, stream: bool) -> TurnTiming | None:
        """The call's timing, flushed now; ``None`` when it never reached the engine."""
        if self.body_read is None or self.engine_called is None or self.engine_done is None:
            return None
        return TurnTiming(
            dialect,
            stream,
            self.received,
            self.body_read,
            self.engine_called,
            self.engine_done,
            time.perf_counter(),
        )


CLOCK: ContextVar[Clock | None] = ContextVar("protocol_adapters_turn_clock", default=None)


def start_clock() -> Clock:
    """A clock for the call handled by the current task."""
    clock = Clock(time.perf_counter())
    CLOCK.set(clock)
    return clock


class TimedEngine:
    """An :class:`Engine` that stamps the current call's clock, if it has one."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        clock = CLOCK.get()
        if clock is not None:
            clock.engine_called = time.perf_counter()
        result = await self.engine.generate(request)
        if clock is not None:
            clock.engine_done = time.perf_counter()
        return result

    async def stream(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        clock = CLOCK.get()
        if clock is not None:
            clock.engine_called = time.perf_counter()
        chunks = self.engine.stream(request)
        try:
            async for chunk in chunks:
                if clock is not None and chunk.finish_reason is not None:
                    clock.engine_done = time.perf_counter()
                yield chunk
        finally:  # leaving early must still abort the generation, as the engine's own does
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await aclose()

    async def abort(self, rid: str) -> None:
        await self.engine.abort(rid)

    async def context_length(self) -> int:
        return await self.engine.context_length()
