"""A run whose policy does nothing: recorded as what it is, reported, never a crash.

The agent of every episode made no model call (a policy that answers nothing a CLI can use);
grading still ran. slime-backend's real conversion records each as a graded episode with nothing
to train (``nothing_trainable: no_turns``, its graded reward kept, outside the GRPO baseline). In
training its gates would stop the step; the demo and ``rollout`` finish the run, write run.json
and the viewer, and print the alarm with what it means.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console

from slime_backend import ConversionOptions, EpisodeOutcome, episode_samples
from slime_backend.testing import StandInSample
from swe_rl.demo.repos import create_demo_tasks
from swe_rl.demo.run import _report
from swe_rl.run import PlannedEpisode, Run, plan
from swe_rl.task_file import parse_task_lines
from swe_rl.viewer import write_viewer
from trajectory_tree import SessionTree


async def test_a_run_where_the_policy_does_nothing_is_recorded_and_reported(
    tmp_path: Path,
) -> None:
    rows = parse_task_lines([json.dumps(r) for r in create_demo_tasks(tmp_path / "repos")]).rows

    async def source(episode: PlannedEpisode) -> list[Any]:
        base = StandInSample(
            index=episode.index,
            group_index=episode.group,
            metadata=dict(episode.row.metadata),
        )
        reward = 1.0 if episode.index == 0 else 0.0  # the task happened to pass already
        tree = SessionTree(f"session-{episode.index}")  # no model call
        outcome = EpisodeOutcome(reward)
        samples: list[Any] = episode_samples(
            tree, base, outcome, ConversionOptions(), sample_class=StandInSample
        )
        return samples

    out = tmp_path / "run"
    run = Run(out=out, source=source, concurrency=2, title="t", policy="p", agent="a")
    result = await run.execute(plan(rows[:2], 2))

    document = json.loads((out / "run.json").read_text())
    episodes = document["episodes"]
    assert {e["status"] for e in episodes} == {"aborted"}  # no "completed" beside a placeholder
    assert all(e["reason"].startswith("nothing_trainable: no_turns: ") for e in episodes)
    assert [e["reward"] for e in episodes] == [1.0, 0.0, 0.0, 0.0]  # graded, kept
    assert {e["advantage"] for e in episodes} == {None}  # outside the baseline
    assert document["aborts"] == {"nothing_trainable": 4}
    gates = document["gates"]
    assert gates["zero_trainable"]["offending"] == 4
    assert gates["zero_tool_calls"]["offending"] == 4  # they ran: graded, no tool call
    assert gates["aborts"]["offending"] == 0  # no fault of the stack
    alarms = {alarm["gate"] for alarm in document["alarms"]}
    assert alarms == {"zero_trainable", "zero_tool_calls"}

    viewer = write_viewer(out, lambda token: "x")
    assert viewer.is_file()
    console = Console(record=True, width=400)
    _report(console, result, viewer, out)
    text = console.export_text()
    assert "ALARM silent-failure gates tripped: zero_trainable: 4/4 episodes (100%)" in text
    assert "nothing_trainable 4" in text
    assert "slime-backend's gates stop the step here" in text
    assert "fail_step = false only warns" in text
