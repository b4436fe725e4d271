"""Per-rollout weight-version metrics: the share of samples spanning versions, the lag
histogram, and the gate hook reporting them for a batch."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest
from episode_kit import Recorder, base_sample, system, tool, user

from slime_backend import (
    NAMESPACE,
    AgentSettings,
    BackendSettings,
    ConversionOptions,
    EpisodeOutcome,
    EpisodeSettings,
    GateConfig,
    StaleAction,
    StalenessPolicy,
    episode_samples,
)
from slime_backend._provenance import SampleVersions
from slime_backend._version_metrics import version_metrics
from slime_backend.gate_hook import check_rollout_batch
from slime_backend.testing import StandInSample


def record(oldest: str, newest: str, max_lag: int = 0) -> SampleVersions:
    return SampleVersions(oldest, newest, span=0, max_lag=max_lag, runs=2)


def test_lag_counts_updates_from_the_rollouts_newest_version() -> None:
    metrics = version_metrics(
        [record("1", "1"), record("2", "3"), record("3", "3"), record("default", "1"), None]
    )
    assert metrics.samples == 4
    assert metrics.unversioned == 1
    assert metrics.multi_version == 2
    assert metrics.multi_version_share == 0.5
    assert metrics.newest == "3"
    assert metrics.lag_basis == "rollout"
    assert dict(metrics.lag_histogram) == {0: 1, 1: 1, 2: 1, 3: 1}
    assert metrics.as_dict()["lag_histogram"] == {"0": 1, "1": 1, "2": 1, "3": 1}


def test_versions_named_otherwise_fall_back_to_the_lag_within_each_episode() -> None:
    metrics = version_metrics([record("a", "b", max_lag=1), record("c", "c", max_lag=0)])
    assert (metrics.lag_basis, metrics.newest) == ("episode", None)
    assert dict(metrics.lag_histogram) == {0: 1, 1: 1}
    assert metrics.multi_version_share == 0.5


def test_an_empty_batch_has_no_lag() -> None:
    metrics = version_metrics([])
    assert (metrics.samples, metrics.multi_version_share, metrics.lag_histogram) == (0, 0.0, ())


def episode(index: int, runs: Sequence[Sequence[tuple[int, str]]]) -> list[StandInSample]:
    """An episode whose turn ``i`` was generated in version runs ``runs[i]``."""
    recorder = Recorder(seed=index)
    messages = [system("main agent"), user("fix the bug")]
    for number, turn_runs in enumerate(runs):
        reply = recorder.turn(
            messages,
            f"step {number}",
            calls=1,
            weight_version=turn_runs[-1][1],
            version_runs=turn_runs if len(turn_runs) > 1 else (),
        )
        messages = [*messages, reply, tool(f"call-{number}-0", f"out {number}")]
    return episode_samples(
        recorder.tree,
        base_sample(index=index, group_index=0),
        EpisodeOutcome(1.0),
        ConversionOptions(staleness=StalenessPolicy(5, StaleAction.KEEP)),
        sample_class=StandInSample,
    )


def test_the_gate_hook_reports_the_batchs_versions(caplog: pytest.LogCaptureFixture) -> None:
    data: list[Any] = [
        [
            episode(0, [[(0, "1")], [(0, "1")]]),
            episode(1, [[(0, "2"), (3, "3")], [(0, "3")]]),  # an update landed mid-call
            episode(2, [[(0, "3")]]),
        ],
        [
            episode_samples(
                Recorder().tree,
                base_sample(index=3, group_index=1),
                EpisodeOutcome.aborted("sandbox never started"),
                ConversionOptions(),
                sample_class=StandInSample,
            )
        ],
    ]
    settings = BackendSettings(
        EpisodeSettings("app.episodes.run"),
        AgentSettings("claude-code"),
        gates=GateConfig(fail_step=False),
    )
    args = SimpleNamespace(**json.loads(settings.custom_config()))
    with caplog.at_level(logging.INFO, logger="slime_backend"):
        check_rollout_batch(args, data)
    expected = {
        "samples": 3,  # the aborted episode's placeholder trains nothing: not counted
        "multi_version": 1,
        "multi_version_share": 1 / 3,
        "lag_histogram": {"0": 1, "1": 1, "2": 1},
        "newest": "3",
        "lag_basis": "rollout",
        "unversioned": 0,
    }
    samples = [s for group in data for result in group for s in result]
    assert all(s.metadata[NAMESPACE]["weight_versions"] == expected for s in samples)
    assert "agent-rl weight versions of 4 samples" in caplog.text
    assert "'multi_version_share': 0.333" in caplog.text
