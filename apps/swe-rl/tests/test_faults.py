"""Faults end one episode with a clear reason, never the run, and nothing written is lost.

Each episode fault runs through the real episode: the real Claude Code in a real sandbox
through the real adapter and the engine double.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness import ClaudeCode, InstallConfig
from protocol_adapters import AdapterConfig, SessionLimits, Vocabulary
from protocol_adapters.testing import EngineDouble, Faults, ScriptedReply
from protocol_adapters.testing.stack import LocalStack, local_stack
from sandbox import LocalBackend, LocalConfig
from slime_backend import AdapterSession, Budgets, EpisodeOutcome, EpisodeStatus
from swe_rl.demo.policy import DemoPolicy
from swe_rl.demo.repos import create_demo_tasks
from swe_rl.episode import EpisodeConfig, SweEpisode
from swe_rl.run import PlannedEpisode, Run, plan
from swe_rl.task_file import parse_task_lines

from .provenance_kit import provenance_sample

CONTEXT = 32768


@dataclass(slots=True)
class EngineGoesAway:
    """The demo policy for one reply, then the engine fails every request (HTTP 503)."""

    policy: DemoPolicy
    double: EngineDouble | None = None

    def __call__(self, input_ids: Sequence[int]) -> ScriptedReply:
        assert self.double is not None
        self.double.faults = Faults(http_status=503)  # from the next request on
        return self.policy(input_ids)


@dataclass(slots=True)
class Setup:
    stack: LocalStack
    episode: SweEpisode
    calc: dict[str, Any]

    async def run(
        self, task: dict[str, Any], *, token: str | None = None, wall_clock_s: float = 60.0
    ) -> EpisodeOutcome:
        name = f"fault-{uuid.uuid4().hex[:8]}"  # session ids are unique, as slime's are
        session = self.stack.server.sessions.open(name)
        budgets = Budgets(wall_clock_s, 50, CONTEXT, 2048)
        adapter = AdapterSession(self.stack.server.url, token or session.token, name)
        try:
            return await self.episode(task, adapter, budgets, evaluation=False)
        finally:
            await self.stack.server.close_session(session.token)


@pytest.fixture
async def setup(
    qwen_vocabulary: Vocabulary, install_config: InstallConfig, tmp_path: Path
) -> AsyncIterator[Setup]:
    rows = create_demo_tasks(tmp_path / "repos")
    (tmp_path / "state").mkdir()
    episode = SweEpisode(
        EpisodeConfig(
            artifacts_root=tmp_path / "artifacts",
            install=install_config,
            sources_cache=tmp_path / "sources",
            setup_timeout_s=1.0,
        ),
        ClaudeCode(),
        LocalBackend(LocalConfig(state_root=tmp_path / "state")),
    )
    script = EngineGoesAway(DemoPolicy(qwen_vocabulary, plans=("fix",)))
    config = AdapterConfig(limits=SessionLimits(context_tokens=CONTEXT))
    async with local_stack(
        script, tokenizer_cache=tmp_path, vocabulary=qwen_vocabulary, config=config
    ) as stack:
        script.double = stack.double
        stack.double.faults = Faults()
        yield Setup(stack, episode, rows[0]["metadata"])


def aborted(outcome: EpisodeOutcome, reason: str) -> None:
    assert outcome.status is EpisodeStatus.ABORTED, outcome
    assert reason in outcome.reason, outcome.reason


@pytest.mark.slow
async def test_each_episode_fault_is_an_aborted_outcome_with_its_reason(setup: Setup) -> None:
    missing = {**setup.calc, "repo": {"path": "/nonexistent/repository"}}
    aborted(await setup.run(missing), "repository: ")
    broken = {**setup.calc, "grading": "not an object"}
    aborted(await setup.run(broken), "bad task: grading: is required and must be an object")
    hangs = {**setup.calc, "setup_commands": ["sleep 30"]}
    aborted(await setup.run(hangs), "setup: setup command timed out")
    # A wrong API key: the CLI never gets a model reply (it retries the 401 for minutes).
    # (Budgets leave a loaded machine room to start the CLI and see its first replies.)
    nobody = await setup.run(setup.calc, token="sess-not-a-session", wall_clock_s=20.0)
    aborted(nobody, "the agent used its whole budget (")  # the seconds it took: 20 or more
    assert "authentication_failed, HTTP 401" in nobody.reason
    # The engine answers once, then goes away: the agent cannot finish its work.
    gone = await setup.run(setup.calc, wall_clock_s=24.0)
    aborted(gone, "the agent used its whole budget (")
    assert "HTTP 529" in gone.reason or "HTTP 503" in gone.reason


async def test_a_full_disk_loses_no_run_and_says_which_samples_were_not_written(
    tmp_path: Path, qwen_vocabulary: Vocabulary
) -> None:
    repos = create_demo_tasks(tmp_path / "repos")
    rows = parse_task_lines([json.dumps(row) for row in repos]).rows

    async def source(episode: PlannedEpisode) -> list[Any]:
        return [provenance_sample(episode, EpisodeOutcome(1.0), turns=3)]

    out = tmp_path / "run"
    out.mkdir()
    (out / "samples.jsonl").symlink_to("/dev/full")  # every write: ENOSPC
    run = Run(out=out, source=source, concurrency=2, title="t", policy="p", agent="a")
    result = await run.execute(plan(rows, 2))
    assert len(result.write_errors) == 6
    assert all("No space left on device" in problem for problem in result.write_errors)
    written = json.loads((out / "run.json").read_text())
    assert [e["status"] for e in written["episodes"]] == ["completed"] * 6
    assert len(written["sample_write_errors"]) == 6
