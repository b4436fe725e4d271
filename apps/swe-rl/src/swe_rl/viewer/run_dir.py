"""The run directory, read back: what the demo and `swe-rl rollout` write and the viewer shows.

    <run>/run.json                         the index below (title, policy, agent, episodes, alarms,
                                           interrupted)
    <run>/episodes/<episode_id>/tree.json  the session tree (`trajectory_tree.dumps`)
    <run>/episodes/<episode_id>/summary.json, diff.patch, grading.log   optional artifacts

`run.json` is checked field by field, so a bad one is refused with the path of the offending
field (`episodes[3].reward: expected a number, got str 'x'`). Keys the viewer does not know are
ignored: writers may add facts without breaking older viewers. An episode's `dir` must stay
inside the run directory; a run directory is often shared, and a viewer must not be pointed at
arbitrary files by the index it reads.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slime_backend import ConfigError, EpisodeStatus, FieldError, from_mapping

RUN_FILE = "run.json"
TREE_FILE = "tree.json"
INTERRUPTED = "interrupted"
"""The reason of an episode an interrupt stopped (as swe_rl.run records it)."""


class RunDirError(ValueError):
    """A run directory the viewer cannot read; the message names the file and the field."""


@dataclass(frozen=True, slots=True)
class Alarm:
    """A silent-failure gate that tripped for the run (`slime_backend._gates`, as written)."""

    gate: str
    share: float
    limit: float
    message: str

    def __post_init__(self) -> None:
        _finite(self, "share", "limit")


@dataclass(frozen=True, slots=True)
class GradingEntry:
    """What grading said of the episode's change (swe_rl.grading.GradeResult.summary)."""

    verdict: str = ""
    reason: str = ""
    timed_out: bool = False
    refused_paths: Mapping[str, str] = dataclasses.field(default_factory=dict)
    tests: Mapping[str, str] = dataclasses.field(default_factory=dict)
    tests_passing: int = 0
    """Passing tests left out of `tests` (a summary lists at most a few hundred)."""


@dataclass(frozen=True, slots=True)
class EpisodeEntry:
    """One episode as the run index lists it; `advantage` is None where none was computed,
    `grading` where the episode was not graded."""

    episode_id: str
    instance_id: str
    group: int
    reward: float
    advantage: float | None
    status: EpisodeStatus
    reason: str
    dir: str
    grading: GradingEntry | None = None

    def __post_init__(self) -> None:
        _finite(self, "reward", "advantage")

    @property
    def stopped(self) -> bool:
        """Stopped by an interrupt before it finished: the run recorded no outcome for it."""
        return self.status is EpisodeStatus.ABORTED and self.reason == INTERRUPTED


@dataclass(frozen=True, slots=True)
class RunIndex:
    title: str
    policy: str
    agent: str
    episodes: tuple[EpisodeEntry, ...]
    alarms: tuple[Alarm, ...]
    interrupted: bool = False
    """The run was stopped (Ctrl-C, SIGTERM) before every episode finished."""


def read_run(run_dir: Path) -> RunIndex:
    """The run's index; raises :class:`RunDirError` naming the file and field that is wrong."""
    path = run_dir / RUN_FILE
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise RunDirError(f"{path}: no such file (is {run_dir} a run directory?)") from None
    except (OSError, ValueError) as error:
        raise RunDirError(f"{path}: not readable as JSON: {error}") from None
    try:
        return from_mapping(RunIndex, _known_keys(data), "")
    except ConfigError as error:
        raise RunDirError(f"{path}: {error}") from None


def episode_dir(run_dir: Path, entry: EpisodeEntry) -> Path:
    """Where `entry`'s files are; refuses a `dir` that leaves the run directory."""
    if not entry.dir:
        raise RunDirError(f"episode {entry.episode_id!r}: the run records no directory for it")
    root = run_dir.resolve()
    target = (root / entry.dir).resolve()
    if Path(entry.dir).is_absolute() or not target.is_relative_to(root) or target == root:
        raise RunDirError(
            f"episode {entry.episode_id!r}: dir {entry.dir!r} is not a directory inside the run"
        )
    return target


def _known_keys(data: object) -> object:
    """`data` without the keys the dataclasses do not declare, at each level of the index."""
    if not isinstance(data, Mapping):
        return data
    index = _only_fields(RunIndex, data)
    for name, kind in (("episodes", EpisodeEntry), ("alarms", Alarm)):
        items = index.get(name)
        if isinstance(items, list):
            index[name] = [_only_fields(kind, i) if isinstance(i, Mapping) else i for i in items]
    episodes = index.get("episodes")
    for episode in episodes if isinstance(episodes, list) else ():
        grading = episode.get("grading") if isinstance(episode, dict) else None
        if isinstance(grading, Mapping):
            episode["grading"] = _only_fields(GradingEntry, grading)
    return index


def _only_fields(cls: type[Any], data: Mapping[str, object]) -> dict[str, object]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def _finite(instance: object, *names: str) -> None:
    for name in names:
        value = getattr(instance, name)
        if value is not None and not math.isfinite(value):
            raise FieldError(name, f"must be a finite number, got {value}")
