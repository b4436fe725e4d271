"""Retry with exponential backoff, as typed configuration."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """`attempts` tries in total; the wait before try n+1 is initial_delay * multiplier**(n-1),
    capped at max_delay."""

    attempts: int = 3
    initial_delay: float = 0.5
    multiplier: float = 2.0
    max_delay: float = 10.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("attempts must be at least 1")
        if self.initial_delay < 0 or self.max_delay < 0 or self.multiplier < 1:
            raise ValueError("delays must be non-negative and the multiplier at least 1")

    def delays(self) -> Iterator[float]:
        """The waits between consecutive attempts (attempts - 1 of them)."""
        delay = self.initial_delay
        for _ in range(self.attempts - 1):
            yield min(delay, self.max_delay)
            delay *= self.multiplier
