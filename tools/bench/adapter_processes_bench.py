"""One adapter process against several: closed-loop turns/s and CPU per turn on this machine.

    uv run tools/bench/adapter_processes_bench.py                        # 1 vs 2, 3 rounds each
    uv run tools/bench/adapter_processes_bench.py --processes 1,2,4 --repeats 5 --sessions 32

Every configuration is the real CLI, started once and kept warm: ``protocol-adapters serve``
(one process, today's default) and ``protocol-adapters serve --processes N`` (N workers behind
one admin API), all in front of one SGLang-wire engine double in a process of its own, which
answers at once (no latency), one token per streamed chunk. This process is the clients: raw
aiohttp, Anthropic Messages with ``stream: true``, ``--sessions`` sessions at once, each
``--turns`` turns in a closed loop (the next request as soon as the reply's ``message_stop`` is
read); every reply is a ``Bash`` call, echoed back with a new ~``--tool-kb`` KB tool result.
Sessions are opened through the admin API and each agent talks to the ``base_url`` it returns.

Rounds alternate between the configurations (the order flips every repeat), since the machine
is shared and its load drifts. Per round: turns/s (all turns / wall time), and CPU ms per turn of
the adapter (every process of the ``serve`` tree: workers and front), of the double and of the
clients, from ``/proc``; "turns/s per adapter core" is 1000 / that CPU. "loop thread" is the
CPU of the serving processes' main threads (their event loops; tokenizing runs on worker
threads), per turn: one process cannot serve more than 1000 / it turns/s, whatever the cores,
so N processes have N times that as their "loop-bound ceiling". RSS is each process's
``VmRSS`` after the rounds. After each round the
sessions are closed through the admin API and every tree must hold ``--turns`` turns (exit
status 1 otherwise).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import re
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import aiohttp
from adapter_concurrency_bench import cpu_seconds, read_reply
from rich.console import Console
from rich.table import Table

from protocol_adapters import QwenTokenizerConfig, load_qwen3_vocabulary
from protocol_adapters.testing import EngineDouble, ScriptedReply
from protocol_adapters.testing.stack import VocabularyTokenizer
from trajectory_tree import loads

CONTEXT_TOKENS = 65536
REPLY = ScriptedReply(text="Let me look.", tool_calls=[("Bash", {"command": "cat src/app.py"})])
SYSTEM = "You are a coding agent. Use the tools to inspect and change files. " * 8
TOOLS = [
    {
        "name": "Bash",
        "description": "Run a shell command in the repository and return its output.",
        "input_schema": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    }
]
ONE = re.compile(r"serving on (http://\S+); admin API on (http://\S+);")
MANY = re.compile(r"processes serving on (.+); admin API on (http://\S+);")


def engine_process(cache_dir: str, conn: Connection) -> None:
    """Serve the double until the bench ends (it is a daemon process)."""

    async def serve() -> None:
        vocabulary = load_qwen3_vocabulary(QwenTokenizerConfig(Path(cache_dir)))
        double = EngineDouble(
            VocabularyTokenizer(vocabulary), lambda _ids: REPLY, context_length=CONTEXT_TOKENS
        )
        async with double:
            conn.send(double.url)
            await asyncio.to_thread(conn.recv)

    asyncio.run(serve())


# -- /proc -------------------------------------------------------------------------------------


def loop_seconds(pid: int) -> float:
    """CPU time of a process's main thread: the adapter's event loop (its tid is the pid)."""
    fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def role(pid: int, root: int) -> str:
    """What a process of a ``serve`` tree is: the serve process, a worker, or the tracker."""
    if pid == root:
        return "serve"
    command = Path(f"/proc/{pid}/cmdline").read_bytes()
    return "tracker" if b"resource_tracker" in command else "worker"


def rss_text(root: int) -> str:
    pids = tree_pids(root)
    workers = [f"{rss_mb(pid):.0f}" for pid in pids if role(pid, root) == "worker"]
    if not workers:
        return f"{rss_mb(root):.0f}"
    return f"front {rss_mb(root):.0f}, workers " + " + ".join(workers)


def tree_pids(root: int) -> list[int]:
    """``root`` and its children (the workers, and multiprocessing's resource tracker)."""
    found = [root]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if f"\nPPid:\t{root}\n" in (entry / "status").read_text():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


# -- the adapters under test -------------------------------------------------------------------


@dataclass
class Adapter:
    """A running ``protocol-adapters serve`` (``processes`` 0: without ``--processes``)."""

    processes: int
    process: asyncio.subprocess.Process
    url: str
    admin_url: str
    drain: asyncio.Task[None]
    rounds: list[Round] = field(default_factory=list)

    @property
    def name(self) -> str:
        if not self.processes:
            return "serve (1 process)"
        return f"serve --processes {self.processes}"

    def cpu(self) -> float:
        return sum(cpu_seconds(pid) for pid in tree_pids(self.process.pid))

    def loops(self) -> float:
        """The event loop threads of the processes that serve turns (the workers, or the one)."""
        root = self.process.pid
        if not self.processes:
            return loop_seconds(root)
        return sum(loop_seconds(p) for p in tree_pids(root) if role(p, root) == "worker")


async def start_adapter(
    processes: int, engine_url: str, cache: Path, token_file: Path, *flags: str
) -> Adapter:
    command = [
        sys.executable,
        "-m",
        "protocol_adapters",
        "serve",
        "--engine-url",
        engine_url,
        "--qwen3-cache",
        str(cache),
        "--port",
        "0",
        "--admin-token-file",
        str(token_file),
        "--admin-port",
        "0",
        "--context-tokens",
        str(CONTEXT_TOKENS),
        "--max-turns",
        "10000",
        *(["--processes", str(processes)] if processes else []),
        *flags,
    ]
    process = await asyncio.create_subprocess_exec(*command, stderr=asyncio.subprocess.PIPE)
    assert process.stderr is not None
    pattern = MANY if processes else ONE
    while True:
        line = (await asyncio.wait_for(process.stderr.readline(), 120)).decode()
        if not line:
            raise RuntimeError(f"{command} exited before serving")
        if match := pattern.search(line):
            break

    async def drain(stream: asyncio.StreamReader) -> None:
        while await stream.readline():
            pass

    url = match[1].split()[0]
    return Adapter(processes, process, url, match[2], asyncio.create_task(drain(process.stderr)))


# -- the clients -------------------------------------------------------------------------------


def tool_result(session: int, turn: int, kilobytes: float) -> str:
    """About ``kilobytes`` KB of a numbered source listing, different for every turn."""
    lines: list[str] = []
    size = 0
    n = 0
    while size < kilobytes * 1024:
        n += 1
        line = f"{n:>6}\tdef handler_{session}_{turn}_{n}(request, value={n * 7 % 13}):  # step"
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)


async def run_session(
    http: aiohttp.ClientSession, url: str, token: str, session: int, turns: int, kb: float
) -> None:
    headers = {"x-api-key": token, "anthropic-version": "2023-06-01"}
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"Session {session}: fix it."}]
    for turn in range(turns):
        body = {
            "model": "policy",
            "max_tokens": 1024,
            "stream": True,
            "system": SYSTEM,
            "tools": TOOLS,
            "messages": messages,
        }
        async with http.post(f"{url}/v1/messages", data=json.dumps(body), headers=headers) as r:
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}: {await r.text()}")
            content = await read_reply(r)
        (use,) = [b for b in content if b["type"] == "tool_use"]
        messages.append({"role": "assistant", "content": content})
        result = {"type": "tool_result", "tool_use_id": use["id"]}
        messages.append(
            {"role": "user", "content": [{**result, "content": tool_result(session, turn, kb)}]}
        )


@dataclass(frozen=True, slots=True)
class Round:
    turns_per_s: float
    cpu_ms: dict[str, float]
    problems: list[str]


async def run_round(
    adapter: Adapter,
    admin_token: str,
    double_pid: int,
    label: str,
    sessions: int,
    turns: int,
    kb: float,
) -> Round:
    admin = {"Authorization": f"Bearer {admin_token}"}
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:

        async def open_one(i: int) -> tuple[str, str]:
            body = {"session_id": f"{label}-{i}"}
            async with http.post(
                f"{adapter.admin_url}/admin/sessions", json=body, headers=admin
            ) as r:
                answer = await r.json()
            return str(answer.get("base_url", adapter.url)), str(answer["token"])

        opened = [await open_one(i) for i in range(sessions)]
        before = {
            "adapter": adapter.cpu(),
            "loop": adapter.loops(),
            "double": cpu_seconds(double_pid),
            "clients": time.process_time(),
        }
        began = time.perf_counter()
        await asyncio.gather(
            *(run_session(http, url, token, i, turns, kb) for i, (url, token) in enumerate(opened))
        )
        wall = time.perf_counter() - began
        after = {
            "adapter": adapter.cpu(),
            "loop": adapter.loops(),
            "double": cpu_seconds(double_pid),
            "clients": time.process_time(),
        }
        problems: list[str] = []
        for url, token in opened:
            async with http.delete(
                f"{adapter.admin_url}/admin/sessions/{token}", headers=admin
            ) as r:
                tree = loads(await r.text())
            if len(tree.turns) != turns:
                problems.append(f"{tree.session_id} ({url}): {len(tree.turns)} turns recorded")
    total = sessions * turns
    cpu = {name: (after[name] - before[name]) * 1000 / total for name in before}
    return Round(total / wall, cpu, problems)


# -- the table ---------------------------------------------------------------------------------


def spread(values: Sequence[float], digits: int) -> str:
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return (
        f"{statistics.median(values):.{digits}f} "
        f"({min(values):.{digits}f}-{max(values):.{digits}f})"
    )


def table(adapters: Sequence[Adapter], rss: dict[str, str], title: str) -> Table:
    out = Table(title=title)
    for name in (
        "adapter",
        "rounds",
        "turns/s",
        "adapter CPU ms/turn",
        "turns/s per adapter core",
        "loop thread ms/turn",
        "loop-bound ceiling turns/s",
        "double ms/turn",
        "clients ms/turn",
        "RSS MB",
    ):
        out.add_column(name, justify="right")
    for adapter in adapters:
        rounds = adapter.rounds
        cpu = [r.cpu_ms["adapter"] for r in rounds]
        out.add_row(
            adapter.name,
            str(len(rounds)),
            spread([r.turns_per_s for r in rounds], 0),
            spread(cpu, 1),
            spread([1000 / c for c in cpu], 0),
            spread([r.cpu_ms["loop"] for r in rounds], 1),
            spread([max(adapter.processes, 1) * 1000 / r.cpu_ms["loop"] for r in rounds], 0),
            spread([r.cpu_ms["double"] for r in rounds], 1),
            spread([r.cpu_ms["clients"] for r in rounds], 1),
            rss[adapter.name],
        )
    return out


async def bench(args: argparse.Namespace, console: Console) -> int:
    cache: Path = args.cache_dir
    load_qwen3_vocabulary(QwenTokenizerConfig(cache))  # build the cache once, here
    ctx = multiprocessing.get_context("spawn")
    here, there = ctx.Pipe()
    engine = ctx.Process(target=engine_process, args=(str(cache), there), daemon=True)
    engine.start()
    engine_url: str = await asyncio.to_thread(here.recv)
    assert engine.pid is not None
    admin_token = secrets.token_urlsafe(16)
    with tempfile.TemporaryDirectory() as scratch:
        token_file = Path(scratch) / "admin-token"
        token_file.write_text(admin_token)
        token_file.chmod(0o600)
        adapters = [
            await start_adapter(n if n > 1 else 0, engine_url, cache, token_file)
            for n in args.processes
        ]
        load = [os.getloadavg()]
        problems: list[str] = []
        try:
            for adapter in adapters:  # warm-up: imports, pools, the tokenizer's first calls
                await run_round(
                    adapter,
                    admin_token,
                    engine.pid,
                    f"warm-{adapter.processes}",
                    args.sessions,
                    2,
                    args.tool_kb,
                )
            for repeat in range(args.repeats):
                order = adapters if repeat % 2 == 0 else adapters[::-1]
                for adapter in order:
                    label = f"r{repeat}-{adapter.processes}"
                    row = await run_round(
                        adapter,
                        admin_token,
                        engine.pid,
                        label,
                        args.sessions,
                        args.turns,
                        args.tool_kb,
                    )
                    adapter.rounds.append(row)
                    problems += row.problems
                    console.print(
                        f"  {adapter.name}: {row.turns_per_s:.0f} turns/s, adapter "
                        f"{row.cpu_ms['adapter']:.1f} CPU ms/turn, load {os.getloadavg()[0]:.2f}"
                    )
                    load.append(os.getloadavg())
            rss = {a.name: rss_text(a.process.pid) for a in adapters}
        finally:
            for adapter in adapters:
                adapter.process.terminate()
                await adapter.process.wait()
                adapter.drain.cancel()
            engine.terminate()
    loads_1m = [entry[0] for entry in load]
    title = (
        f"{args.sessions} sessions x {args.turns} turns per round, closed loop, "
        f"~{args.tool_kb:g} KB tool results; {os.cpu_count()} cores, "
        f"load average {min(loads_1m):.2f}-{max(loads_1m):.2f}"
    )
    console.print(table(adapters, rss, title))
    for problem in problems[:10]:
        console.print(f"[red]{problem}[/]")
    return 1 if problems else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--processes",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1, 2],
        help="comma-separated process counts (1: serve without --processes)",
    )
    parser.add_argument("--sessions", type=int, default=16, help="concurrent sessions")
    parser.add_argument("--turns", type=int, default=8, help="turns per session per round")
    parser.add_argument("--repeats", type=int, default=3, help="rounds per configuration")
    parser.add_argument("--tool-kb", type=float, default=4.0, help="tool result size in KB")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "protocol-adapters-bench",
        help="where the converted Qwen3 tokenizer is cached",
    )
    args = parser.parse_args()
    console = Console(width=240)
    console.print(
        f"[bold]adapter_processes_bench[/] {os.cpu_count()} cores, load average "
        f"{os.getloadavg()[0]:.2f}; Python {sys.version.split()[0]}"
    )
    return asyncio.run(bench(args, console))


if __name__ == "__main__":
    sys.exit(main())
