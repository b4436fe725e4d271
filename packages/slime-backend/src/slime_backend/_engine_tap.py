"""The adapter's engine, seen per episode: whether the engine failed it.

slime gives every training sample a ``session_id``, which the generate function opens the
adapter's session with; the adapter routes each call by its session's id (slime's router hashes
``X-SMG-Routing-Key`` to pick an engine), so the routing key names the episode. A thin
:class:`~protocol_adapters.Engine` wrapper between the adapter and slime's router uses it
to record what is not the adapter's business: **engine failures**. When the engine is down or
fails a call, the agent sees an error, may retry, and may end the episode without the model. Its
reward would then grade the outage, not the policy. The tap counts, per episode, the calls the
engine failed (unreachable, timed out, broke the answer, or aborted the generation) and whether
the agent's last model call was one of them; the generate function aborts such an episode.

Calls the engine refused for the request's own sake (a prompt over the context) and calls the
client abandoned (cancelled) are neither failures nor successes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from protocol_adapters import (
    AdapterError,
    Engine,
    ErrorKind,
    GenerateChunk,
    GenerateRequest,
    GenerateResult,
)
from trajectory_tree import FinishReason

ENGINE_FAULTS = frozenset({ErrorKind.OVERLOADED, ErrorKind.TIMEOUT, ErrorKind.ENGINE_ERROR})
"""Error kinds the SGLang client raises when the engine, not the request, is at fault."""


@dataclass(slots=True)
class EngineRecord:
    """One episode's engine calls, as the tap saw them."""

    routing_key: str
    calls: int = 0
    failures: int = 0
    last_call_failed: bool = False
    last_failure: str = ""

    def failed(self, why: str) -> None:
        self.failures += 1
        self.last_call_failed = True
        self.last_failure = why

    def answered(self) -> None:
        self.last_call_failed = False


class EngineTap:
    """An :class:`Engine` that routes and records each registered session's calls."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._records: dict[str, EngineRecord] = {}

    def register(self, routing_key: str) -> EngineRecord:
        """Start recording the calls of the session whose id (the calls' routing key) this is."""
        record = EngineRecord(routing_key)
        self._records[routing_key] = record
        return record

    def release(self, routing_key: str) -> None:
        self._records.pop(routing_key, None)

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        record, request = self._route(request)
        try:
            result = await self._engine.generate(request)
        except AdapterError as exc:
            _failed(record, exc)
            raise
        _finished(record, result.finish_reason, result.abort_message)
        return result

    async def stream(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        record, request = self._route(request)
        chunks = self._engine.stream(request)
        try:
            async for chunk in chunks:
                if chunk.finish_reason is not None:
                    _finished(record, chunk.finish_reason, chunk.abort_message)
                yield chunk
        except AdapterError as exc:
            _failed(record, exc)
            raise
        finally:
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await aclose()

    async def abort(self, rid: str) -> None:
        await self._engine.abort(rid)

    async def context_length(self) -> int:
        return await self._engine.context_length()

    def _route(self, request: GenerateRequest) -> tuple[EngineRecord | None, GenerateRequest]:
        record = self._records.get(request.routing_key or "")
        if record is not None:
            record.calls += 1
        return record, request


def _failed(record: EngineRecord | None, exc: AdapterError) -> None:
    if record is None:
        return
    if exc.kind in ENGINE_FAULTS:
        record.failed(f"{exc.kind}: {exc.message}")
    else:
        record.answered()


def _finished(record: EngineRecord | None, finish: FinishReason, message: str | None) -> None:
    if record is None:
        return
    if finish is FinishReason.ABORT:
        record.failed(f"the engine aborted the generation: {message or 'no reason given'}")
    else:
        record.answered()
