"""The adapter under many concurrent agent sessions: latency it adds per turn, and nothing lost.

    uv run tools/bench/adapter_concurrency_bench.py                     # 100 and 1,000 sessions
    uv run tools/bench/adapter_concurrency_bench.py --sessions 1000 --think 0,5,10
    uv run tools/bench/adapter_concurrency_bench.py --sessions 100 --profile

Three processes, as in production: the engine double (SGLang's ``/generate`` wire, a fixed
``Faults(latency=0.05)`` before every answer, one token per streamed chunk like SGLang's default
stream interval), the adapter (the real ``AdapterServer``: Anthropic dialect, bridge renderer
with the real Qwen3 tokenizer, SGLang client with one connection per session, session trees;
sessions opened and closed through its admin API), and this process as the clients: **raw
aiohttp**, one pooled ``ClientSession`` with one connection per session, speaking Anthropic
Messages with ``stream: true`` as Claude Code does.

Each session runs ``--turns`` model calls. Every reply is a ``Bash`` tool call; the client echoes
the reply (text + ``tool_use``) and appends a ~0.5 KB ``tool_result``, so every turn routes a
growing history through the tree and bridges a new tool result. About ``--think`` seconds pass
between a reply and the next request (the agent running its tool: uniform in 0.5-1.5x, and the
sessions' first calls spread over one think time, since real agents are not synchronized). 0 is a
closed loop in which every session calls again at once: the saturation point, not an agent.

Columns. "added" = client end-to-end (request sent -> ``message_stop`` read) - the 50 ms engine
latency: both HTTP hops, the adapter's work, queueing behind other sessions, and the double's own
overhead, which is measured alone first (a streamed ``/generate`` straight to the double) and
subtracted in "net of double". "runner" = the adapter's recorded turn time
(``TurnMeta.finished_at - started_at``: routing, rendering, the engine call, parsing; not the
request body's JSON parse or the SSE writes) - 50 ms. "CPU ms/turn" = user + system CPU of each
process over the row / turns: what bounds throughput on 2 cores, whatever else the machine runs.

After each row every session's tree is fetched (closing the session) and checked: turns ==
sessions x turns, each engine request id seen once by the double and once in the trees, and each
session linearizes to one sample with ``--turns`` trained turns and no exclusions. The exit status
is 1 if any check fails.

Targets (2 cores): mean added <= 5 ms, p99 <= 50 ms. ``--profile`` runs the adapter under
cProfile (its event-loop thread only; rendering runs in worker threads) and prints the top
functions by own time; for all threads, attach py-spy to the adapter process instead.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import multiprocessing
import os
import pstats
import random
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import aiohttp
from rich.console import Console
from rich.table import Table

from protocol_adapters import (
    AdapterConfig,
    AdapterServer,
    AdminConfig,
    QwenTokenizerConfig,
    Renderer,
    RendererConfig,
    SessionLimits,
    SGLangConfig,
    SGLangEngine,
    load_qwen3_vocabulary,
    qwen3_template,
    reply_parsers,
)
from protocol_adapters.testing import EngineDouble, Faults, ScriptedReply
from protocol_adapters.testing.stack import VocabularyTokenizer
from trajectory_tree import linearize as linearize_tree
from trajectory_tree import loads

ENGINE_LATENCY = 0.05
CONTEXT_TOKENS = 32768
TARGET_MEAN_MS = 5.0
TARGET_P99_MS = 50.0
REPLY = ScriptedReply(text="Let me look.", tool_calls=[("Bash", {"command": "ls -la src"})])
SYSTEM = (
    "You are a coding agent working in a git repository. Use the tools to inspect and change "
    "files, run the tests, and finish with a short summary of what you changed. "
) * 6
TOOLS = [
    {
        "name": "Bash",
        "description": "Run a shell command in the repository and return its output.",
        "input_schema": {
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "The command line."},
                "timeout": {"type": "number", "description": "Milliseconds before a kill."},
            },
            "required": ["command"],
        },
    },
    {
        "name": "Read",
        "description": "Read a file of the repository.",
        "input_schema": {
            "type": "object",
            "properties": {"file_path": {"type": "string"}},
            "required": ["file_path"],
        },
    },
]


# -- the engine double and the adapter, each in its own process -------------------------------


def engine_process(cache_dir: str, latency: float, tokens_per_chunk: int, conn: Connection) -> None:
    """Serve the double until told to stop; then send back every request id it received."""

    async def serve() -> None:
        vocabulary = load_qwen3_vocabulary(QwenTokenizerConfig(Path(cache_dir)))
        double = EngineDouble(
            VocabularyTokenizer(vocabulary),
            lambda _ids: REPLY,
            faults=Faults(latency=latency),
            incremental_streaming=True,
            tokens_per_chunk=tokens_per_chunk,
            context_length=CONTEXT_TOKENS,
        )
        async with double:
            conn.send(double.url)
            while True:
                await asyncio.to_thread(conn.recv)  # "rids" or "stop"
                rids = [r.rid for r in double.requests]
                double.requests.clear()
                conn.send(rids)

    asyncio.run(serve())


def adapter_process(
    engine_url: str,
    cache_dir: str,
    admin_token: str,
    max_connections: int,
    profile: bool,
    conn: Connection,
) -> None:
    """Serve the adapter until told to stop; then send back the cProfile table, if asked."""

    async def serve() -> None:
        vocabulary = load_qwen3_vocabulary(QwenTokenizerConfig(Path(cache_dir)))
        renderer = Renderer(vocabulary, qwen3_template(), RendererConfig())
        config = AdapterConfig(
            admin=AdminConfig(token=admin_token),
            limits=SessionLimits(max_turns=10_000, context_tokens=CONTEXT_TOKENS),
        )
        engine_config = SGLangConfig(base_url=engine_url, max_connections=max_connections)
        async with (
            SGLangEngine(engine_config) as engine,
            AdapterServer(config, engine, renderer, vocabulary, reply_parsers()) as server,
        ):
            conn.send((server.url, server.admin_url))
            await asyncio.to_thread(conn.recv)

    profiler = cProfile.Profile() if profile else None
    if profiler is not None:
        profiler.enable()
    asyncio.run(serve())
    text = ""
    if profiler is not None:
        profiler.disable()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(25)
        text = out.getvalue()
    conn.send(text)


# -- the clients -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TurnTime:
    session: int
    turn: int
    seconds: float


def tool_output(session: int, turn: int) -> str:
    lines = [f"total {turn * 8 + session % 7}"]
    lines += [
        f"-rw-r--r-- 1 agent agent {1000 + 37 * i + session} Nov 22 04:{i:02d} module_{turn}_{i}.py"
        for i in range(8)
    ]
    return "\n".join(lines)


async def read_reply(response: aiohttp.ClientResponse) -> list[dict[str, Any]]:
    """The assistant content blocks of an Anthropic SSE stream, as a client rebuilds them."""
    blocks: dict[int, dict[str, Any]] = {}
    partial: dict[int, str] = {}
    async for raw in response.content:
        if not raw.startswith(b"data: "):
            continue
        event = json.loads(raw[6:])
        kind = event["type"]
        if kind == "content_block_start":
            blocks[event["index"]] = dict(event["content_block"])
        elif kind == "content_block_delta":
            delta = event["delta"]
            if delta["type"] == "text_delta":
                blocks[event["index"]]["text"] += delta["text"]
            elif delta["type"] == "input_json_delta":
                partial[event["index"]] = partial.get(event["index"], "") + delta["partial_json"]
        elif kind == "error":
            raise RuntimeError(f"in-stream error: {event['error']}")
        elif kind == "message_stop":
            break
    for index, text in partial.items():
        blocks[index]["input"] = json.loads(text)
    return [blocks[i] for i in sorted(blocks)]


async def run_session(
    http: aiohttp.ClientSession,
    url: str,
    token: str,
    session: int,
    turns: int,
    think: float,
    start: asyncio.Event,
) -> list[TurnTime]:
    headers = {"x-api-key": token, "anthropic-version": "2023-06-01"}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": f"Session {session}: find why the tests fail and fix it."}
    ]
    times: list[TurnTime] = []
    rng = random.Random(session)
    await start.wait()
    if think > 0:  # agents are not synchronized: spread the first calls over one think time
        await asyncio.sleep(rng.uniform(0, think))
    for turn in range(turns):
        body = {
            "model": "policy",
            "max_tokens": 1024,
            "stream": True,
            "system": [{"type": "text", "text": SYSTEM}],
            "tools": TOOLS,
            "messages": messages,
        }
        data = json.dumps(body).encode()
        began = time.perf_counter()
        async with http.post(f"{url}/v1/messages", data=data, headers=headers) as response:
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status}: {await response.text()}")
            content = await read_reply(response)
        times.append(TurnTime(session, turn, time.perf_counter() - began))
        uses = [b for b in content if b["type"] == "tool_use"]
        if not uses:
            raise RuntimeError(f"session {session} turn {turn}: no tool call in {content}")
        messages.append({"role": "assistant", "content": content})
        results = [
            {"type": "tool_result", "tool_use_id": u["id"], "content": tool_output(session, turn)}
            for u in uses
        ]
        messages.append({"role": "user", "content": results})
        if think > 0:
            await asyncio.sleep(think * rng.uniform(0.5, 1.5))
    return times


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all its threads (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class Row:
    sessions: int
    turns: int
    think: float
    wall: float
    added_ms: list[float]
    runner_added_ms: list[float]
    cpu_ms_per_turn: dict[str, float]
    """CPU time per turn of each process (adapter, engine double, clients)."""
    problems: list[str]


async def run_row(
    adapter_url: str,
    admin_url: str,
    admin_token: str,
    engine: Connection,
    pids: dict[str, int],
    sessions: int,
    turns: int,
    think: float,
) -> Row:
    admin = {"Authorization": f"Bearer {admin_token}"}
    connector = aiohttp.TCPConnector(limit=sessions + 8, limit_per_host=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:

        async def open_session(i: int) -> str:
            async with http.post(
                f"{admin_url}/admin/sessions", json={"session_id": f"bench-{i}"}, headers=admin
            ) as r:
                return str((await r.json())["token"])

        tokens = await asyncio.gather(*(open_session(i) for i in range(sessions)))
        start = asyncio.Event()
        tasks = [
            asyncio.create_task(run_session(http, adapter_url, t, i, turns, think, start))
            for i, t in enumerate(tokens)
        ]
        await asyncio.sleep(0.2)  # every session is waiting at the start line
        cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        began = time.perf_counter()
        start.set()
        _, stuck = await asyncio.wait(tasks, timeout=turns * (think + 30.0) + 120.0)
        wall = time.perf_counter() - began
        for task in stuck:
            task.cancel()
        if stuck:
            raise RuntimeError(f"{len(stuck)} of {sessions} sessions did not finish in time")
        per_session = [task.result() for task in tasks]
        cpu = {
            name: (cpu_seconds(pid) - cpu_before[name]) * 1000 / (sessions * turns)
            for name, pid in pids.items()
        }

        async def close_session(token: str) -> str:
            async with http.delete(f"{admin_url}/admin/sessions/{token}", headers=admin) as r:
                return await r.text()

        trees = [loads(text) for text in await asyncio.gather(*map(close_session, tokens))]
    engine.send("rids")
    engine_rids: list[str] = await asyncio.to_thread(engine.recv)

    added = [(t.seconds - ENGINE_LATENCY) * 1000 for times in per_session for t in times]
    runner_added: list[float] = []
    problems: list[str] = []
    recorded: list[str] = []
    for i, tree in enumerate(trees):
        if len(tree.turns) != turns:
            problems.append(f"session {i}: {len(tree.turns)} turns recorded")
        recorded += [t.meta.request_id for t in tree.turns]
        runner_added += [
            (t.meta.finished_at - t.meta.started_at - ENGINE_LATENCY) * 1000 for t in tree.turns
        ]
        lin = linearize_tree(tree)
        if len(lin.samples) != 1 or len(lin.samples[0].trained_turns) != turns or lin.exclusions:
            problems.append(
                f"session {i}: {len(lin.samples)} samples, "
                f"{[len(s.trained_turns) for s in lin.samples]} trained turns, "
                f"{len(lin.exclusions)} exclusions"
            )
    if len(recorded) != sessions * turns:
        problems.append(f"{len(recorded)} turns recorded, expected {sessions * turns}")
    if len(set(recorded)) != len(recorded):
        problems.append("a request id was recorded twice")
    if sorted(engine_rids) != sorted(recorded):
        problems.append(
            f"the engine saw {len(engine_rids)} requests, the trees hold {len(recorded)} turns"
        )
    return Row(sessions, turns, think, wall, added, runner_added, cpu, problems)


CALIBRATION_IDS = 1500


async def engine_alone_ms(engine_url: str, calls: int = 30) -> float:
    """Median time over the engine latency of a streamed /generate straight to the double."""
    times: list[float] = []
    async with aiohttp.ClientSession() as http:
        for i in range(calls):
            body = {
                "rid": f"calibration-{i}",
                "input_ids": list(range(1000, 1000 + CALIBRATION_IDS)),
                "sampling_params": {"max_new_tokens": 256},
                "return_logprob": True,
                "stream": True,
            }
            data = json.dumps(body).encode()
            began = time.perf_counter()
            async with http.post(f"{engine_url}/generate", data=data) as response:
                await response.read()
            times.append(time.perf_counter() - began)
    return (statistics.median(times) - ENGINE_LATENCY) * 1000


# -- the table -------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def verdict(ok: bool) -> str:
    return "[green]PASS[/]" if ok else "[red]MISS[/]"


def table(rows: Sequence[Row], calibration: float) -> Table:
    out = Table(
        title=f"Added latency per turn (end-to-end - {ENGINE_LATENCY * 1000:.0f} ms engine latency)"
    )
    for name in (
        "sessions x turns",
        "think s",
        "turns/s",
        "added mean ms",
        "net of double",
        "p50",
        "p99",
        "max",
        "runner mean ms",
        "runner p99",
        "CPU ms/turn adapter",
        "double",
        "clients",
        "recorded once",
        "mean <= 5",
        "p99 <= 50",
    ):
        out.add_column(name, justify="right")
    for row in rows:
        mean = statistics.fmean(row.added_ms)
        p99 = percentile(row.added_ms, 0.99)
        out.add_row(
            f"{row.sessions:,} x {row.turns}",
            f"{row.think:g}",
            f"{len(row.added_ms) / row.wall:,.0f}",
            f"{mean:.1f}",
            f"{mean - calibration:.1f}",
            f"{percentile(row.added_ms, 0.5):.1f}",
            f"{p99:.1f}",
            f"{max(row.added_ms):.1f}",
            f"{statistics.fmean(row.runner_added_ms):.1f}",
            f"{percentile(row.runner_added_ms, 0.99):.1f}",
            f"{row.cpu_ms_per_turn['adapter']:.2f}",
            f"{row.cpu_ms_per_turn['double']:.2f}",
            f"{row.cpu_ms_per_turn['clients']:.2f}",
            "[green]yes[/]" if not row.problems else f"[red]NO ({len(row.problems)})[/]",
            verdict(mean <= TARGET_MEAN_MS),
            verdict(p99 <= TARGET_P99_MS),
        )
    return out


async def bench(args: argparse.Namespace, console: Console) -> int:
    ctx = multiprocessing.get_context("spawn")
    cache = str(args.cache_dir)
    load_qwen3_vocabulary(QwenTokenizerConfig(args.cache_dir))  # build the cache once, here
    engine_here, engine_there = ctx.Pipe()
    engine = ctx.Process(
        target=engine_process,
        args=(cache, ENGINE_LATENCY, args.tokens_per_chunk, engine_there),
        daemon=True,
    )
    engine.start()
    engine_url = await asyncio.to_thread(engine_here.recv)
    admin_token = secrets.token_urlsafe(16)
    adapter_here, adapter_there = ctx.Pipe()
    adapter = ctx.Process(
        target=adapter_process,
        args=(engine_url, cache, admin_token, max(args.sessions) + 8, args.profile, adapter_there),
        daemon=True,
    )
    adapter.start()
    adapter_url, admin_url = await asyncio.to_thread(adapter_here.recv)
    assert engine.pid is not None
    assert adapter.pid is not None
    pids = {"adapter": adapter.pid, "double": engine.pid, "clients": os.getpid()}
    rows: list[Row] = []
    try:
        calibration = await engine_alone_ms(engine_url)
        engine_here.send("rids")  # forget the calibration requests
        await asyncio.to_thread(engine_here.recv)
        console.print(
            f"engine double alone (client -> /generate, {CALIBRATION_IDS:,} ids, streamed): "
            f"+{calibration:.1f} ms over its {ENGINE_LATENCY * 1000:.0f} ms latency (median): "
            "its timer overshoot and HTTP, not the adapter's"
        )
        for think in args.think:
            for sessions in args.sessions:
                console.print(
                    f"running {sessions:,} sessions x {args.turns} turns, think {think:g} s"
                )
                row = await run_row(
                    adapter_url,
                    admin_url,
                    admin_token,
                    engine_here,
                    pids,
                    sessions,
                    args.turns,
                    think,
                )
                rows.append(row)
                for problem in row.problems[:10]:
                    console.print(f"[red]  {problem}[/]")
    finally:
        adapter_here.send("stop")
        profile_text: str = await asyncio.to_thread(adapter_here.recv)
        adapter.join(30)
        engine.terminate()
    console.print(table(rows, calibration))
    if profile_text:
        console.print("[bold]adapter process, cProfile, top 25 by own time[/]")
        console.print(profile_text, markup=False, highlight=False)
    return 1 if any(row.problems for row in rows) else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sessions",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[100, 1000],
        help="comma-separated session counts, one table row each",
    )
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument(
        "--think",
        type=lambda s: [float(x) for x in s.split(",")],
        default=[0.0],
        help="comma-separated seconds between turns (each with each session count)",
    )
    parser.add_argument(
        "--tokens-per-chunk",
        type=int,
        default=1,
        help="tokens per streamed engine chunk (1: SGLang's default stream interval)",
    )
    parser.add_argument("--profile", action="store_true", help="cProfile the adapter process")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "protocol-adapters-bench",
        help="where the converted Qwen3 tokenizer is cached",
    )
    args = parser.parse_args()
    console = Console(width=200)
    console.print(
        f"[bold]adapter_concurrency_bench[/] {os.cpu_count()} cores, load average "
        f"{os.getloadavg()[0]:.2f}; engine double, adapter and clients in 3 processes; "
        f"clients: raw aiohttp (one pooled session), Anthropic Messages, stream: true; "
        f"Python {sys.version.split()[0]}"
    )
    return asyncio.run(bench(args, console))


if __name__ == "__main__":
    sys.exit(main())
