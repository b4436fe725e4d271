"""What slime-backend's generate function adds to an agent episode, locally and over Ray.

    uv run tools/bench/slime_generate_bench.py                       # local, 1/64/256 episodes
    uv run tools/bench/slime_generate_bench.py --ray --episodes 1,64   # also a 2-node Ray cluster
    uv run tools/bench/slime_generate_bench.py --padding 0,2000       # trained tokens per turn

Every episode is the test suite's scripted agent (``packages/slime-backend/tests/rollout_kit.py``):
three model calls over the official ``anthropic`` SDK through the real adapter (Qwen3 tokenizer
and template from a checkpoint directory) to the SGLang-wire engine double, which runs in a
process of its own (as the engine would), so this process's CPU time is the rollout side's.
``--padding`` adds that many words to each reply, so trained tokens grow. The episodes of a row
start together, as slime starts a rollout batch.

Here the agents and the adapter share this process and its event loop (in production the agents
run in sandboxes), so wall time mostly measures queueing behind the agents' own CPU work. The
overhead is therefore measured side by side in CPU time: ``bare`` runs the same episodes
directly on a running adapter (session open, the app's function, session close) and
``generate`` runs them through the generate function as slime does (settings, sampling check,
the episode, conversion to samples off the loop, and with ``--ray`` the hop to a worker
process); ``overhead CPU`` is the difference per episode, and per trained token. For Ray, only
this process's CPU is counted: the driver's share (dispatch, the report's JSON, conversion),
which is what slime's rollout process pays; the episodes run in the workers. ``wall overhead``
is each generate call's wall time minus the time inside the app's function (measured by the
generate function), waiting for the shared loop included; of it, ``convert`` is the conversion
to samples and ``ray hop`` the report's trip from the worker (both as the episode's provenance
records them). ``start`` is the first call, which starts the adapter (checkpoint, engine client,
listener) or the Ray workers, once per process. Target: overhead under 50 ms per episode, linear
in trained tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

TESTS = Path(__file__).resolve().parents[2] / "packages" / "slime-backend" / "tests"
sys.path.insert(0, str(TESTS))

from rollout_kit import (  # noqa: E402
    AgentModel,
    base_group,
    scripted_episode,
)

from protocol_adapters import QwenTokenizerConfig, load_qwen3_vocabulary  # noqa: E402
from protocol_adapters.testing import EngineDouble  # noqa: E402
from protocol_adapters.testing.checkpoint import write_checkpoint  # noqa: E402
from protocol_adapters.testing.stack import VocabularyTokenizer  # noqa: E402
from slime_backend import (  # noqa: E402
    AdapterSession,
    AgentSettings,
    BackendSettings,
    Budgets,
    EpisodeSettings,
    WorkerSettings,
)
from slime_backend._rollout_args import RolloutArgs  # noqa: E402
from slime_backend._runtime import AdapterRuntime, RuntimeSetup  # noqa: E402
from slime_backend._sampling import rollout_sampling  # noqa: E402
from slime_backend.generate import make_generate  # noqa: E402
from slime_backend.testing import (  # noqa: E402
    StandInSample,
    slime_args,
    slime_sampling_params,
)

COLUMNS = (
    "mode",
    "episodes",
    "trained tok/ep",
    "start ms",
    "bare CPU ms/ep",
    "generate CPU ms/ep",
    "overhead CPU ms/ep",
    "us CPU/trained tok",
    "wall overhead mean",
    "wall overhead p99",
    "convert ms",
    "ray hop ms",
    "aborted",
)


def settings(mode: str) -> BackendSettings:
    return BackendSettings(
        EpisodeSettings("rollout_kit.generate", wall_clock_s=600.0, max_turns=20),
        AgentSettings("scripted"),
        workers=WorkerSettings(mode="ray" if mode == "ray" else "local"),
    )


async def timed(generate: Any, args: Any, sample: StandInSample) -> tuple[float, list[Any]]:
    """One generate call as slime makes it, timed from its first line to its return."""
    sample.session_id = str(uuid.uuid4())
    params = slime_sampling_params(args)
    start = time.perf_counter()
    samples: list[Any] = await generate(args, sample, params, evaluation=False)
    return time.perf_counter() - start, samples


async def bare(runtime: AdapterRuntime, args: Any, episodes: int) -> float:
    """CPU seconds per episode of the same episodes run directly on a running adapter: a session
    opened, the app's function, the session closed (what any adapter-based episode costs)."""
    sampling = rollout_sampling(slime_sampling_params(args), ())
    server = await runtime.adapter(sampling)
    budgets = Budgets(600.0, 20, server.sessions.resolve_context(server.config.limits), 8192)

    async def one(number: int) -> None:
        session = server.sessions.open(f"bare-{number}")
        agent = AdapterSession(server.url, session.token, f"bare-{number}")
        await scripted_episode({"reward": 1.0}, agent, budgets, evaluation=False)
        await server.close_session(session.token)

    await one(-1)  # warm the adapter's caches as generate's warm-up does
    cpu = time.process_time()
    await asyncio.gather(*(one(n) for n in range(episodes)))
    return (time.process_time() - cpu) / episodes


async def serve_double(padding: int, cache: Path) -> None:
    """The engine double with the scripted model, in a process of its own (``--serve-double``):
    its URL on stdout, then serving until stdin closes."""
    vocabulary = load_qwen3_vocabulary(QwenTokenizerConfig(cache))
    model = AgentModel(vocabulary, padding=" word" * padding)
    async with EngineDouble(
        VocabularyTokenizer(vocabulary), model, incremental_streaming=True, tokens_per_chunk=16
    ) as double:
        print(double.url, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


async def row(mode: str, episodes: int, padding: int, cache: Path, checkpoint: Path) -> list[str]:
    engine = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--serve-double",
        str(padding),
        "--tokenizer-cache",
        str(cache),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert engine.stdin is not None
    assert engine.stdout is not None
    try:
        url = (await engine.stdout.readline()).decode().strip()
        args = slime_args(url, checkpoint, settings(mode), rollout_max_response_len=8192)
        floor = 0.0
        if mode == "local":
            runtime = AdapterRuntime(RuntimeSetup(RolloutArgs.from_args(args), settings(mode)))
            try:
                floor = await bare(runtime, args, episodes)
            finally:
                await runtime.aclose()
        generate = make_generate(scripted_episode, sample_class=StandInSample)
        try:
            warm, _ = await timed(generate, args, base_group(0, 1, 0, [{"reward": 1.0}])[0])
            batch = base_group(1, episodes, 1000, [{"reward": 1.0}])
            cpu = time.process_time()
            results = await asyncio.gather(*(timed(generate, args, s) for s in batch))
            used = (time.process_time() - cpu) / episodes
        finally:
            await generate.aclose()
    finally:
        engine.stdin.close()
        await engine.wait()
    walls, trained, aborted, converts, hops = [], [], [], [], []
    for elapsed, samples in results:
        facts = samples[0].metadata["agent_rl"]["episode"]
        if facts["status"] != "completed":
            aborted.append(facts["reason"])
            continue
        walls.append(elapsed - facts["rollout"]["app_s"])
        trained.append(facts["trained_tokens"])
        converts.append(facts["rollout"]["convert_s"])
        hops.append(facts["rollout"].get("ray_hop_s", 0.0))
    for reason in sorted(set(aborted)):
        print(f"{mode} x{episodes}: {aborted.count(reason)} aborted: {reason}", file=sys.stderr)
    walls.sort()
    p99 = walls[min(len(walls) - 1, int(len(walls) * 0.99))]
    overhead = used - floor
    return [
        mode,
        str(episodes),
        f"{statistics.mean(trained):,.0f}",
        f"{warm * 1000:.0f}",
        f"{floor * 1000:.1f}" if mode == "local" else "-",
        f"{used * 1000:.1f}",
        f"{overhead * 1000:.1f}",
        f"{overhead * 1e6 / statistics.mean(trained):.2f}",
        f"{statistics.mean(walls) * 1000:.1f}",
        f"{p99 * 1000:.1f}",
        f"{statistics.mean(converts) * 1000:.2f}",
        f"{statistics.mean(hops) * 1000:.1f}" if mode == "ray" else "-",
        str(len(aborted)),
    ]


def start_ray() -> Any:
    """A head and one more node on loopback (see the Ray tests for why the switches)."""
    import ray
    import ray._private.ray_constants as constants
    from ray.cluster_utils import Cluster

    constants.ENABLE_RAY_CLUSTER = False
    constants.RAY_ENABLE_UV_RUN_RUNTIME_ENV = False
    os.environ["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])
    )
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": False},
    )
    cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
    ray.init(address=cluster.address, _node_ip_address="127.0.0.1", logging_level=logging.WARNING)
    cluster.wait_for_nodes()
    return cluster


async def table(
    modes: Sequence[str], counts: Sequence[int], paddings: Sequence[int], cache: Path
) -> Table:
    vocabulary = load_qwen3_vocabulary(QwenTokenizerConfig(cache))
    checkpoint = write_checkpoint(Path(tempfile.mkdtemp()) / "Qwen3-Bench", vocabulary)
    del vocabulary  # the engine double's process loads its own
    result = Table(title="generate-function overhead per episode (ms unless noted)")
    for column in COLUMNS:
        result.add_column(column, justify="right")
    for mode in modes:
        for padding in paddings:
            for episodes in counts:
                cells = await row(mode, episodes, padding, cache, checkpoint)
                print(" | ".join(cells), file=sys.stderr, flush=True)
                result.add_row(*cells)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", default="1,64,256", help="concurrent episodes per row")
    parser.add_argument("--padding", default="0,2000", help="words added to every reply")
    parser.add_argument("--ray", action="store_true", help="also run over a 2-node Ray cluster")
    parser.add_argument(
        "--tokenizer-cache",
        type=Path,
        default=Path.home() / ".cache" / "agent-rl" / "qwen3-tokenizer",
        help="where the offline Qwen3 tokenizer is built once",
    )
    parser.add_argument("--serve-double", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    if args.serve_double is not None:
        asyncio.run(serve_double(args.serve_double, args.tokenizer_cache))
        return 0
    modes = ["local", *(["ray"] if args.ray else [])]
    cluster = start_ray() if args.ray else None
    try:
        console = Console(width=200)
        load = os.getloadavg()
        console.print(
            f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, {os.cpu_count()} cores"
        )
        counts = [int(n) for n in args.episodes.split(",")]
        paddings = [int(n) for n in args.padding.split(",")]
        console.print(asyncio.run(table(modes, counts, paddings, args.tokenizer_cache)))
    finally:
        if cluster is not None:
            import ray

            ray.shutdown()
            cluster.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
