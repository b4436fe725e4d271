"""The adapter refusing over-long requests: how fast, how much memory, how responsive meanwhile.

    uv run tools/bench/big_body_bench.py                            # 20 MB, contexts 32k and 128k
    uv run tools/bench/big_body_bench.py --body-mb 20 --concurrent 4 --context 131072
    uv run tools/bench/big_body_bench.py --adapter-src OLD_SRC --rss-cap-gb 6

A request far over the context limit (by default 20 MB of log and code text, under the 64 MiB
body limit) must be refused with "prompt is too long" without tokenizing all of it, in bounded
memory, while the adapter keeps answering everyone else.

Two processes: the adapter (the real ``AdapterServer``: Anthropic dialect, bridge renderer with
the real Qwen3 tokenizer, SGLang client) runs in a Python of its own, and this process holds the
SGLang-wire engine double (which the refused requests never reach) and the clients: raw aiohttp.
``--adapter-src`` puts another checkout's ``packages/protocol-adapters/src`` first on the
adapter's path, to measure an older adapter side by side (before/after). ``--rss-cap-gb`` kills
the adapter if it grows past the cap (an old adapter can take the machine's memory) and reports
the row as over the cap.

For each context length: one request alone (time to the refusal), then ``--concurrent`` at once
while ``/health`` is polled every 10 ms and the adapter's RSS is sampled every 10 ms (from
``/proc``): the slowest refusal, the largest ``/health`` latency and its p50, the RSS growth over
the idle adapter at the peak and 2 s after the last refusal. Every answer must be the 400 "prompt
is too long" with a count above the limit; the exit status is 1 otherwise.

Targets (2 cores): one refusal < 1 s; with 4 at once, RSS growth < 1 GB and ``/health`` < 50 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

import aiohttp
from rich.console import Console
from rich.table import Table

TARGET_ALONE_S = 1.0
TARGET_RSS_GROWTH_MB = 1024.0
TARGET_HEALTH_MS = 50.0
SAMPLE_EVERY = 0.01
TOO_LONG_PREFIX = "prompt is too long: "


# -- the adapter, in a process of its own ----------------------------------------------------------


def serve_adapter(engine_url: str, cache_dir: str, context: int) -> None:
    """Run the adapter; print its URL and a session token, serve until stdin closes.

    Imports happen here, after ``--adapter-src`` was put on ``sys.path`` by the environment, and
    use only calls an older adapter also has.
    """
    from protocol_adapters import (
        AdapterConfig,
        AdapterServer,
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

    async def serve() -> None:
        vocabulary = load_qwen3_vocabulary(QwenTokenizerConfig(Path(cache_dir)))
        renderer = Renderer(vocabulary, qwen3_template(), RendererConfig())
        config = AdapterConfig(limits=SessionLimits(max_turns=10_000, context_tokens=context))
        async with (
            SGLangEngine(SGLangConfig(base_url=engine_url)) as engine,
            AdapterServer(config, engine, renderer, vocabulary, reply_parsers()) as server,
        ):
            tokens = [server.sessions.open(f"big-{i}").token for i in range(64)]
            print(json.dumps({"url": server.url, "tokens": tokens}), flush=True)
            await asyncio.to_thread(sys.stdin.read)

    asyncio.run(serve())


@dataclass
class Adapter:
    process: subprocess.Popen[str]
    url: str
    tokens: list[str]

    def rss_mb(self) -> float:
        """The adapter's resident memory, any child processes of it included."""
        return sum(_status_kb(pid, "VmRSS") for pid in _tree(self.process.pid)) / 1024

    def stop(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants."""
    pids = [pid]
    for parent in pids:
        children = Path(f"/proc/{parent}/task/{parent}/children")
        if children.exists():
            pids.extend(int(child) for child in children.read_text().split())
    return pids


def _status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


async def start_adapter(
    engine_url: str, cache_dir: Path, context: int, adapter_src: Path | None
) -> Adapter:
    env = dict(os.environ)
    if adapter_src is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(adapter_src), env.get("PYTHONPATH")]))
    process = subprocess.Popen(
        [sys.executable, __file__, "--serve-adapter", engine_url, str(cache_dir), str(context)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert process.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(process.stdout.readline), 120)
    if not line:
        raise RuntimeError("the adapter exited before serving")
    started = json.loads(line)
    return Adapter(process, started["url"], started["tokens"])


# -- the request and the measurements --------------------------------------------------------------


def big_body(megabytes: float, seed: int = 7) -> bytes:
    """An Anthropic request whose one user message is ``megabytes`` of varied log and code."""
    rng = random.Random(seed)
    words = [
        *("def", "class", "return", "import", "self", "error", "warning", "assert", "PASSED"),
        *("FAILED", "test_", "value", "None", "request", "response", "session", "token"),
        *("engine", "cache", "retry", "timeout", "module", "package", "file", "line"),
    ]
    lines: list[str] = []
    size = 0
    target = int(megabytes * 1024 * 1024)
    while size < target:
        kind = rng.random()
        name, other = rng.choice(words), rng.choice(words)
        if kind < 0.4:
            line = f"{name}_{rng.randrange(10**6)} = {rng.random():.6f}  # {other}"
        elif kind < 0.7:
            line = f'  File "src/{name}/{other}.py", line {rng.randrange(9999)}'
        else:
            line = " ".join(rng.choice(words) for _ in range(rng.randrange(4, 16)))
        lines.append(line)
        size += len(line) + 1
    body = {
        "model": "policy",
        "max_tokens": 1024,
        "system": "You are a coding agent.",
        "messages": [{"role": "user", "content": "\n".join(lines)}],
    }
    return json.dumps(body).encode()


@dataclass
class Refusal:
    seconds: float
    status: int
    message: str


async def refuse(http: aiohttp.ClientSession, adapter: Adapter, token: str, body: bytes) -> Refusal:
    began = time.perf_counter()
    try:
        async with http.post(
            adapter.url + "/v1/messages",
            data=body,
            headers={"x-api-key": token, "content-type": "application/json"},
        ) as response:
            text = await response.text()
    except aiohttp.ClientError as exc:  # the adapter died (killed over the RSS cap?)
        return Refusal(time.perf_counter() - began, 0, f"no answer: {exc!r}")
    seconds = time.perf_counter() - began
    try:
        message = str(json.loads(text)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        message = text[:200]
    return Refusal(seconds, response.status, message)


def poll_health(url: str, conn: Connection) -> None:
    """In a process of its own (so the clients' work never delays it): GET ``/health`` every
    10 ms until told to stop, then send back each latency in ms."""

    async def poll() -> list[float]:
        latencies: list[float] = []
        async with aiohttp.ClientSession() as http:
            conn.send("ready")
            while not conn.poll():
                began = time.perf_counter()
                try:
                    async with http.get(url + "/health") as response:
                        await response.read()
                except aiohttp.ClientError:
                    break  # the adapter is gone
                latencies.append((time.perf_counter() - began) * 1000)
                await asyncio.sleep(SAMPLE_EVERY)
        return latencies

    conn.send(asyncio.run(poll()))


async def rss_samples(adapter: Adapter, stop: asyncio.Event, cap_mb: float) -> list[float]:
    samples: list[float] = []
    while not stop.is_set():
        try:
            rss = adapter.rss_mb()
        except (OSError, KeyError):
            break
        samples.append(rss)
        if rss > cap_mb:
            adapter.process.send_signal(signal.SIGKILL)
            break
        await asyncio.sleep(SAMPLE_EVERY)
    return samples


@dataclass
class Row:
    context: int
    body_mb: float
    alone: Refusal
    concurrent: list[Refusal]
    idle_mb: float
    peak_mb: float
    after_mb: float
    health_ms: list[float]
    over_cap: bool
    problems: list[str]


async def measure(
    engine_url: str, args: argparse.Namespace, context: int, body: bytes, console: Console
) -> Row:
    adapter = await start_adapter(engine_url, args.cache_dir, context, args.adapter_src)
    cap_mb = args.rss_cap_gb * 1024
    problems: list[str] = []
    try:
        timeout = aiohttp.ClientTimeout(total=600)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            # Warm up: imports, caches, the worker threads and the large-body thread.
            await refuse(http, adapter, adapter.tokens[0], big_body(args.warm_up_mb, seed=1))
            await asyncio.sleep(1.0)
            idle_mb = adapter.rss_mb()
            console.print(f"  context {context:,}: one request alone")
            stop = asyncio.Event()
            sampling = asyncio.create_task(rss_samples(adapter, stop, cap_mb))
            alone = await refuse(http, adapter, adapter.tokens[1], body)
            console.print(f"  context {context:,}: {args.concurrent} at once")
            here, there = multiprocessing.get_context("spawn").Pipe()
            poller = multiprocessing.get_context("spawn").Process(
                target=poll_health, args=(adapter.url, there), daemon=True
            )
            poller.start()
            await asyncio.to_thread(here.recv)  # polling
            calls: list[Awaitable[Refusal]] = [
                refuse(http, adapter, adapter.tokens[2 + i], body) for i in range(args.concurrent)
            ]
            concurrent = list(await asyncio.gather(*calls))
            await asyncio.sleep(2.0)
            here.send("stop")
            health: list[float] = await asyncio.to_thread(here.recv)
            poller.join(10)
            stop.set()
            rss = await sampling
            over_cap = adapter.process.poll() is not None
            after_mb = float("nan") if over_cap else adapter.rss_mb()
    finally:
        adapter.stop()
    problems.extend(
        f"HTTP {refusal.status}: {refusal.message[:120]}"
        for refusal in [alone, *concurrent]
        if refusal.status != 400 or not refusal.message.startswith(TOO_LONG_PREFIX)
    )
    if over_cap:
        problems.append(f"the adapter grew past {args.rss_cap_gb} GB and was killed")
    return Row(
        context=context,
        body_mb=len(body) / 2**20,
        alone=alone,
        concurrent=concurrent,
        idle_mb=idle_mb,
        peak_mb=max(rss, default=idle_mb),
        after_mb=after_mb,
        health_ms=health,
        over_cap=over_cap,
        problems=problems,
    )


def verdict(ok: bool) -> str:
    return "[green]PASS[/]" if ok else "[red]MISS[/]"


def table(rows: list[Row], label: str, concurrent: int) -> Table:
    out = Table(title=f"Over-long requests refused ({label})")
    for column in (
        "context",
        "body MB",
        "alone s",
        f"{concurrent} at once: slowest s",
        "idle RSS MB",
        "peak +MB",
        "+MB 2 s after",
        "/health p50 ms",
        "/health max ms",
        "alone < 1 s",
        "+RSS < 1 GB",
        "/health < 50 ms",
    ):
        out.add_column(column, justify="right")
    for row in rows:
        growth = row.peak_mb - row.idle_mb
        slowest = max((r.seconds for r in row.concurrent), default=float("nan"))
        health_max = max(row.health_ms, default=float("nan"))
        out.add_row(
            f"{row.context:,}",
            f"{row.body_mb:.1f}",
            f"{row.alone.seconds:.2f}",
            f"{slowest:.2f}",
            f"{row.idle_mb:,.0f}",
            f"{growth:,.0f}" + (" (cap)" if row.over_cap else ""),
            f"{row.after_mb - row.idle_mb:,.0f}",
            f"{statistics.median(row.health_ms):.1f}" if row.health_ms else "-",
            f"{health_max:.1f}",
            verdict(row.alone.seconds < TARGET_ALONE_S),
            verdict(growth < TARGET_RSS_GROWTH_MB and not row.over_cap),
            verdict(health_max < TARGET_HEALTH_MS),
        )
    return out


async def bench(args: argparse.Namespace, console: Console) -> int:
    from protocol_adapters import QwenTokenizerConfig, load_qwen3_vocabulary
    from protocol_adapters.testing import EngineDouble
    from protocol_adapters.testing.stack import VocabularyTokenizer

    vocabulary = load_qwen3_vocabulary(QwenTokenizerConfig(args.cache_dir))
    body = big_body(args.body_mb)
    rows: list[Row] = []
    for context in args.context:
        async with EngineDouble(
            VocabularyTokenizer(vocabulary), [], context_length=context
        ) as double:
            rows.append(await measure(double.url, args, context, body, console))
            if double.requests:
                rows[-1].problems.append(f"{len(double.requests)} requests reached the engine")
    label = f"adapter from {args.adapter_src}" if args.adapter_src else "this checkout's adapter"
    console.print(table(rows, label, args.concurrent))
    for row in rows:
        for problem in row.problems:
            console.print(f"[red]context {row.context:,}: {problem}[/]")
        console.print(f"context {row.context:,}: {row.alone.message[:100]}")
    return 1 if any(row.problems for row in rows) else 0


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "--serve-adapter":
        serve_adapter(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--body-mb", type=float, default=20.0)
    parser.add_argument("--concurrent", type=int, default=4)
    parser.add_argument(
        "--warm-up-mb",
        type=float,
        default=9.0,
        help="the warm-up request (over 8 MB, so it also warms the large-body thread)",
    )
    parser.add_argument(
        "--context",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[32768, 131072],
        help="comma-separated context lengths (engine and adapter), one row each",
    )
    parser.add_argument(
        "--adapter-src", type=Path, help="another checkout's packages/protocol-adapters/src"
    )
    parser.add_argument("--rss-cap-gb", type=float, default=6.0, help="kill the adapter above")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "protocol-adapters-bench",
        help="where the converted Qwen3 tokenizer is cached",
    )
    args = parser.parse_args()
    console = Console(width=200)
    console.print(
        f"[bold]big_body_bench[/] {os.cpu_count()} cores, load average "
        f"{os.getloadavg()[0]:.2f}; adapter in its own process; "
        f"Python {sys.version.split()[0]}"
    )
    return asyncio.run(bench(args, console))


if __name__ == "__main__":
    sys.exit(main())
