"""`run.json`, the run's index: its shape declared once, written by `swe_rl.run`, read by the
viewer (`swe_rl.viewer.run_dir`).

    {"title", "policy", "agent", "interrupted", "failure", "duration_s", "sample_write_errors",
     "episodes": [{"episode_id", "instance_id", "group", "index", "status", "reason", "reward",
                   "advantage", "samples", "turns", "tool_calls", "malformed_tool_calls",
                   "trained_tokens", "masked_tokens", "dir", "grading"}],
     "aborts": {cause: count}, "gates": {gate: {...}}, "alarms": [{"gate", "share", "limit",
     "message"}], ...the command's own facts (checkpoint, conversion, settings, ...)}

Reading is lenient where runs differ and strict where they must not: keys this module does not
declare are ignored at every level (writers may add facts without breaking older readers; a
run's own facts are kept in `RunRecord.extra`), fields an older run lacks take their defaults,
and a declared field of the wrong type is refused with its path (`episodes[3].reward: expected
a number, got str 'x'`). There is no version field: the format only ever grows.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slime_backend import ConfigError, EpisodeStatus, from_mapping, to_mapping

RUN_FILE = "run.json"
INTERRUPTED = "interrupted"
"""The reason of an episode an interrupt stopped before it finished."""


@dataclass(frozen=True, slots=True)
class Alarm:
    """A silent-failure gate that tripped for the run (`slime_backend`'s gates)."""

    gate: str
    share: float
    limit: float
    message: str


@dataclass(frozen=True, slots=True)
class Grading:
    """What grading said of the episode's change: `swe_rl.grading.GradeResult.summary()`.
    Every field has a default: older runs wrote fewer of them."""

    verdict: str = ""
    reason: str = ""
    reward: float = 0.0
    resolved: bool = False
    timed_out: bool = False
    patch_applied: bool = False
    refused_paths: Mapping[str, str] = field(default_factory=dict)
    tests: Mapping[str, str] = field(default_factory=dict)
    tests_passing: int = 0
    """Passing tests left out of `tests` (a summary lists at most a few hundred)."""
    collection_errors: Mapping[str, str] = field(default_factory=dict)
    score: float | None = None

    @classmethod
    def from_json(cls, data: object, path: str = "grading") -> Grading:
        """`data` as a grading entry (unknown keys ignored); raises `ConfigError` naming the
        field that is wrong."""
        return from_mapping(cls, _only_fields(cls, data), path)

    def to_json(self) -> dict[str, Any]:
        return _json_object(self)


@dataclass(frozen=True, slots=True)
class EpisodeEntry:
    """One episode as the run lists it; `advantage` is None where none was computed,
    `grading` where the episode was not graded."""

    episode_id: str
    instance_id: str
    group: int
    reward: float
    advantage: float | None
    status: EpisodeStatus
    reason: str
    dir: str
    """The episode's directory, relative to the run directory ("" when it has none)."""
    grading: Grading | None = None
    index: int = 0
    samples: int = 0
    turns: int = 0
    tool_calls: int = 0
    malformed_tool_calls: int = 0
    trained_tokens: int = 0
    masked_tokens: int = 0
    routing_refused: int = 0
    """Samples not trained because their MoE routing could not be replayed."""

    @property
    def stopped(self) -> bool:
        """Stopped by an interrupt before it finished: the run recorded no outcome for it."""
        return self.status is EpisodeStatus.ABORTED and self.reason == INTERRUPTED

    def to_json(self) -> dict[str, Any]:
        return {
            "episode_id": self.episode_id,
            "instance_id": self.instance_id,
            "group": self.group,
            "index": self.index,
            "status": self.status.value,
            "reason": self.reason,
            "reward": self.reward,
            "advantage": self.advantage,
            "samples": self.samples,
            "turns": self.turns,
            "tool_calls": self.tool_calls,
            "malformed_tool_calls": self.malformed_tool_calls,
            "trained_tokens": self.trained_tokens,
            "masked_tokens": self.masked_tokens,
            "routing_refused": self.routing_refused,
            "dir": self.dir,
            "grading": None if self.grading is None else self.grading.to_json(),
        }


_UNTYPED = ("aborts", "gates", "extra")
"""RunRecord's fields `from_mapping` does not convert: read by `RunRecord.from_json` itself."""


@dataclass(frozen=True, slots=True)
class RunRecord:
    """The whole of run.json."""

    title: str
    policy: str
    agent: str
    episodes: tuple[EpisodeEntry, ...]
    alarms: tuple[Alarm, ...]
    interrupted: bool = False
    """The run was stopped (Ctrl-C, SIGTERM) before every episode finished."""
    failure: str | None = None
    """Why the run stopped early, when its sample source raised."""
    duration_s: float = 0.0
    sample_write_errors: tuple[str, ...] = ()
    aborts: Mapping[str, int] = field(default_factory=dict)
    """Aborted episodes by cause, most common first."""
    gates: Mapping[str, Any] = field(default_factory=dict)
    """Every silent-failure gate's result (`slime_backend.GateReport.as_dict()`)."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """The command's own facts, written at the top level after the fields above (the demo's
    and rollout's checkpoint, conversion options, settings, ...)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "policy": self.policy,
            "agent": self.agent,
            "interrupted": self.interrupted,
            "failure": self.failure,
            "duration_s": self.duration_s,
            "sample_write_errors": list(self.sample_write_errors),
            "episodes": [episode.to_json() for episode in self.episodes],
            "aborts": dict(self.aborts),
            "gates": dict(self.gates),
            "alarms": [_json_object(alarm) for alarm in self.alarms],
            **self.extra,
        }

    def write(self, path: Path) -> None:
        """Write it to `path` whole: a reader never sees half a run.json."""
        partial = path.with_name(f".{path.name}.partial")
        partial.write_text(json.dumps(self.to_json(), indent=2))
        partial.replace(path)

    @classmethod
    def from_json(cls, data: object) -> RunRecord:
        """`data` (run.json parsed) as a record; raises `ConfigError` naming the field."""
        if not isinstance(data, Mapping):
            return from_mapping(cls, data)  # refuses it, saying what it got
        typed = _only_fields(cls, data)
        for name in _UNTYPED:
            typed.pop(name, None)
        episodes = typed.get("episodes")
        if isinstance(episodes, list):
            typed["episodes"] = [_episode_keys(e) for e in episodes]
        alarms = typed.get("alarms")
        if isinstance(alarms, list):
            typed["alarms"] = [_only_fields(Alarm, a) for a in alarms]
        record = from_mapping(cls, typed)
        _check_finite(record)
        known = {f.name for f in dataclasses.fields(cls)}
        return dataclasses.replace(
            record,
            aborts=_counts(data.get("aborts", {}), "aborts"),
            gates=_table(data.get("gates", {}), "gates"),
            extra={k: v for k, v in data.items() if k not in known},
        )


def _episode_keys(data: object) -> object:
    if not isinstance(data, Mapping):
        return data
    episode = _only_fields(EpisodeEntry, data)
    grading = episode.get("grading")
    if isinstance(grading, Mapping):
        episode["grading"] = _only_fields(Grading, grading)
    return episode


def _only_fields(cls: type[Any], data: object) -> Any:
    """`data` without the keys `cls` does not declare (anything but a mapping as it is)."""
    if not isinstance(data, Mapping):
        return data
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def _check_finite(record: RunRecord) -> None:
    """JSON readers accept NaN and Infinity; a run's numbers never are (checked on reading
    only: the writer records what the run computed)."""
    for i, episode in enumerate(record.episodes):
        _finite(episode, f"episodes[{i}]", "reward", "advantage")
    for i, alarm in enumerate(record.alarms):
        _finite(alarm, f"alarms[{i}]", "share", "limit")


def _finite(instance: object, path: str, *names: str) -> None:
    for name in names:
        value = getattr(instance, name)
        if value is not None and not math.isfinite(value):
            raise ConfigError(f"{path}.{name}", f"must be a finite number, got {value}")


def _counts(data: object, path: str) -> dict[str, int]:
    table = _table(data, path)
    for key, value in table.items():
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"{path}.{key}", f"expected an integer, got {value!r}")
    return dict(table)


def _table(data: object, path: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise ConfigError(path, f"expected a table, got {type(data).__name__}")
    return data


def _json_object(value: object) -> dict[str, Any]:
    data = to_mapping(value)
    assert isinstance(data, dict)
    return data
