"""The run directory, read back: what the demo and `swe-rl rollout` write and the viewer shows.

    <run>/run.json                         the index (`swe_rl.run_record`: title, policy, agent,
                                           episodes, alarms, interrupted, ...)
    <run>/episodes/<episode_id>/tree.json  the session tree (`trajectory_tree.dumps`)
    <run>/episodes/<episode_id>/summary.json, diff.patch, grading.log   optional artifacts

`run.json` is checked field by field (`swe_rl.run_record.RunRecord.from_json`), so a bad one is
refused with the path of the offending field (`episodes[3].reward: expected a number, got str
'x'`). Keys the record does not declare are ignored: writers may add facts without breaking
older viewers. An episode's `dir` must stay inside the run directory; a run directory is often
shared, and a viewer must not be pointed at arbitrary files by the index it reads.
"""

from __future__ import annotations

import json
from pathlib import Path

from slime_backend import ConfigError
from swe_rl.run_record import RUN_FILE, EpisodeEntry, RunRecord

TREE_FILE = "tree.json"


class RunDirError(ValueError):
    """A run directory the viewer cannot read; the message names the file and the field."""


def read_run(run_dir: Path) -> RunRecord:
    """The run's index; raises :class:`RunDirError` naming the file and field that is wrong."""
    path = run_dir / RUN_FILE
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise RunDirError(f"{path}: no such file (is {run_dir} a run directory?)") from None
    except (OSError, ValueError) as error:
        raise RunDirError(f"{path}: not readable as JSON: {error}") from None
    try:
        return RunRecord.from_json(data)
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
