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

The tap also holds each episode to its **generation budget** (``max_episode_new_tokens``): a
call's ``max_new_tokens`` is cut to what the episode has left, counting the calls still
generating at their caps (so concurrent sub-agents cannot overshoot it together), and a call
with nothing left is refused as rate-limited before it reaches the engine, as the adapter
refuses calls past the turn cap.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

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
    max_new_tokens: int | None = None
    """The episode's generation budget (None: none)."""
    generated: int = 0
    """Tokens the engine generated for the episode's finished calls."""
    reserved: int = 0
    """The caps of the calls still generating."""

    def admit(self, request: GenerateRequest) -> tuple[GenerateRequest, int]:
        """The request within what is left of the budget, and what it reserves of it."""
        if self.max_new_tokens is None:
            return request, 0
        left = self.max_new_tokens - self.generated - self.reserved
        if left < 1:
            raise AdapterError(
                ErrorKind.RATE_LIMITED,
                f"the episode's generation budget is used up ({self.max_new_tokens} new tokens, "
                "max_episode_new_tokens)",
            )
        cap = min(request.sampling.max_new_tokens, left)
        if cap < request.sampling.max_new_tokens:
            request = replace(request, sampling=replace(request.sampling, max_new_tokens=cap))
        self.reserved += cap
        return request, cap

    def settle(self, reserved: int, produced: int) -> None:
        self.reserved -= reserved
        self.generated += produced

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

    def register(self, routing_key: str, *, max_new_tokens: int | None = None) -> EngineRecord:
        """Start recording the calls of the session whose id (the calls' routing key) this is,
        holding them to ``max_new_tokens`` generated tokens together (None: no budget)."""
        record = EngineRecord(routing_key, max_new_tokens=max_new_tokens)
        self._records[routing_key] = record
        return record

    def release(self, routing_key: str) -> None:
        self._records.pop(routing_key, None)

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        record, request, reserved = self._route(request)
        produced = 0
        try:
            result = await self._engine.generate(request)
            produced = len(result.output_ids)
        except AdapterError as exc:
            _failed(record, exc)
            raise
        finally:
            if record is not None:
                record.settle(reserved, produced)
        _finished(record, result.finish_reason, result.abort_message)
        return result

    async def stream(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        record, request, reserved = self._route(request)
        produced = 0
        chunks = self._engine.stream(request)
        try:
            async for chunk in chunks:
                produced += len(chunk.output_ids)
                if chunk.finish_reason is not None:
                    _finished(record, chunk.finish_reason, chunk.abort_message)
                yield chunk
        except AdapterError as exc:
            _failed(record, exc)
            raise
        finally:
            if record is not None:
                record.settle(reserved, produced)
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await aclose()

    async def abort(self, rid: str) -> None:
        await self._engine.abort(rid)

    async def context_length(self) -> int:
        return await self._engine.context_length()

    def _route(self, request: GenerateRequest) -> tuple[EngineRecord | None, GenerateRequest, int]:
        record = self._records.get(request.routing_key or "")
        if record is None:
            return None, request, 0
        request, reserved = record.admit(request)
        record.calls += 1
        return record, request, reserved


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
