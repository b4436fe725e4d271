"""The episode end to end: the real Claude Code in a real sandbox, through the real adapter, with
the demo's scripted policy as the engine double's "model"; graded for real; the session tree
trains exactly the engine's tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import ClaudeCode, InstallConfig
from protocol_adapters import AdapterConfig, RendererConfig, SessionLimits, Vocabulary
from protocol_adapters.testing.stack import local_stack
from protocol_adapters.testing.trust import check_engine_tokens_trained
from sandbox import LocalBackend, LocalConfig
from slime_backend import AdapterSession, Budgets, EpisodeStatus
from swe_rl.demo.policy import DemoPolicy
from swe_rl.demo.repos import create_demo_tasks
from swe_rl.episode import EpisodeConfig, SweEpisode
from trajectory_tree import linearize

CONTEXT = 32768


@pytest.mark.slow
async def test_episodes_of_each_plan_are_graded_and_trained_faithfully(
    qwen_vocabulary: Vocabulary, install_config: InstallConfig, tmp_path: Path
) -> None:
    rows = create_demo_tasks(tmp_path / "repos")
    calc = rows[0]["metadata"]
    plans = ("fix", "cheat", "wrong", "skip")
    policy = DemoPolicy(qwen_vocabulary, plans=plans)
    (tmp_path / "state").mkdir()
    episode = SweEpisode(
        EpisodeConfig(
            artifacts_root=tmp_path / "artifacts",
            install=install_config,
            sources_cache=tmp_path / "sources",
        ),
        ClaudeCode(),
        LocalBackend(LocalConfig(state_root=tmp_path / "state")),
    )
    budgets = Budgets(wall_clock_s=120, max_turns=50, context_tokens=CONTEXT, max_new_tokens=2048)
    config = AdapterConfig(limits=SessionLimits(context_tokens=CONTEXT))
    async with local_stack(
        policy,
        tokenizer_cache=tmp_path,
        vocabulary=qwen_vocabulary,
        config=config,
        renderer_config=RendererConfig(check_sample_rate=1.0),
    ) as stack:
        rewards = {}
        for plan in plans:
            session = stack.server.sessions.open(f"calc-{plan}")
            outcome = await episode(
                calc,
                AdapterSession(stack.server.url, session.token, session.tree.session_id),
                budgets,
                evaluation=False,
            )
            closed = await stack.server.close_session(session.token)
            assert outcome.status is EpisodeStatus.COMPLETED, outcome.reason
            rewards[plan] = outcome.reward
            directory = Path(str(outcome.artifacts["dir"]))
            summary = json.loads((directory / "summary.json").read_text())
            assert summary["reward"] == outcome.reward
            assert (directory / "agent" / "events.jsonl").stat().st_size > 0
            assert (directory / "grading.log").read_text()
            linearization = linearize(closed.tree)
            assert linearization.samples
            check_engine_tokens_trained(stack, closed.tree, linearization)
    assert rewards == {"fix": 1.0, "cheat": 0.0, "wrong": 0.0, "skip": 0.0}
