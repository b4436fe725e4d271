"""Counters that make every fallback visible: per template, how often the bridge was used, checked,
found wrong, and replaced by a full render (and why)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class BridgeStats:
    """A snapshot. ``fallbacks`` maps each reason to how many turns were rendered in full for it."""

    template: str
    bridged: int = 0
    checked: int = 0
    mismatches: int = 0
    fallbacks: Mapping[str, int] = field(default_factory=dict)
    last_mismatch: str | None = None

    @property
    def full_renders(self) -> int:
        return sum(self.fallbacks.values())


class StatsRecorder:
    """Thread-safe accumulation behind :class:`BridgeStats`."""

    def __init__(self, template: str) -> None:
        self._template = template
        self._lock = threading.Lock()
        self._bridged = 0
        self._checked = 0
        self._mismatches = 0
        self._fallbacks: Counter[str] = Counter()
        self._last_mismatch: str | None = None

    def bridged(self) -> None:
        with self._lock:
            self._bridged += 1

    def checked(self, mismatch: str | None) -> None:
        with self._lock:
            self._checked += 1
            if mismatch is not None:
                self._mismatches += 1
                self._last_mismatch = mismatch

    def fallback(self, reason: str) -> None:
        with self._lock:
            self._fallbacks[reason] += 1

    def snapshot(self) -> BridgeStats:
        with self._lock:
            return BridgeStats(
                template=self._template,
                bridged=self._bridged,
                checked=self._checked,
                mismatches=self._mismatches,
                fallbacks=dict(self._fallbacks),
                last_mismatch=self._last_mismatch,
            )
