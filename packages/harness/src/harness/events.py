"""Summaries of an agent CLI's JSON event stream (one JSON object per stdout line).

The stream is diagnostics, not training data: the adapter's session tree is the record of
what the model saw and produced. Reading it must therefore never fail a run: a line that
is not a JSON object (cut short by a kill at the budget, stray text on stdout, invalid
UTF-8) is counted as malformed and skipped, and fields of unexpected types are ignored.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class EventStats:
    """What the event stream says about a run.

    turns: model replies where the stream shows them one by one (Claude Code), otherwise the
    agent turns the CLI reports (Codex exec: one per `turn.started`).
    tool_calls: distinct tool invocations the CLI reported.
    result_text: the agent's final answer, if it finished with one.
    error: the CLI's own account of why the run failed, if it says so.
    """

    events: int
    malformed_lines: int
    turns: int
    tool_calls: int
    result_text: str | None
    error: str | None


class EventTally(ABC):
    """Accumulates one harness's counts from decoded events; one instance per stream."""

    def __init__(self) -> None:
        self.turns = 0
        self.tool_calls = 0
        self.result_text: str | None = None
        self.error: str | None = None

    @abstractmethod
    def observe(self, event: Mapping[str, Any]) -> None:
        """Update the counts with one event (a decoded JSON object of any shape)."""


def decode_events(lines: Iterable[bytes], counts: list[int]) -> Iterator[Mapping[str, Any]]:
    """Yield each line that is a JSON object; `counts` becomes [events, malformed]."""
    counts[:] = [0, 0]
    for raw in lines:
        line = raw.strip()
        if not line:
            continue
        try:
            event = json.loads(line)
        except (ValueError, RecursionError):
            event = None
        if isinstance(event, dict):
            counts[0] += 1
            yield event
        else:
            counts[1] += 1


def summarize_lines(lines: Iterable[bytes], tally: EventTally) -> EventStats:
    counts = [0, 0]
    for event in decode_events(lines, counts):
        tally.observe(event)
    return EventStats(
        events=counts[0],
        malformed_lines=counts[1],
        turns=tally.turns,
        tool_calls=tally.tool_calls,
        result_text=tally.result_text,
        error=tally.error,
    )


def summarize_file(path: Path, tally: EventTally) -> EventStats:
    """Summarize a stream file line by line (a long run's stream never sits in memory)."""
    with path.open("rb") as stream:
        return summarize_lines(stream, tally)


def as_dict(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def as_list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def as_str(value: object) -> str | None:
    return value if isinstance(value, str) else None
