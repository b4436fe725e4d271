"""One rollout node at scale: N concurrent episodes through the real adapter, and what each part
of the node costs.

    uv run tools/bench/node_scale.py          # both agents, N = 1, 8, 32, 64, both placements
    uv run tools/bench/node_scale.py --agent scripted --episodes 32 --placement loop,process
    uv run --with uvloop tools/bench/node_scale.py --agent scripted --adapter-loop uvloop

Each episode runs in a local sandbox with every isolation layer on, its agent talking to the real
adapter (Anthropic dialect, bridge renderer, real Qwen3 tokenizer, SGLang client) through the
sandbox's one forwarded port. The engine is the SGLang-wire double, in a process of its own
(``--engine-latency`` before each answer), so its CPU is nobody's here. Two agents:

- ``scripted``: a shell script in the sandbox, curl and jq, ``--turns`` non-streamed Anthropic
  calls, each answered with a ``Bash`` tool call and followed by a ~4 KB tool result: what the
  node costs when the agent itself costs almost nothing;
- ``claude``: the real Claude Code (the harness's pinned CLI) on the demo's SWE tasks through
  apps/swe-rl's episode (sandbox, checkout, CLI, diff, grading in a fresh sandbox), the engine
  double playing the demo's scripted policy; Claude Code streams.

Two placements of the adapter: ``loop``, served from the driver's event loop (the process that
runs the episodes and their sandboxes, as slime-backend's generate function does today), and
``process``, in a process of its own with sessions opened and closed over its admin API (each
close brings the tree back as JSON, which the driver reads off its loop).

Per row: episodes per hour; CPU seconds per episode of the sandboxes (the CLI, its tools, git,
grading: every process reaped under the sandboxes), of Claude Code's own process (sampled from
/proc every 0.2 s), of the driver process and of the adapter (in ``loop`` placement the two
share one process: the driver column holds both), and driver + adapter as a share of the CLI's
own CPU; the event
loop's lag (a 10 ms sleep's overshoot, sampled all along) in the driver and, in ``process``
placement, in the adapter (``--adapter-nice`` gives that process a scheduling priority, and
``--adapter-loop uvloop`` runs it on uvloop); the adapter-added latency per turn (body read ->
engine call, plus engine's last token -> last byte flushed: ``protocol_adapters.TurnTimings``)
and, apart, the time from a request's headers to its whole body (the sandbox's relay, which
runs in the driver, and the agent set that pace, not the adapter); the longest
garbage collection in the driver; the ``asyncio`` logger's warnings and errors (driver and
adapter); processes left after the run (the bench is a child
subreaper, so any orphan of a sandbox comes back to it), sandbox state directories left, and
the adapter's 5xx and 529 answers. Every figure depends on the machine's load: the header and
each row print the load average.

Targets (quiet machine): loop lag p99 <= 50 ms and adapter-added p99 <= 20 ms at 32 concurrent
scripted episodes; driver + adapter <= 10% of the CLI's own CPU per Claude Code episode; no
process left; no 529 while the engine is up.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import logging
import multiprocessing
import multiprocessing.connection
import os
import resource
import secrets
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import aiohttp
from aiohttp import web
from rich.console import Console
from rich.table import Table

from protocol_adapters import (
    AdapterConfig,
    AdapterServer,
    AdminConfig,
    QwenTokenizerConfig,
    Renderer,
    SGLangConfig,
    SGLangEngine,
    TurnTimings,
    Vocabulary,
    load_qwen3_vocabulary,
    qwen3_template,
    reply_parsers,
)
from protocol_adapters.testing import EngineDouble, Faults, ScriptedReply
from protocol_adapters.testing.stack import VocabularyTokenizer
from sandbox import ForwardedEndpoint, LocalBackend, LocalConfig, SandboxSpec
from trajectory_tree import loads

CACHE = Path.home() / ".cache" / "agent-rl"
TOKENIZER_CACHE = CACHE / "qwen3-tokenizer"
CONTEXT = 65536
ADMIN_TOKEN = secrets.token_urlsafe(16)
LAG_PERIOD = 0.01
PR_SET_CHILD_SUBREAPER = 36

AGENT_SCRIPT = r"""
set -euo pipefail
jq -nc '{model: "policy", max_tokens: 256,
         tools: [{name: "Bash", description: "Run a shell command",
                  input_schema: {type: "object", properties: {command: {type: "string"}},
                                 required: ["command"]}}],
         messages: [{role: "user", content: "Fix the failing test in this repository."}]}' \
  > body.json
for turn in $(seq 1 "$TURNS"); do
  curl -sS --fail-with-body -o reply.json -H "x-api-key: $TOKEN" \
    -H "anthropic-version: 2023-06-01" -H "content-type: application/json" \
    --data-binary @body.json "$URL/v1/messages"
  seq "$turn" 100000 | head -c 4000 > output.txt || true
  jq -c --slurpfile r reply.json --rawfile out output.txt \
    '.messages += [{role: "assistant", content: $r[0].content},
                   {role: "user", content: [{type: "tool_result",
                     tool_use_id: ($r[0].content[] | select(.type == "tool_use") | .id),
                     content: $out}]}]' body.json > next.json
  mv next.json body.json
done
"""


# -- the engine double, in a process of its own ----------------------------------------------


def scripted_policy(input_ids: Sequence[int]) -> ScriptedReply:
    del input_ids
    return ScriptedReply(text="Looking at the tests.", tool_calls=[("Bash", {"command": "ls"})])


def serve_engine(
    conn: multiprocessing.connection.Connection, agent: str, latency: float, jitter: float
) -> None:
    """The engine double until told to stop; sends its URL, then its own CPU seconds."""
    vocabulary = load_qwen3_vocabulary(QwenTokenizerConfig(TOKENIZER_CACHE))
    script: Callable[[Sequence[int]], ScriptedReply] = scripted_policy
    if agent == "claude":
        from swe_rl.demo.policy import DemoPolicy

        script = DemoPolicy(vocabulary)

    async def main() -> None:
        async with EngineDouble(
            VocabularyTokenizer(vocabulary),
            script,
            faults=Faults(latency=latency, latency_jitter=jitter),
            context_length=CONTEXT,
            incremental_streaming=True,
        ) as double:
            conn.send(double.url)
            await asyncio.get_running_loop().run_in_executor(None, conn.recv)

    asyncio.run(main())
    conn.send(cpu_seconds(resource.RUSAGE_SELF))


# -- the adapter, in the driver's loop or in a process of its own -----------------------------


@dataclass(slots=True)
class AdapterStats:
    """What the adapter saw during one row."""

    added_ms: list[float] = field(default_factory=list)
    body_ms: list[float] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    lag_ms: list[float] = field(default_factory=list)
    cpu_s: float | None = None
    asyncio_logs: int = 0
    asyncio_first: list[str] = field(default_factory=list)


class LagMonitor:
    """Samples the running loop's lag: how late a 10 ms sleep wakes up."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            await asyncio.sleep(LAG_PERIOD)
            self.samples.append((loop.time() - started - LAG_PERIOD) * 1000)

    async def stop(self) -> list[float]:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        return self.samples


@contextlib.asynccontextmanager
async def adapter(
    engine_url: str, vocabulary: Vocabulary, admin: str = ADMIN_TOKEN
) -> AsyncIterator[tuple[AdapterServer, TurnTimings, Counter[int]]]:
    """The real adapter with the admin API, a timings recorder and a count of its statuses."""
    timings = TurnTimings()
    statuses: Counter[int] = Counter()

    async def count(request: web.Request, response: web.StreamResponse) -> None:
        if request.path.startswith("/v1/"):
            statuses[response.status] += 1

    async with SGLangEngine(SGLangConfig(engine_url)) as engine:
        server = AdapterServer(
            AdapterConfig(admin=AdminConfig(admin)),
            engine,
            Renderer(vocabulary, qwen3_template()),
            vocabulary,
            reply_parsers(),
            timings=timings,
        )
        server.app.on_response_prepare.append(count)
        async with server:
            yield server, timings, statuses


def serve_adapter(
    conn: multiprocessing.connection.Connection,
    engine_url: str,
    loop_kind: str,
    admin: str,
    priority: int,
) -> None:
    """The adapter in a process of its own until told to stop; sends its URLs, then its
    :class:`AdapterStats`. ``priority``: its nice value (negative: ahead of the CLIs)."""
    os.setpriority(os.PRIO_PROCESS, 0, priority)
    vocabulary = load_qwen3_vocabulary(QwenTokenizerConfig(TOKENIZER_CACHE))

    async def main() -> AdapterStats:
        logs = LogCount()
        logging.getLogger("asyncio").addHandler(logs)
        async with adapter(engine_url, vocabulary, admin) as (server, timings, statuses):
            lag = LagMonitor()
            lag.start()
            cpu = cpu_seconds(resource.RUSAGE_SELF)
            conn.send((server.url, server.admin_url))
            await asyncio.get_running_loop().run_in_executor(None, conn.recv)
            return AdapterStats(
                [t.processing * 1000 for t in timings.turns],
                [t.reading_body * 1000 for t in timings.turns],
                statuses,
                await lag.stop(),
                cpu_seconds(resource.RUSAGE_SELF) - cpu,
                logs.count,
                logs.first,
            )

    if loop_kind == "uvloop":
        import uvloop  # type: ignore[import-not-found,unused-ignore]  # optional: --with uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            stats = runner.run(main())
    else:
        stats = asyncio.run(main())
    conn.send(stats)


@dataclass(frozen=True, slots=True)
class Session:
    base_url: str
    token: str
    session_id: str


class Placement(Protocol):
    async def open(self, session_id: str) -> Session: ...

    async def close(self, session: Session) -> int:
        """Close it; the number of turns its tree holds."""
        ...


class InLoop:
    """The adapter served from the driver's own loop."""

    def __init__(self, server: AdapterServer) -> None:
        self.server = server

    async def open(self, session_id: str) -> Session:
        session = self.server.sessions.open(session_id)
        return Session(self.server.url, session.token, session_id)

    async def close(self, session: Session) -> int:
        return len((await self.server.close_session(session.token)).tree.turns)


class OwnProcess:
    """The adapter in a process of its own, sessions over its admin API."""

    def __init__(self, http: aiohttp.ClientSession, url: str, admin_url: str) -> None:
        self.http = http
        self.url = url
        self.admin_url = admin_url
        self.headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

    async def open(self, session_id: str) -> Session:
        async with self.http.post(
            f"{self.admin_url}/admin/sessions",
            json={"session_id": session_id},
            headers=self.headers,
        ) as response:
            response.raise_for_status()
            return Session(self.url, (await response.json())["token"], session_id)

    async def close(self, session: Session) -> int:
        async with self.http.delete(
            f"{self.admin_url}/admin/sessions/{session.token}", headers=self.headers
        ) as response:
            response.raise_for_status()
            text = await response.text()
        return len((await asyncio.to_thread(loads, text)).turns)


# -- episodes --------------------------------------------------------------------------------


@dataclass(slots=True)
class Outcome:
    ok: bool
    turns: int
    note: str = ""


class Agent(Protocol):
    async def __call__(self, placement: Placement, index: int, name: str) -> Outcome:
        """Episode ``index`` of a row, its session named ``name`` (unique in the run)."""
        ...


class ScriptedAgent:
    """curl and jq in a sandbox, ``turns`` calls."""

    def __init__(self, backend: LocalBackend, turns: int) -> None:
        self.backend = backend
        self.turns = turns

    async def __call__(self, placement: Placement, index: int, name: str) -> Outcome:
        session = await placement.open(name)
        try:
            port = int(session.base_url.rsplit(":", 1)[1])
            spec = SandboxSpec(network=ForwardedEndpoint("127.0.0.1", port))
            async with await self.backend.create(spec) as box:
                await box.write_file("agent.sh", AGENT_SCRIPT)
                assert box.endpoint_url is not None  # the spec forwards a port
                env = {"TOKEN": session.token, "URL": box.endpoint_url, "TURNS": str(self.turns)}
                result = await box.exec("bash agent.sh", env=env, timeout=600)
        finally:
            turns = await placement.close(session)
        note = "" if result.ok else f"exit {result.exit_code}: {result.stderr[-200:]}"
        return Outcome(result.ok and turns == self.turns, turns, note)


class ClaudeAgent:
    """The real Claude Code on a demo task, through apps/swe-rl's episode."""

    def __init__(self, backend: LocalBackend, work: Path, budget_s: float) -> None:
        from harness import InstallConfig
        from swe_rl.agents import harness_for
        from swe_rl.demo.repos import create_demo_tasks
        from swe_rl.episode import EpisodeConfig, SweEpisode

        self.tasks = create_demo_tasks(work / "repos")
        config = EpisodeConfig(
            artifacts_root=work / "episodes",
            install=InstallConfig(cache_dir=CACHE / "npm"),
            sources_cache=work / "sources",
        )
        self.agent = harness_for("claude-code")
        self.install = config.install
        self.episode = SweEpisode(config, self.agent, backend)
        self.budget_s = budget_s

    async def prepare(self) -> None:
        await self.agent.install(self.install)

    async def __call__(self, placement: Placement, index: int, name: str) -> Outcome:
        from slime_backend import AdapterSession, Budgets

        session = await placement.open(name)
        try:
            outcome = await self.episode(
                self.tasks[index % len(self.tasks)]["metadata"],
                AdapterSession(session.base_url, session.token, session.session_id),
                Budgets(self.budget_s, 200, CONTEXT, 4096),
                evaluation=False,
            )
        finally:
            turns = await placement.close(session)
        aborted = outcome.status == "aborted"
        return Outcome(not aborted, turns, outcome.reason if aborted else "")


# -- one row ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Row:
    agent: str
    placement: str
    episodes: int
    load: float
    wall_s: float
    failed: int
    turns: int
    sandbox_cpu_s: float
    cli_cpu_s: float
    driver_cpu_s: float
    adapter_cpu_s: float | None
    driver_lag_ms: list[float]
    adapter_lag_ms: list[float]
    added_ms: list[float]
    body_ms: list[float]
    gc_max_ms: float
    asyncio_logs: int
    processes_left: int
    state_left: int
    statuses: Counter[int]
    notes: list[str]


def cpu_seconds(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def children(exclude: set[int]) -> list[str]:
    """This process's children (``pid state command``), those in ``exclude`` and
    multiprocessing's resource tracker left out."""
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in exclude:
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        command, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :]
        state, parent = rest.split()[:2]
        cmdline = Path(f"/proc/{entry}/cmdline").read_bytes() if int(parent) == me else b""
        if int(parent) == me and b"resource_tracker" not in cmdline:
            found.append(f"{entry} {state} {command}")
    return found


class CliCpu:
    """The CPU time of every process named ``claude`` (Claude Code's binary) that descends from
    this one (other users of the machine run Claude Code too), sampled from /proc every 0.2 s
    on a thread; a process's last 0.2 s before it exits are missed. The thread's own CPU is
    kept apart (``own_s``) so the driver's figure can leave it out."""

    def __init__(self, name: str = "claude") -> None:
        self.name = name
        self.seen: dict[int, int] = {}
        self.own_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._ticks = os.sysconf("SC_CLK_TCK")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> float:
        """CPU seconds of the processes seen."""
        self._stop.set()
        self._thread.join()
        return sum(self.seen.values()) / self._ticks

    def _run(self) -> None:
        started = time.thread_time()
        while not self._stop.wait(0.2):
            for entry in os.listdir("/proc"):
                if not entry.isdigit():
                    continue
                try:
                    stat = Path(f"/proc/{entry}/stat").read_text()
                except OSError:
                    continue
                if stat[stat.index("(") + 1 : stat.rindex(")")] != self.name:
                    continue
                if not descends_from_us(int(entry)):
                    continue
                fields = stat[stat.rindex(")") + 2 :].split()
                ticks = int(fields[11]) + int(fields[12])  # utime, stime
                self.seen[int(entry)] = max(self.seen.get(int(entry), 0), ticks)
        self.own_s = time.thread_time() - started


def descends_from_us(pid: int) -> bool:
    me = os.getpid()
    while pid > 1:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        pid = int(stat[stat.rindex(")") + 2 :].split()[1])
        if pid == me:
            return True
    return False


class LogCount(logging.Handler):
    """Counts the ``asyncio`` logger's records of WARNING and above (callback exceptions,
    "Task was destroyed but it is pending", unclosed transports), keeping the first few."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0
        self.first: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1
        if len(self.first) < 3:
            self.first.append(record.getMessage()[:200])

    def __enter__(self) -> LogCount:
        logging.getLogger("asyncio").addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger("asyncio").removeHandler(self)


class GcTimer:
    """The longest garbage collection pass in this process while active."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.longest = max(self.longest, time.perf_counter() - self._started)


async def run_row(
    agent_name: str,
    agent: Agent,
    placement_name: str,
    episodes: int,
    engine_url: str,
    vocabulary: Vocabulary,
    options: argparse.Namespace,
    state_root: Path,
    keep: set[int],
) -> Row:
    lag = LagMonitor()
    gc_timer = GcTimer()
    logs = LogCount()
    stats = AdapterStats()
    conn: multiprocessing.connection.Connection | None = None
    process: multiprocessing.process.BaseProcess | None = None
    async with contextlib.AsyncExitStack() as stack:
        stack.enter_context(logs)
        http = await stack.enter_async_context(aiohttp.ClientSession())
        placement: Placement
        if placement_name == "loop":
            server, timings, statuses = await stack.enter_async_context(
                adapter(engine_url, vocabulary)
            )
            placement = InLoop(server)
        else:
            conn, child = multiprocessing.get_context("spawn").Pipe()
            process = multiprocessing.get_context("spawn").Process(
                target=serve_adapter,
                args=(child, engine_url, options.adapter_loop, ADMIN_TOKEN, options.adapter_nice),
            )
            process.start()
            keep.add(process.pid or 0)
            url, admin_url = await asyncio.to_thread(conn.recv)
            placement = OwnProcess(http, url, admin_url)
        lag.start()
        cli = CliCpu()
        cli.start()
        gc.callbacks.append(gc_timer)
        load = os.getloadavg()[0]
        self_cpu, children_cpu = (
            cpu_seconds(resource.RUSAGE_SELF),
            cpu_seconds(resource.RUSAGE_CHILDREN),
        )
        started = time.monotonic()
        outcomes = await asyncio.gather(
            *(
                agent(placement, index, f"{agent_name}-{placement_name}-{episodes}-{index}")
                for index in range(episodes)
            ),
            return_exceptions=True,
        )
        wall = time.monotonic() - started
        cli_cpu = cli.stop()
        driver_cpu = cpu_seconds(resource.RUSAGE_SELF) - self_cpu - cli.own_s
        sandbox_cpu = cpu_seconds(resource.RUSAGE_CHILDREN) - children_cpu
        gc.callbacks.remove(gc_timer)
        driver_lag = await lag.stop()
        load = max(load, os.getloadavg()[0])
        if placement_name == "loop":
            stats = AdapterStats(
                [t.processing * 1000 for t in timings.turns],
                [t.reading_body * 1000 for t in timings.turns],
                statuses,
            )
        else:
            assert conn is not None
            conn.send("stop")
            stats = await asyncio.to_thread(conn.recv)
    if process is not None:
        await asyncio.to_thread(process.join, 30)
        keep.discard(process.pid or 0)
    await asyncio.sleep(0.5)  # let anything a sandbox left behind die and come back to us
    left = children(keep)
    notes = [
        f"{type(o).__name__}: {o}" if isinstance(o, BaseException) else o.note
        for o in outcomes
        if isinstance(o, BaseException) or not o.ok
    ]
    notes += [f"left: {entry}" for entry in left]
    notes += [f"asyncio: {message}" for message in logs.first + stats.asyncio_first]
    return Row(
        agent_name,
        placement_name,
        episodes,
        load,
        wall,
        len([o for o in outcomes if isinstance(o, BaseException) or not o.ok]),
        sum(o.turns for o in outcomes if isinstance(o, Outcome)),
        sandbox_cpu,
        cli_cpu,
        driver_cpu,
        stats.cpu_s,
        driver_lag,
        stats.lag_ms,
        stats.added_ms,
        stats.body_ms,
        gc_timer.longest * 1000,
        logs.count + stats.asyncio_logs,
        len(left),
        len(list(state_root.iterdir())),
        stats.statuses,
        notes,
    )


# -- the table -------------------------------------------------------------------------------


def percentile(values: Sequence[float], share: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def lag_cell(values: Sequence[float]) -> str:
    if not values:
        return "-"
    return f"{percentile(values, 0.5):.1f} / {percentile(values, 0.99):.1f} / {max(values):.0f}"


def row_cells(row: Row) -> list[str]:
    per = max(row.episodes, 1)
    adapter_cpu = "in driver" if row.adapter_cpu_s is None else f"{row.adapter_cpu_s / per:.2f}"
    added = (
        f"{percentile(row.added_ms, 0.5):.1f} / {percentile(row.added_ms, 0.99):.1f}"
        if row.added_ms
        else "-"
    )
    errors = sum(n for status, n in row.statuses.items() if status >= 500)
    mine = row.driver_cpu_s + (row.adapter_cpu_s or 0.0)
    ours = f"{100 * mine / row.cli_cpu_s:.0f}%" if row.cli_cpu_s else "-"
    return [
        row.agent,
        row.placement,
        str(row.episodes),
        f"{row.load:.1f}",
        f"{row.episodes / row.wall_s * 3600:,.0f}",
        str(row.failed),
        f"{row.turns / per:.1f}",
        f"{row.sandbox_cpu_s / per:.2f}",
        f"{row.cli_cpu_s / per:.2f}" if row.cli_cpu_s else "-",
        f"{row.driver_cpu_s / per:.2f}",
        adapter_cpu,
        ours,
        lag_cell(row.driver_lag_ms),
        lag_cell(row.adapter_lag_ms),
        added,
        f"{percentile(row.body_ms, 0.5):.1f} / {percentile(row.body_ms, 0.99):.1f}"
        if row.body_ms
        else "-",
        f"{row.gc_max_ms:.0f}",
        str(row.asyncio_logs),
        str(row.processes_left),
        str(row.state_left),
        f"{errors} / {row.statuses.get(529, 0)}",
    ]


COLUMNS = [
    "agent",
    "adapter",
    "N",
    "load",
    "episodes/h",
    "failed",
    "turns/ep",
    "sandbox CPU s/ep",
    "CLI CPU s/ep",
    "driver CPU s/ep",
    "adapter CPU s/ep",
    "(driver+adapter)/CLI",
    "driver lag p50/p99/max ms",
    "adapter lag p50/p99/max ms",
    "added p50/p99 ms",
    "body in p50/p99 ms",
    "driver GC max ms",
    "asyncio warnings",
    "procs left",
    "state left",
    "5xx / 529",
]


def markdown(rows: Sequence[Row]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row_cells(row)) + " |" for row in rows]
    return "\n".join(lines)


# -- main ------------------------------------------------------------------------------------


def csv(kind: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    return lambda text: [kind(part) for part in text.split(",") if part]


async def bench(options: argparse.Namespace, console: Console) -> list[Row]:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    vocabulary = await asyncio.to_thread(
        load_qwen3_vocabulary, QwenTokenizerConfig(TOKENIZER_CACHE)
    )
    rows: list[Row] = []
    work = Path(tempfile.mkdtemp(prefix="node-scale-"))
    try:
        for agent_name in options.agent:
            state_root = work / f"state-{agent_name}"
            state_root.mkdir()
            backend = LocalBackend(LocalConfig(state_root=state_root))
            agent: Agent
            if agent_name == "scripted":
                agent = ScriptedAgent(backend, options.turns)
            else:
                claude = ClaudeAgent(backend, work / "claude", options.budget)
                await claude.prepare()
                agent = claude
            conn, child = multiprocessing.get_context("spawn").Pipe()
            engine = multiprocessing.get_context("spawn").Process(
                target=serve_engine,
                args=(child, agent_name, options.engine_latency, options.engine_jitter),
            )
            engine.start()
            keep = {engine.pid or 0}
            engine_url = await asyncio.to_thread(conn.recv)
            try:
                for placement in options.placement:
                    for episodes in options.episodes:
                        row = await run_row(
                            agent_name,
                            agent,
                            placement,
                            episodes,
                            engine_url,
                            vocabulary,
                            options,
                            state_root,
                            keep,
                        )
                        rows.append(row)
                        console.print(" | ".join(row_cells(row)), highlight=False)
                        for note in row.notes[:5]:
                            console.print(f"    {note}", highlight=False)
            finally:
                conn.send("stop")
                engine_cpu = await asyncio.to_thread(conn.recv)
                await asyncio.to_thread(engine.join, 30)
                console.print(f"engine double ({agent_name}): {engine_cpu:.1f} CPU s in all")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agent", type=csv(str), default=["scripted", "claude"])
    parser.add_argument("--episodes", type=csv(int), default=[1, 8, 32, 64])
    parser.add_argument("--placement", type=csv(str), default=["loop", "process"])
    parser.add_argument("--adapter-loop", choices=["asyncio", "uvloop"], default="asyncio")
    parser.add_argument(
        "--adapter-nice", type=int, default=0, help="the adapter process's nice value (root: < 0)"
    )
    parser.add_argument("--turns", type=int, default=10, help="scripted agent's model calls")
    parser.add_argument("--engine-latency", type=float, default=0.2, help="seconds per answer")
    parser.add_argument(
        "--engine-jitter",
        type=float,
        default=0.0,
        help="each answer's latency drawn from latency * (1 +- jitter); 0 keeps agents in lockstep",
    )
    parser.add_argument("--budget", type=float, default=900.0, help="Claude Code's budget, s")
    options = parser.parse_args()
    console = Console(width=250)
    console.print(
        f"node_scale: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}, "
        f"adapter loop {options.adapter_loop}, adapter nice {options.adapter_nice}, "
        f"engine latency {options.engine_latency}s +- {options.engine_jitter * 100:.0f}%; "
        f"row: {' | '.join(COLUMNS)}",
        highlight=False,
    )
    rows = asyncio.run(bench(options, console))
    table = Table(title="node_scale", title_justify="left")
    for column in COLUMNS:
        table.add_column(column)
    for row in rows:
        table.add_row(*row_cells(row))
    console.print(table)
    print(markdown(rows))
    return 1 if any(row.failed or row.processes_left or row.asyncio_logs for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
