"""Counters that make every fallback visible: per template, how often the bridge was used, checked,
found wrong, found differing only in the model's own output (kept verbatim), and replaced by a
full render (and why)."""

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
    """Checks that found the bridge's template text wrong (the turn was rendered in full)."""
    fallbacks: Mapping[str, int] = field(default_factory=dict)
    last_mismatch: str | None = None
    kept_outputs: int = 0
    """Turns whose bridged prompt was found to differ from the template's render only where it
    may (an earlier reply as the model wrote it, an accepted deviation): the engine's ids were
    kept, the reason recorded in the turn's ``prompt_mismatch`` note."""

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
        self._kept = 0

    def bridged(self) -> None:
        with self._lock:
            self._bridged += 1

    def checked(self, mismatch: str | None, *, kept: bool = False) -> None:
        """One check; ``mismatch`` is its reason, ``kept`` when only model output differed."""
        with self._lock:
            self._checked += 1
            if mismatch is not None:
                self._last_mismatch = mismatch
                if kept:
                    self._kept += 1
                else:
                    self._mismatches += 1

    def kept(self, reason: str) -> None:
        """A difference the bridge keeps, found outside a sampled check (the per-turn one)."""
        with self._lock:
            self._kept += 1
            self._last_mismatch = reason

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
                kept_outputs=self._kept,
            )
