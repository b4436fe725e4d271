"""An interrupted run: what finished is on disk before it counts as finished, what was stopped
counts towards no alarm, and a run without a terminal says how it is getting on."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from slime_backend import EpisodeOutcome
from slime_backend.testing import StandInSample
from swe_rl.demo.repos import create_demo_tasks
from swe_rl.run import PlannedEpisode, Run, plan
from swe_rl.run_record import INTERRUPTED
from swe_rl.task_file import TaskRow, parse_task_lines

from .provenance_kit import provenance_sample


@pytest.fixture
def rows(tmp_path: Path) -> tuple[TaskRow, ...]:
    tasks = create_demo_tasks(tmp_path / "repos")
    return parse_task_lines([json.dumps(row) for row in tasks]).rows


def finished_sample(episode: PlannedEpisode, reward: float = 1.0) -> StandInSample:
    outcome = EpisodeOutcome(reward, reason="every wanted test passes")
    return provenance_sample(episode, outcome, trained_tokens=12, tool_calls=2)


@pytest.fixture
async def one_busy_worker() -> AsyncIterator[threading.Event]:
    """The loop's default executor with one thread, kept busy until the event is set: a sample
    write handed to a thread waits in the queue, where cancelling it would drop it unrun (as a
    busy machine does to a thread that has not been scheduled yet)."""
    loop = asyncio.get_running_loop()
    executor = ThreadPoolExecutor(max_workers=1)
    loop.set_default_executor(executor)
    release = threading.Event()
    executor.submit(release.wait)
    try:
        yield release
    finally:
        release.set()
        loop.set_default_executor(ThreadPoolExecutor())
        executor.shutdown(wait=True)


async def test_a_sigterm_during_a_sample_write_finishes_it_before_the_episode_counts(
    tmp_path: Path, rows: tuple[TaskRow, ...], one_busy_worker: threading.Event
) -> None:
    loop = asyncio.get_running_loop()
    queued = asyncio.Event()

    async def source(episode: PlannedEpisode) -> list[Any]:
        if episode.index == 0:
            loop.call_soon(queued.set)  # its write is queued once this returns
            return [finished_sample(episode)]
        await asyncio.Event().wait()  # the others are still running when the signal comes
        raise AssertionError("unreachable")

    out = tmp_path / "run"
    run = Run(out=out, source=source, concurrency=3, title="t", policy="p", agent="a")
    running = asyncio.create_task(run.execute(plan(rows[:1], 3)))
    await queued.wait()
    await asyncio.sleep(0.05)
    os.kill(os.getpid(), signal.SIGTERM)  # the run's own handler: stop, cancel the episodes
    loop.call_later(0.3, one_busy_worker.set)  # the thread gets to the write only later
    result = await asyncio.wait_for(running, 30)

    assert result.interrupted
    assert [(r.status, r.reason) for r in result.records] == [
        ("completed", "every wanted test passes"),
        ("aborted", INTERRUPTED),
        ("aborted", INTERRUPTED),
    ]
    written = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [sample["index"] for sample in written] == [0]
    document = json.loads((out / "run.json").read_text())
    assert document["interrupted"] is True
    completed = {e["index"] for e in document["episodes"] if e["status"] == "completed"}
    assert completed == {0}
    # Stopped episodes are not a silent failure: no alarm, and the gates counted only the one
    # that ran to its outcome.
    assert document["alarms"] == []
    assert document["gates"]["zero_trainable"]["episodes"] == 1
    assert not (out / ".run.json.partial").exists()


async def test_a_run_without_a_terminal_prints_a_line_per_finished_episode(
    tmp_path: Path, rows: tuple[TaskRow, ...]
) -> None:
    async def source(episode: PlannedEpisode) -> list[Any]:
        return [finished_sample(episode, reward=float(episode.index % 2))]

    screen = io.StringIO()
    console = Console(file=screen, width=200)
    assert not console.is_terminal
    run = Run(
        out=tmp_path / "run",
        source=source,
        concurrency=1,
        title="t",
        policy="p",
        agent="a",
        console=console,
    )
    await run.execute(plan(rows[:1], 2))
    printed = screen.getvalue().splitlines()
    assert printed[0] == "running 2 episodes, 1 at a time"
    lines = [line for line in printed if line.startswith("episode ")]
    instance = rows[0].task.instance_id
    assert [line.split(":", 1)[0] for line in lines] == [
        "episode 1/2 finished",
        "episode 2/2 finished",
    ]
    assert sorted(line.split(": ", 1)[1] for line in lines) == [
        f"00000-{instance}, completed, reward 0",
        f"00001-{instance}, completed, reward 1",
    ]
