"""The app's one reader of slime-backend's provenance, on samples slime-backend's writer made:
every fact run.json and `swe-rl check` show, and a sample without its provenance named."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from slime_backend import (
    NAMESPACE,
    ConversionOptions,
    EpisodeOutcome,
    EpisodeStatus,
    episode_samples,
)
from slime_backend.testing import StandInSample
from swe_rl.demo.repos import create_demo_tasks
from swe_rl.provenance import episode_facts
from swe_rl.run import PlannedEpisode, Run, plan
from swe_rl.task_file import parse_task_lines
from trajectory_tree import (
    Completion,
    FinishReason,
    FullPrompt,
    Message,
    Prompt,
    SessionTree,
    Text,
    ToolCall,
    linearize,
)

ARTIFACTS: dict[str, Any] = {"dir": "/runs/r/episodes/e", "grading": {"verdict": "resolved"}}


def one_call() -> SessionTree:
    """An episode of one model call answering with a tool call."""
    tree = SessionTree("episode")
    route = tree.route(Prompt((Message("user", (Text("fix it"),)),)))
    completion = Completion([9, 10, 11], [-0.5, -0.25, -0.1], FinishReason.STOP)
    call = ToolCall("call-0", "bash", '{"cmd": "ls"}')
    reply = Message("assistant", (Text("ok"), call))
    tree.record(route, FullPrompt([5, 6, 7], 1, "first call"), completion, reply)
    return tree


def convert(tree: SessionTree, outcome: EpisodeOutcome) -> list[StandInSample]:
    samples: list[StandInSample] = episode_samples(
        tree,
        StandInSample(index=4, group_index=1),
        outcome,
        ConversionOptions(),
        sample_class=StandInSample,
    )
    return samples


def test_the_facts_of_an_episode_are_what_slime_backend_wrote() -> None:
    tree = one_call()
    outcome = EpisodeOutcome(1.0, EpisodeStatus.COMPLETED, "every wanted test passes", ARTIFACTS)
    samples = convert(tree, outcome)
    facts = episode_facts(samples)
    assert facts.outcome == outcome
    assert facts.turns == 1
    assert (facts.health.tool_calls, facts.health.malformed_tool_calls) == (1, 0)
    assert facts.health.trained_tokens == 3
    masked = sum(sum(s.masked_tokens().values()) for s in linearize(tree).samples)
    assert facts.masked_tokens == masked > 0
    # The same, read back from the JSON a run writes (samples.jsonl).
    for sample in samples:
        sample.metadata = json.loads(json.dumps(sample.metadata))
    assert episode_facts(samples) == facts


def test_an_episode_with_nothing_to_train_masks_nothing_on_its_placeholder() -> None:
    facts = episode_facts(convert(SessionTree("episode"), EpisodeOutcome.aborted("sandbox: down")))
    assert facts.outcome == EpisodeOutcome.aborted("sandbox: down")
    assert (facts.turns, facts.masked_tokens, facts.health.trained_tokens) == (0, 0, 0)


@pytest.mark.parametrize(("record", "key"), [("episode", "turns"), ("sample", "masked_tokens")])
def test_a_fact_the_provenance_lacks_is_named(record: str, key: str) -> None:
    samples = convert(one_call(), EpisodeOutcome(1.0))
    del samples[0].metadata[NAMESPACE][record][key]
    with pytest.raises(ValueError, match=rf"metadata\['agent_rl'\]\.{record} has no '{key}'"):
        episode_facts(samples)


async def test_a_run_whose_samples_carry_no_provenance_stops_and_says_which_key(
    tmp_path: Path,
) -> None:
    rows = parse_task_lines([json.dumps(r) for r in create_demo_tasks(tmp_path / "repos")]).rows

    async def source(episode: PlannedEpisode) -> list[Any]:
        return [StandInSample(index=episode.index, group_index=episode.group, metadata={})]

    run = Run(out=tmp_path / "run", source=source, concurrency=1, title="t", policy="p", agent="a")
    result = await run.execute(plan(rows[:1], 2))
    assert result.failure is not None
    assert result.failure.startswith("failed: ProvenanceError: the sample carries no ")
    assert "metadata['agent_rl']" in result.failure
    assert all(record.status is EpisodeStatus.ABORTED for record in result.records)
