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

    The stream is not a count of model calls: it leaves out sub-agents' calls (Claude Code
    omits a foreground sub-agent's final reply), compaction requests and retries. Count model
    calls from the adapter's record of the session (`trajectory_tree.summarize(tree).turns`).

    main_agent_turns: the main agent's turns as the CLI itself counts them. Claude Code: the
    main agent's model replies (what its `result` events' `num_turns` add up to). Codex
    `exec`: its `turn.started` events, one per task however many model calls the turn took.
    tool_calls: distinct tool invocations the stream reports (Claude Code includes those of
    the sub-agents it shows).
    result_text: the agent's final answer, if it finished with one.
    error: the CLI's own account of why the run failed, if it says so.
    """

    events: int
    malformed_lines: int
    main_agent_turns: int
    tool_calls: int
    result_text: str | None
    error: str | None


class EventTally(ABC):
    """Accumulates one harness's counts from decoded events; one instance per stream."""

    def __init__(self) -> None:
        self.main_agent_turns = 0
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
        main_agent_turns=tally.main_agent_turns,
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
