"""Why a reward is what it is reaches run.json: each row carries the episode's grading."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from slime_backend import NAMESPACE, EpisodeOutcome
from swe_rl.demo.repos import create_demo_tasks
from swe_rl.grading import GradeResult, Verdict
from swe_rl.run import NOT_RUN, PlannedEpisode, Run, plan
from swe_rl.task_file import parse_task_lines

from .provenance_kit import provenance_sample

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
        outcome = EpisodeOutcome(0.0, reason=str(GRADING["reason"]), artifacts={"grading": GRADING})
        return [provenance_sample(episode, outcome)]

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


ENVIRONMENT = "environment: the sandbox cannot start (image swebench/x:latest): manifest unknown"


async def test_a_run_counts_its_aborts_by_cause_and_the_alarm_names_the_environment(
    tmp_path: Path,
) -> None:
    """Most episodes aborting for their environment: the run says so, it is not zeros."""
    rows = parse_task_lines([json.dumps(r) for r in create_demo_tasks(tmp_path / "repos")]).rows
    reasons = [ENVIRONMENT, ENVIRONMENT, ENVIRONMENT, "sandbox: boot failed", None]

    async def source(episode: PlannedEpisode) -> list[Any]:
        reason = reasons[episode.index]
        if reason is None:
            outcome = EpisodeOutcome(1.0, reason="every wanted test passes")
            return [provenance_sample(episode, outcome, trained_tokens=10, tool_calls=1)]
        return [provenance_sample(episode, EpisodeOutcome.aborted(reason), tool_calls=1)]

    out = tmp_path / "run"
    run = Run(out=out, source=source, concurrency=2, title="t", policy="p", agent="a")
    result = await run.execute(plan(rows[:1], 5))
    document = json.loads((out / "run.json").read_text())
    assert document["aborts"] == {"environment": 3, "sandbox": 1}
    alarms = {alarm["gate"]: alarm["message"] for alarm in document["alarms"]}
    assert alarms["environment_aborts"].startswith(
        "3 of 5 episodes (60%) exceed the 50% limit; aborted: environment 3; e.g. environment: "
    )
    assert "manifest unknown" in alarms["environment_aborts"]
    assert "environment_aborts" in result.gates.describe()


async def test_a_sample_source_that_raises_stops_the_run_and_says_why(tmp_path: Path) -> None:
    """The generate function refusing the run's configuration on its first call (or any bug
    of the source) is no interrupt: the run stops, run.json and the result name the failure,
    and the episodes it kept from running are marked as such, counted by no gate."""
    rows = parse_task_lines([json.dumps(r) for r in create_demo_tasks(tmp_path / "repos")]).rows

    async def source(episode: PlannedEpisode) -> list[Any]:
        raise ValueError("--partial-rollout is not supported with fan-out")

    out = tmp_path / "run"
    run = Run(out=out, source=source, concurrency=1, title="t", policy="p", agent="a")
    result = await run.execute(plan(rows[:1], 3))
    failure = "failed: ValueError: --partial-rollout is not supported with fan-out"
    assert result.failure == failure
    assert not result.interrupted
    reasons = [record.reason for record in result.records]
    assert reasons == [failure, NOT_RUN, NOT_RUN]
    assert all(record.status == "aborted" for record in result.records)
    document = json.loads((out / "run.json").read_text())
    assert document["failure"] == failure
    assert document["interrupted"] is False
    counted = {r.name: r.episodes for r in result.gates.results}
    assert counted["aborts"] == 1  # the failed one; the never-run ones say nothing


async def test_samples_refused_for_routing_replay_reach_run_json_and_trip_the_gate(
    tmp_path: Path,
) -> None:
    """A run whose engine returns no MoE routing says so: every row counts its refused samples
    and the routing_missing gate names them."""
    rows = parse_task_lines([json.dumps(r) for r in create_demo_tasks(tmp_path / "repos")]).rows

    async def source(episode: PlannedEpisode) -> list[Any]:
        outcome = EpisodeOutcome(1.0, reason="every wanted test passes")
        refused = {"position": 1, "leaf_turn": 3, "reason": "no routing for rows 0-9"}
        routing = {"replay": True, "layers": 2, "topk": 2, "refused": [refused]}
        return [
            provenance_sample(episode, outcome, trained_tokens=10, tool_calls=1, routing=routing)
        ]

    out = tmp_path / "run"
    run = Run(out=out, source=source, concurrency=2, title="t", policy="p", agent="a")
    result = await run.execute(plan(rows[:1], 2))
    document = json.loads((out / "run.json").read_text())
    assert [row["routing_refused"] for row in document["episodes"]] == [1, 1]
    (missing,) = [g for g in result.gates.results if g.name == "routing_missing"]
    assert missing.tripped
