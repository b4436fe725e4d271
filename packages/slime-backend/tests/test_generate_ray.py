"""Rollout workers on a real multi-node Ray cluster (several nodes on this machine, on loopback).

The cluster is Ray's own ``ray.cluster_utils.Cluster``: a head and more nodes, each its own
raylet with its own resources; the generate function runs in this process (slime's rollout
process in production) and sends real episodes (the scripted agent on the anthropic SDK) to one
worker per node, whose adapter talks to the engine double here. Needs
``agent-rl-slime-backend[ray]``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from rollout_kit import (
    AgentModel,
    assert_engine_tokens_trained,
    base_group,
    run_group,
    scripted_episode,
)

from protocol_adapters import Vocabulary
from protocol_adapters.testing import EngineDouble
from protocol_adapters.testing.stack import VocabularyTokenizer
from slime_backend import (
    AdapterSettings,
    AgentSettings,
    BackendSettings,
    EpisodeSettings,
    WorkerSettings,
)
from slime_backend.generate import SlimeGenerate, make_generate
from slime_backend.testing import StandInSample, slime_args, slime_sampling_params

try:
    import ray  # type: ignore[import-not-found, unused-ignore]  # an optional extra
    from ray.cluster_utils import Cluster  # type: ignore[import-not-found, unused-ignore]
except ImportError:  # pragma: no cover - CI installs the extra
    REASON = (
        "!!! RAY IS NOT INSTALLED: the multi-node rollout worker tests are SKIPPED. Install the "
        "extra with `uv sync --extra ray` to run them. !!!"
    )
    warnings.warn(REASON, stacklevel=1)
    pytestmark = pytest.mark.skip(reason=REASON)

NODES = 3
HERE = str(Path(__file__).resolve().parent)


@pytest.fixture(scope="module")
def cluster() -> Iterator[list[str]]:
    """A head and two more nodes, every one bound to 127.0.0.1; yields their node ids.

    Ray replaces a loopback address with the machine's outward one when connecting unless told
    this is not a multi-machine cluster, and under ``uv run`` it would re-create the environment
    for every worker; both are switched off for this process. Workers find ``rollout_kit`` (the
    app's episode) through ``PYTHONPATH``, as a real app is installed on every node.
    """
    import ray._private.ray_constants as constants

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(constants, "ENABLE_RAY_CLUSTER", False)
        patch.setattr(constants, "RAY_ENABLE_UV_RUN_RUNTIME_ENV", False)
        patch.setenv("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
        patch.setenv(
            "PYTHONPATH", os.pathsep.join(filter(None, [HERE, os.environ.get("PYTHONPATH")]))
        )
        nodes = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 1,
                "node_ip_address": "127.0.0.1",
                "include_dashboard": False,
            },
        )
        for _ in range(NODES - 1):
            nodes.add_node(num_cpus=1, node_ip_address="127.0.0.1")
        ray.init(address=nodes.address, _node_ip_address="127.0.0.1", logging_level=logging.WARNING)
        try:
            nodes.wait_for_nodes()
            yield [n["NodeID"] for n in ray.nodes() if n["Alive"]]  # type: ignore[no-untyped-call]
        finally:
            ray.shutdown()
            nodes.shutdown()  # type: ignore[no-untyped-call]


def settings(**workers: Any) -> BackendSettings:
    return BackendSettings(
        EpisodeSettings("rollout_kit.generate", wall_clock_s=120.0, max_turns=20, grace_s=60.0),
        AgentSettings("scripted"),
        adapter=AdapterSettings(check_sample_rate=1.0),
        workers=WorkerSettings(mode="ray", **workers),
    )


@pytest.fixture
async def model(qwen_vocabulary: Vocabulary) -> AsyncIterator[tuple[EngineDouble, AgentModel]]:
    agent = AgentModel(qwen_vocabulary)
    async with EngineDouble(
        VocabularyTokenizer(qwen_vocabulary), agent, incremental_streaming=True
    ) as double:
        agent.double = double
        yield double, agent


@pytest.fixture
async def generate() -> AsyncIterator[SlimeGenerate]:
    function = make_generate(scripted_episode, sample_class=StandInSample)
    yield function
    await function.aclose()


def workers_of(results: list[list[Any]]) -> list[str]:
    return [samples[0].metadata["agent_rl"]["episode"]["rollout"]["worker"] for samples in results]


async def test_episodes_spread_over_one_worker_per_node_and_come_back_whole(
    cluster: list[str],
    model: tuple[EngineDouble, AgentModel],
    generate: SlimeGenerate,
    qwen_checkpoint: Path,
) -> None:
    double, agent = model
    args = slime_args(double.url, qwen_checkpoint, settings())
    payloads = [{"reward": 1.0}, {"reward": 0.0, "subagent": True}]
    groups = [base_group(g, 6, 10 * g, payloads) for g in range(2)]
    batch = await asyncio.gather(
        *(run_group(generate, args, g, slime_sampling_params(args)) for g in groups)
    )
    pool = generate.pool
    assert pool is not None
    assert sorted(s.node_id for s in pool.slots) == sorted(cluster)  # one worker per node
    results = [samples for group in batch for samples in group]
    ran_on = workers_of(results)
    assert sorted(set(ran_on)) == sorted(cluster)  # pinned: each ran where it was placed
    assert sorted(ran_on.count(n) for n in cluster) == [4, 4, 4]  # least-loaded: 12 over 3
    rollouts = [s[0].metadata["agent_rl"]["episode"]["rollout"] for s in results]
    assert all(0 <= r["ray_hop_s"] < 60 for r in rollouts)
    adapters = {r["adapter"] for r in rollouts}
    assert len(adapters) == NODES  # one adapter per worker process
    for group, outcomes in zip(groups, batch, strict=True):
        for base, samples in zip(group, outcomes, strict=True):
            assert len(samples) == (2 if base.metadata.get("subagent") else 1)
            for sample in samples:
                assert sample.status is StandInSample.Status.COMPLETED
                assert sample.rollout_id == base.index
                assert sample.reward == base.metadata["reward"]
            assert_engine_tokens_trained(samples, double, agent)


async def test_a_worker_killed_mid_episode_aborts_only_its_episodes(
    cluster: list[str],
    model: tuple[EngineDouble, AgentModel],
    generate: SlimeGenerate,
    qwen_checkpoint: Path,
) -> None:
    double, _ = model
    args = slime_args(double.url, qwen_checkpoint, settings())
    params = slime_sampling_params(args)
    hung = asyncio.ensure_future(
        run_group(generate, args, base_group(0, 1, 0, [{"hang": True}]), params)
    )
    while not double.requests:  # the hanging episode has made its first model call
        await asyncio.sleep(0.05)
    pool = generate.pool
    assert pool is not None
    (victim,) = [s for s in pool.slots if s.in_flight]
    ray.kill(victim.actor)
    ((samples,),) = [await asyncio.wait_for(hung, 60)]
    (sample,) = samples
    assert sample.status is StandInSample.Status.ABORTED
    assert sample.remove_sample
    reason = sample.metadata["agent_rl"]["episode"]["reason"]
    assert reason.startswith(f"the rollout worker on node {victim.node_id} died during the episode")

    after = await run_group(generate, args, base_group(1, 6, 10, [{"reward": 1.0}]), params)
    assert all(s[0].status is StandInSample.Status.COMPLETED for s in after)
    assert sorted(set(workers_of(after))) == sorted(cluster)  # the node got a new worker
    assert victim not in pool.slots


async def test_a_per_worker_cap_queues_episodes_instead_of_overloading_a_node(
    cluster: list[str],
    model: tuple[EngineDouble, AgentModel],
    generate: SlimeGenerate,
    qwen_checkpoint: Path,
) -> None:
    double, _ = model
    args = slime_args(double.url, qwen_checkpoint, settings(max_episodes_per_worker=1))
    params = slime_sampling_params(args)
    seen: list[int] = []

    async def watch() -> None:
        while True:
            pool = generate.pool
            if pool is not None:
                seen.append(max((s.in_flight for s in pool.slots), default=0))
            await asyncio.sleep(0.01)

    watcher = asyncio.ensure_future(watch())
    try:
        results = await run_group(
            generate, args, base_group(0, 6, 0, [{"reward": 1.0, "sleep_s": 0.2}]), params
        )
    finally:
        watcher.cancel()
    assert all(s[0].status is StandInSample.Status.COMPLETED for s in results)
    assert max(seen) == 1
