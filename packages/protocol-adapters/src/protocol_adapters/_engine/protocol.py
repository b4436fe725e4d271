"""The one interface the adapters need from an inference engine."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol, runtime_checkable

from .types import GenerateChunk, GenerateRequest, GenerateResult


@runtime_checkable
class Engine(Protocol):
    """Generates from token ids and can stop a generation it started.

    Errors are raised as :class:`protocol_adapters._types.AdapterError` so each dialect can answer
    them in its own shape. Cancelling the awaiting task aborts the generation on the engine.
    """

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Run one generation to completion."""
        ...

    def stream(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        """Run one generation, yielding only the new tokens of each step.

        The last chunk carries the finish reason. Leaving the iteration early aborts the
        generation on the engine.
        """
        ...

    async def abort(self, rid: str) -> None:
        """Ask the engine to stop generation ``rid`` (no error if it already finished)."""
        ...

    async def context_length(self) -> int:
        """The most tokens (prompt and output together) one generation may hold on this engine."""
        ...
