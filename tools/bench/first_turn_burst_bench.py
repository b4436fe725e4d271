"""A batch's start: N episodes send the same first request at once. The adapter's CPU for the
burst and how long the last answer waits, side by side with another checkout's adapter.

    uv run tools/bench/first_turn_burst_bench.py --baseline OTHER/packages/protocol-adapters/src
    uv run tools/bench/first_turn_burst_bench.py --burst 32 --system-kb 48 --rounds 5

GRPO samples several episodes of one task, and a rollout starts its batch together: the
episodes of a group send the same first request (the agent's system prompt and tools, ~12k
tokens for Claude Code, and the task) within milliseconds of one another. Two processes run the
real adapter (Anthropic dialect, bridge renderer, real Qwen3 tokenizer, SGLang client): the
workspace's (or ``--adapter-src``) and, with ``--baseline``, another checkout's (turn_profile.py's
adapter process, which checks where it imported from). This process holds the SGLang-wire engine
double (answering at once, one token per chunk) and the clients: each round opens ``--burst``
sessions on an adapter, then sends their first requests at once (streamed) and reads every
answer to its end. The adapter's CPU (every thread) is measured over the burst, from before the
first request to after the last answer. Rounds alternate between the adapters (the first
alternates too), and each round's task differs, so no round finds the last one's text.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from rich.console import Console
from rich.table import Table
from turn_profile import SETTLE_S, Adapter, read_turn, turn_double

TOKENIZER_CACHE = Path(tempfile.gettempdir()) / "protocol-adapters-bench"
"""turn_profile.py's cache of the converted Qwen3 tokenizer."""


def tools(kb: int) -> list[dict[str, Any]]:
    """Tool definitions of about ``kb`` KB, as an agent CLI sends them (prose descriptions,
    JSON schemas)."""
    out: list[dict[str, Any]] = []
    size = 0
    while size < kb * 1024:
        number = len(out)
        description = " ".join(
            f"Step {i}: read the input of tool {number}, check it, and report what it found."
            for i in range(12)
        )
        tool = {
            "name": f"Tool{number}",
            "description": description,
            "input_schema": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Absolute path of the file."},
                    "limit": {"type": "integer", "description": "Lines to read at most."},
                },
                "required": ["path"],
            },
        }
        out.append(tool)
        size += len(json.dumps(tool))
    return out


def body(system_kb: int, task: str) -> bytes:
    system = "You are a coding agent working in a repository. Be careful and precise.\n" * 8
    return json.dumps(
        {
            "model": "policy",
            "max_tokens": 4096,
            "stream": True,
            "system": [{"type": "text", "text": system}],
            "tools": tools(system_kb),
            "messages": [{"role": "user", "content": task}],
        }
    ).encode()


async def burst(
    http: aiohttp.ClientSession, adapter: Adapter, url: str, count: int, payload: bytes
) -> tuple[float, list[float]]:
    """``count`` new sessions' first requests at once: the adapter's CPU ms, each answer's wall
    ms."""
    tokens = [
        (await asyncio.to_thread(adapter.ask, cmd="open", name=f"burst-{i}"))["token"]
        for i in range(count)
    ]

    async def one(token: str) -> float:
        began = time.perf_counter()
        headers = {"x-api-key": token, "anthropic-version": "2023-06-01"}
        async with http.post(f"{url}/v1/messages", data=payload, headers=headers) as r:
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}: {await r.text()}")
            await read_turn(r)
        return (time.perf_counter() - began) * 1000

    await asyncio.to_thread(adapter.ask, cmd="begin", hooks=False)
    walls = await asyncio.gather(*(one(token) for token in tokens))
    await asyncio.sleep(SETTLE_S)
    window = await asyncio.to_thread(adapter.ask, cmd="end")
    return float(window["process"]) / 1e6, list(walls)


async def bench(args: argparse.Namespace, console: Console) -> None:
    double = turn_double(args.cache_dir)
    sources: dict[str, Path | None] = {"current": args.adapter_src}
    if args.baseline is not None:
        sources = {"baseline": args.baseline, **sources}
    results: dict[str, list[tuple[float, list[float]]]] = {name: [] for name in sources}
    async with double:
        adapters = {name: Adapter(double.url, args.cache_dir, src) for name, src in sources.items()}
        try:
            started = {
                name: await asyncio.to_thread(adapter.wait_started)
                for name, adapter in adapters.items()
            }
            for name, info in started.items():
                console.print(f"{name}: protocol_adapters from {info['source']}", highlight=False)
            timeout = aiohttp.ClientTimeout(total=600)
            async with aiohttp.ClientSession(
                timeout=timeout, connector=aiohttp.TCPConnector(limit=0)
            ) as http:
                warm = body(args.system_kb, "Warm up.")
                for name, adapter in adapters.items():
                    await burst(http, adapter, started[name]["url"], 2, warm)
                double.requests.clear()
                for index in range(args.rounds):
                    names = list(adapters) if index % 2 == 0 else list(reversed(adapters))
                    for name in names:
                        task = f"Round {index}, {name}: the tests in tests/ fail. Fix them."
                        payload = body(args.system_kb, task)
                        found = await burst(
                            http, adapters[name], started[name]["url"], args.burst, payload
                        )
                        results[name].append(found)
                        prompt_tokens = len(double.requests[0].input_ids)
                        double.requests.clear()
                        console.print(
                            f"round {index} {name}: {prompt_tokens:,} prompt tokens each, "
                            f"{found[0]:.0f} ms CPU, last answer after "
                            f"{max(found[1]):.0f} ms (load {os.getloadavg()[0]:.1f})",
                            highlight=False,
                        )
        finally:
            for adapter in adapters.values():
                await asyncio.to_thread(adapter.stop)
    header = [
        "adapter",
        "CPU ms per burst",
        "CPU ms per first turn",
        "last answer, ms",
        "answer p50, ms",
    ]
    rows = []
    for name, rounds in results.items():
        cpu = statistics.median(r[0] for r in rounds)
        last = statistics.median(max(r[1]) for r in rounds)
        p50 = statistics.median(statistics.median(r[1]) for r in rounds)
        rows.append([name, f"{cpu:.0f}", f"{cpu / args.burst:.1f}", f"{last:.0f}", f"{p50:.0f}"])
    table = Table(
        title=f"{args.burst} identical first requests at once (~{args.system_kb} KB of tools), "
        f"medians of {args.rounds} rounds"
    )
    for column in header:
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--burst", type=int, default=16, help="first requests sent at once")
    parser.add_argument("--system-kb", type=int, default=48, help="size of the tools, KB")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--adapter-src", type=Path)
    parser.add_argument("--baseline", type=Path, help="another checkout's adapter src, beside")
    parser.add_argument("--cache-dir", type=Path, default=TOKENIZER_CACHE)
    args = parser.parse_args()
    asyncio.run(bench(args, Console()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
