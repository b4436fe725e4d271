"""An episode's optional hooks: `configure(settings)` before it runs in a process, and
`finished(tree, outcome)` with the closed session's tree after it ran."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path

from rollout_kit import AgentModel, base_group, scripted_episode

from protocol_adapters import Vocabulary
from protocol_adapters.testing import EngineDouble
from protocol_adapters.testing.stack import VocabularyTokenizer
from slime_backend import (
    AdapterSession,
    AgentSettings,
    BackendSettings,
    Budgets,
    EpisodeOutcome,
    EpisodeSettings,
    JsonValue,
)
from slime_backend.generate import make_generate
from slime_backend.testing import StandInSample, slime_args, slime_sampling_params
from trajectory_tree import SessionTree


class HookedEpisode:
    def __init__(self) -> None:
        self.configured: list[BackendSettings] = []
        self.finished_with: list[tuple[SessionTree, EpisodeOutcome, str]] = []

    def configure(self, settings: BackendSettings) -> None:
        self.configured.append(settings)

    async def __call__(
        self,
        task: Mapping[str, JsonValue],
        session: AdapterSession,
        budgets: Budgets,
        *,
        evaluation: bool,
    ) -> EpisodeOutcome:
        return await scripted_episode(task, session, budgets, evaluation=evaluation)

    def finished(self, tree: SessionTree, outcome: EpisodeOutcome) -> None:
        self.finished_with.append((tree, outcome, threading.current_thread().name))


async def test_configure_before_and_finished_after_each_episode(
    qwen_vocabulary: Vocabulary, qwen_checkpoint: Path
) -> None:
    episode = HookedEpisode()
    settings = BackendSettings(
        EpisodeSettings("rollout_kit.generate", wall_clock_s=60.0, grace_s=30.0),
        AgentSettings("scripted", {"flavour": "plain"}),
    )
    agent = AgentModel(qwen_vocabulary)
    async with EngineDouble(
        VocabularyTokenizer(qwen_vocabulary), agent, incremental_streaming=True
    ) as double:
        agent.double = double
        args = slime_args(double.url, qwen_checkpoint, settings)
        generate = make_generate(episode, sample_class=StandInSample)
        try:
            (base,) = base_group(0, 1, 0, [{"reward": 1.0}])
            samples = await generate(args, base, slime_sampling_params(args))
        finally:
            await generate.aclose()
    assert episode.configured == [settings]
    ((tree, outcome, thread),) = episode.finished_with
    assert outcome.reward == 1.0
    assert tree.session_id == base.session_id
    assert tree.turns  # closed, with every turn the episode made
    assert thread != threading.main_thread().name  # off the event loop
    assert samples[0].reward == 1.0
