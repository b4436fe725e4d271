"""Why a reward is what it is reaches run.json: each row carries the episode's grading."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from slime_backend import NAMESPACE
from slime_backend.testing import StandInSample
from swe_rl.demo.repos import create_demo_tasks
from swe_rl.grading import GradeResult, Verdict
from swe_rl.run import PlannedEpisode, Run, plan
from swe_rl.task_file import parse_task_lines

GRADING = GradeResult(
    Verdict.UNRESOLVED,
    "1 of 2 tests do not pass (test_calc.TestAdd.test_add: failed); 1 refused: conftest.py "
    "(code the test runner loads by itself (conftest.py))",
    {"test_calc.TestAdd.test_add": "failed", "test_calc.TestSub.test_sub": "passed"},
    {"conftest.py": "code the test runner loads by itself (conftest.py)"},
    patch_applied=True,
).summary()


async def test_each_row_of_run_json_carries_the_verdict_its_reason_and_the_refusals(
    tmp_path: Path,
) -> None:
    rows = parse_task_lines([json.dumps(r) for r in create_demo_tasks(tmp_path / "repos")]).rows

    async def source(episode: PlannedEpisode) -> list[Any]:
        facts = {
            "status": "completed",
            "reason": str(GRADING["reason"]),
            "reward": 0.0,
            "artifacts": {"grading": GRADING},
        }
        metadata = {NAMESPACE: {"episode": facts, "sample": {}}}
        return [StandInSample(index=episode.index, group_index=episode.group, metadata=metadata)]

    out = tmp_path / "run"
    run = Run(out=out, source=source, concurrency=2, title="t", policy="p", agent="a")
    await run.execute(plan(rows[:1], 1))
    (row,) = json.loads((out / "run.json").read_text())["episodes"]
    assert row["grading"] == GRADING
    assert row["grading"]["verdict"] == "unresolved"
    assert row["grading"]["refused_paths"] == {
        "conftest.py": "code the test runner loads by itself (conftest.py)"
    }
    assert row["grading"]["timed_out"] is False
    assert row["reason"] == GRADING["reason"]
    sample = json.loads((out / "samples.jsonl").read_text().splitlines()[0])
    assert sample["metadata"][NAMESPACE]["episode"]["artifacts"]["grading"] == GRADING
