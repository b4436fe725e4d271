"""The adapter refusing over-long requests: how fast, how much memory, how responsive meanwhile.

    uv run tools/bench/big_body_bench.py                            # all cases, 32k and 128k
    uv run tools/bench/big_body_bench.py --cases messages-text --body-mb 20 --context 131072
    uv run tools/bench/big_body_bench.py --cases count-text,count-word --context 32768
    uv run tools/bench/big_body_bench.py --pretokenizer gpt2 --cases messages-text
    uv run tools/bench/big_body_bench.py --adapter-src OLD_SRC --rss-cap-gb 6

A request far over the context limit (by default 20 MB of log and code text, under the 64 MiB
body limit) must be refused with "prompt is too long" without tokenizing all of it, in bounded
memory, while the adapter keeps answering everyone else.

Cases (``--cases``, comma-separated; one row per case and context length):

- ``messages-text``: ``POST /v1/messages`` with ``--body-mb`` (20) MiB of varied log and code text.
- ``count-text``: ``POST /v1/messages/count_tokens`` with ``--count-body-mb`` (4) MiB of that text.
- ``messages-word``, ``count-word``: both endpoints with one word and no space or newline in it,
  ``"a" * 20_000_000`` (``--word-mb`` million characters) in one user text block: no place where
  Qwen's pre-tokenizer always splits, so it cannot be encoded a piece at a time.

``--pretokenizer gpt2`` gives the adapter the Qwen3 vocabulary with GPT-2's ByteLevel regex as its
pre-tokenizer instead of Qwen's split (as the tokenizer tests do), a vocabulary the adapter cannot
cut in pieces: it encodes such text in one piece.

The right answer for a body: the 400 "prompt is too long: N tokens > M maximum" (N > M, M the
session's limit, context - 2) when its prompt is over the limit; for ``count_tokens`` under it,
200 with ``input_tokens`` <= M. The bench decides which before the row from the text alone, with
this checkout's Qwen3 vocabulary (its count stops at the limit plus a margin; a text within the
margin of the limit accepts either answer), and checks every answer against it.

Two processes: the adapter (the real ``AdapterServer``: Anthropic dialect, bridge renderer with
the real Qwen3 tokenizer, SGLang client) runs in a Python of its own, and this process holds the
SGLang-wire engine double (which the refused requests never reach) and the clients: raw aiohttp.
``--adapter-src`` puts another checkout's ``packages/protocol-adapters/src`` first on the
adapter's path, to measure an older adapter side by side (before/after). ``--rss-cap-gb`` kills
the adapter if it grows past the cap (an old adapter can take the machine's memory) and reports
the row as over the cap. ``--row-budget`` (180 s) cuts a row that takes longer (the alone request
and the concurrent ones together): the cut requests are shown as "> N s", the adapter is killed.

For each case and context length, a fresh adapter: a warm-up request, then one request alone
(time to the answer), then ``--concurrent`` at once while ``/health`` is polled every 10 ms and
the adapter's RSS is sampled every 10 ms (from ``/proc``): the slowest answer, the largest
``/health`` latency and its p50, the RSS growth over the idle adapter at the peak and 2 s after
the last answer. The exit status is 1 if any answer is not the right one, any request reached
the engine, or a row was cut or over the cap.

Targets (2 cores): one refusal < 1 s; with 4 at once, RSS growth < 1 GB and ``/health`` < 50 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import multiprocessing
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from protocol_adapters import Vocabulary

TARGET_ALONE_S = 1.0
TARGET_RSS_GROWTH_MB = 1024.0
TARGET_HEALTH_MS = 50.0
SAMPLE_EVERY = 0.01
TOO_LONG = re.compile(r"prompt is too long: (\d+) tokens > (\d+) maximum")
MESSAGES = "/v1/messages"
COUNT_TOKENS = "/v1/messages/count_tokens"
PRETOKENIZERS = ("qwen", "gpt2")
EXPECTED_MARGIN = 64
"""Tokens of slack either side of the limit for the expected answer: the chat template's own
tokens (system prompt, role markers, generation prompt) are not in the bench's count."""


@dataclass(frozen=True)
class Case:
    name: str
    endpoint: str
    body: str  # "text" or "word"


CASES = {
    case.name: case
    for case in (
        Case("messages-text", MESSAGES, "text"),
        Case("count-text", COUNT_TOKENS, "text"),
        Case("messages-word", MESSAGES, "word"),
        Case("count-word", COUNT_TOKENS, "word"),
    )
}


# -- the adapter, in a process of its own ----------------------------------------------------------


def serve_adapter(engine_url: str, cache_dir: str, context: int, pretokenizer: str) -> None:
    """Run the adapter; print its URL and a session token, serve until stdin closes.

    Imports happen here, after ``--adapter-src`` was put on ``sys.path`` by the environment, and
    use only calls an older adapter also has.
    """
    from tokenizers import pre_tokenizers

    import protocol_adapters
    from protocol_adapters import (
        AdapterConfig,
        AdapterServer,
        QwenTokenizerConfig,
        Renderer,
        RendererConfig,
        SessionLimits,
        SGLangConfig,
        SGLangEngine,
        Vocabulary,
        load_qwen3_vocabulary,
        qwen3_template,
        reply_parsers,
    )

    async def serve() -> None:
        vocabulary = load_qwen3_vocabulary(QwenTokenizerConfig(Path(cache_dir)))
        if pretokenizer == "gpt2":  # as tests/template/test_tokenizer_pieces.py does
            tokenizer = vocabulary.tokenizer
            tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(
                add_prefix_space=False, use_regex=True
            )
            vocabulary = Vocabulary(tokenizer, "qwen3-gpt2-split")
        renderer = Renderer(vocabulary, qwen3_template(), RendererConfig())
        config = AdapterConfig(limits=SessionLimits(max_turns=10_000, context_tokens=context))
        async with (
            SGLangEngine(SGLangConfig(base_url=engine_url)) as engine,
            AdapterServer(config, engine, renderer, vocabulary, reply_parsers()) as server,
        ):
            tokens = [server.sessions.open(f"big-{i}").token for i in range(64)]
            started = {
                "url": server.url,
                "tokens": tokens,
                "vocabulary": vocabulary.name,
                "piecewise": getattr(vocabulary, "_piecewise", None),
                "source": str(Path(protocol_adapters.__file__).parent),
            }
            print(json.dumps(started), flush=True)
            await asyncio.to_thread(sys.stdin.read)

    asyncio.run(serve())


@dataclass
class Adapter:
    process: subprocess.Popen[str]
    url: str
    tokens: list[str]
    vocabulary: str
    piecewise: bool | None
    source: str
    capped: bool = False  # killed by the bench for growing past the RSS cap

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
                self.kill()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        if self.process.stdin is not None:
            self.process.stdin.close()


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
    engine_url: str, cache_dir: Path, context: int, adapter_src: Path | None, pretokenizer: str
) -> Adapter:
    env = dict(os.environ)
    if adapter_src is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(adapter_src), env.get("PYTHONPATH")]))
    command = [sys.executable, __file__, "--serve-adapter", engine_url, str(cache_dir)]
    process = subprocess.Popen(
        [*command, str(context), pretokenizer],
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
    return Adapter(
        process,
        started["url"],
        started["tokens"],
        started["vocabulary"],
        started["piecewise"],
        started["source"],
    )


# -- the bodies ------------------------------------------------------------------------------------


def log_text(megabytes: float, seed: int = 7) -> str:
    """``megabytes`` (MiB) of varied log and code, one line after another."""
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
    return "\n".join(lines)


def one_word(megabytes: float) -> str:
    """``megabytes`` million letters and nothing between them: ``"a" * 20_000_000``."""
    return "a" * int(megabytes * 1_000_000)


def request_body(text: str, endpoint: str) -> bytes:
    """An Anthropic request whose one user message is one text block of ``text``
    (``count_tokens`` bodies carry no ``max_tokens``)."""
    body: dict[str, object] = {
        "model": "policy",
        "system": "You are a coding agent.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}],
    }
    if endpoint == MESSAGES:
        body["max_tokens"] = 1024
    return json.dumps(body).encode()


def big_body(megabytes: float, seed: int = 7) -> bytes:
    """A ``/v1/messages`` request whose one user message is ``megabytes`` of log and code."""
    return request_body(log_text(megabytes, seed), MESSAGES)


@dataclass(frozen=True)
class Expected:
    """The right answer for a text at a limit: "400", "200" or "either" (within the margin)."""

    answer: str
    counted: int  # the bench's count, stopped past the limit plus the margin
    seconds: float


def expected_answer(
    vocabulary: Vocabulary, text: str, limit: int, margin: int, cache_dir: Path
) -> Expected:
    """Count ``text`` with this checkout's vocabulary, stopping past ``limit + margin``: over it,
    the 400; under ``limit - margin`` the 200; between, either. Kept in ``cache_dir`` (a 20 MB
    word within the limit has no cut point: counting it takes ~30 s and 1.5 GB)."""
    from protocol_adapters._tokenizer import TooManyTokens

    key = hashlib.sha256(text.encode("utf-8", "surrogatepass"))
    key.update(f"{vocabulary.name} {vocabulary.size} {limit} {margin}".encode())
    cached = cache_dir / f"big-body-expected-{key.hexdigest()[:16]}.json"
    if cached.is_file():
        answer, counted = json.loads(cached.read_text())
        return Expected(answer, counted, 0.0)
    began = time.perf_counter()
    try:
        counted = vocabulary.count(text, max_tokens=limit + margin)
        answer = "200" if counted <= limit - margin else "either"
    except TooManyTokens as exc:
        counted, answer = exc.counted, "400"
    cached.write_text(json.dumps([answer, counted]))
    return Expected(answer, counted, time.perf_counter() - began)


# -- the requests and the measurements -------------------------------------------------------------


@dataclass
class Answer:
    seconds: float
    status: int  # 0: no answer (the adapter died); -1: cut at the row's budget
    message: str
    tokens: int | None = None  # N of "N tokens > M maximum", or count_tokens' input_tokens
    maximum: int | None = None  # M of "N tokens > M maximum"

    @property
    def kind(self) -> str:
        """What came back: "400" (prompt is too long, N > M), "200" (a count), else what."""
        if self.status == 400 and self.tokens is not None and self.maximum is not None:
            return "400" if self.tokens > self.maximum else "400 with N <= M"
        if self.status == 200 and self.tokens is not None:
            return "200"
        return {-1: "cut", 0: "no answer"}.get(self.status, f"HTTP {self.status}")

    def shown(self) -> str:
        if self.kind == "400":
            return f"400: {self.tokens:,} > {self.maximum:,}"
        if self.kind == "200":
            return f"200: {self.tokens:,} tokens"
        return self.kind


async def ask(
    http: aiohttp.ClientSession, adapter: Adapter, token: str, endpoint: str, body: bytes
) -> Answer:
    began = time.perf_counter()
    try:
        async with http.post(
            adapter.url + endpoint,
            data=body,
            headers={"x-api-key": token, "content-type": "application/json"},
        ) as response:
            text = await response.text()
    except aiohttp.ClientError as exc:  # the adapter died (killed over the RSS cap?)
        return Answer(time.perf_counter() - began, 0, f"no answer: {exc!r}")
    seconds = time.perf_counter() - began
    try:
        decoded = json.loads(text)
        if response.status == 200 and endpoint == COUNT_TOKENS:
            tokens = int(decoded["input_tokens"])
            return Answer(seconds, 200, f"input_tokens {tokens}", tokens)
        message = str(decoded["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return Answer(seconds, response.status, text[:200])
    found = TOO_LONG.match(message)
    if found is None:
        return Answer(seconds, response.status, message)
    return Answer(seconds, response.status, message, int(found[1]), int(found[2]))


async def ask_within(
    http: aiohttp.ClientSession,
    adapter: Adapter,
    tokens: list[str],
    endpoint: str,
    body: bytes,
    deadline: float,
) -> list[Answer]:
    """One request per token, all at once; those unanswered at ``deadline`` are cut."""
    began = time.perf_counter()
    tasks = [asyncio.create_task(ask(http, adapter, token, endpoint, body)) for token in tokens]
    await asyncio.wait(tasks, timeout=max(0.0, deadline - began))
    answers: list[Answer] = []
    for task in tasks:
        if task.done():
            answers.append(task.result())
        else:
            task.cancel()
            answers.append(Answer(time.perf_counter() - began, -1, "cut at the row's budget"))
    await asyncio.gather(*tasks, return_exceptions=True)
    return answers


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
            adapter.capped = True
            adapter.process.send_signal(signal.SIGKILL)
            break
        await asyncio.sleep(SAMPLE_EVERY)
    return samples


@dataclass
class Row:
    case: Case
    context: int
    body_mb: float
    expected: Expected
    alone: Answer
    concurrent: list[Answer]
    idle_mb: float
    peak_mb: float
    after_mb: float
    health_ms: list[float]
    over_cap: bool
    cut: bool
    problems: list[str] = field(default_factory=list)


async def measure(
    engine_url: str,
    args: argparse.Namespace,
    case: Case,
    context: int,
    body: bytes,
    expected: Expected,
    console: Console,
) -> Row:
    adapter = await start_adapter(
        engine_url, args.cache_dir, context, args.adapter_src, args.pretokenizer
    )
    cap_mb = args.rss_cap_gb * 1024
    where = f"{case.name}, context {context:,}"
    concurrent: list[Answer] = []
    health: list[float] = []
    try:
        timeout = aiohttp.ClientTimeout(total=args.row_budget + 60)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            # Warm up: imports, caches, the worker threads and (over 8 MB) the large-body thread.
            await ask(http, adapter, adapter.tokens[0], MESSAGES, big_body(args.warm_up_mb, 1))
            await asyncio.sleep(1.0)
            idle_mb = adapter.rss_mb()
            pieces = {True: "in pieces", False: "in one piece", None: "?"}[adapter.piecewise]
            console.print(
                f"  {where}: one request alone ({adapter.source}, {adapter.vocabulary}, {pieces})"
            )
            deadline = time.perf_counter() + args.row_budget
            stop = asyncio.Event()
            sampling = asyncio.create_task(rss_samples(adapter, stop, cap_mb))
            (alone,) = await ask_within(
                http, adapter, adapter.tokens[1:2], case.endpoint, body, deadline
            )
            if alone.status > 0:  # neither cut nor the adapter gone
                console.print(f"  {where}: {args.concurrent} at once")
                here, there = multiprocessing.get_context("spawn").Pipe()
                poller = multiprocessing.get_context("spawn").Process(
                    target=poll_health, args=(adapter.url, there), daemon=True
                )
                poller.start()
                await asyncio.to_thread(here.recv)  # polling
                tokens = adapter.tokens[2 : 2 + args.concurrent]
                concurrent = await ask_within(http, adapter, tokens, case.endpoint, body, deadline)
                if all(answer.status > 0 for answer in concurrent):
                    await asyncio.sleep(2.0)
                here.send("stop")
                health = await asyncio.to_thread(here.recv)
                poller.join(10)
            stop.set()
            rss = await sampling
            cut = any(answer.status == -1 for answer in [alone, *concurrent])
            gone = adapter.process.poll() is not None
            after_mb = float("nan") if gone or cut else adapter.rss_mb()
            if cut:
                adapter.kill()  # still encoding: no need to wait for it
    finally:
        adapter.stop()
    row = Row(
        case=case,
        context=context,
        body_mb=len(body) / 2**20,
        expected=expected,
        alone=alone,
        concurrent=concurrent,
        idle_mb=idle_mb,
        peak_mb=max(rss, default=idle_mb),
        after_mb=after_mb,
        health_ms=health,
        over_cap=adapter.capped,
        cut=cut,
    )
    row.problems.extend(wrong_answers(row, context - 2))
    if adapter.capped:
        row.problems.append(f"the adapter grew past {args.rss_cap_gb} GB and was killed")
    elif gone and not cut:
        row.problems.append(f"the adapter exited (status {adapter.process.returncode})")
    if cut:
        row.problems.append(f"cut at the row's budget of {args.row_budget:.0f} s")
    return row


def wrong_answers(row: Row, limit: int) -> list[str]:
    """Each answer that is not the right one for the body (cut requests are reported apart)."""
    wanted = {"400": {"400"}, "200": {"200"}, "either": {"400", "200"}}[row.expected.answer]
    if row.case.endpoint == MESSAGES:
        wanted -= {"200"}  # /v1/messages under the limit would reach the engine: not this bench
    problems: list[str] = []
    for answer in [row.alone, *row.concurrent]:
        if answer.status == -1:
            continue
        if answer.kind not in wanted:
            expected = " or ".join(sorted(wanted)) or "no request under the limit"
            problems.append(f"{answer.shown()} ({answer.message[:100]}), expected {expected}")
        elif answer.kind == "400" and answer.maximum != limit:
            problems.append(f"{answer.shown()}: the maximum is not the session's {limit:,}")
        elif answer.kind == "200" and answer.tokens is not None and answer.tokens > limit:
            problems.append(f"{answer.shown()}: a count over the {limit:,} limit")
    return problems


def right_answer(row: Row) -> str:
    """PASS if every answer that came was the right one ("-" if none came)."""
    if all(answer.status <= 0 for answer in [row.alone, *row.concurrent]):
        return "-"
    wrong = [p for p in row.problems if not p.startswith(("cut at", "the adapter"))]
    return verdict(not wrong)


def verdict(ok: bool) -> str:
    return "[green]PASS[/]" if ok else "[red]MISS[/]"


def seconds(answers: list[Answer]) -> str:
    """The slowest of ``answers``; "> N s" if any was cut, and how many had answered by then."""
    if not answers:
        return "-"
    slowest = max(answer.seconds for answer in answers)
    cut = sum(answer.status == -1 for answer in answers)
    if not cut:
        return f"{slowest:.2f}"
    if len(answers) == 1:
        return f"> {slowest:.0f}"
    return f"> {slowest:.0f} ({len(answers) - cut} of {len(answers)} answered)"


def table(rows: list[Row], label: str, concurrent: int) -> Table:
    out = Table(title=f"Over-long requests refused ({label})")
    for column in (
        "case",
        "context",
        "body MB",
        "answer (alone)",
        "expected",
        "alone s",
        f"{concurrent} at once: slowest s",
        "idle RSS MB",
        "peak +MB",
        "+MB 2 s after",
        "/health p50 ms",
        "/health max ms",
        "right answer",
        "alone < 1 s",
        "+RSS < 1 GB",
        "/health < 50 ms",
    ):
        out.add_column(column, justify="right")
    for row in rows:
        growth = row.peak_mb - row.idle_mb
        health_max = max(row.health_ms, default=float("nan"))
        out.add_row(
            row.case.name,
            f"{row.context:,}",
            f"{row.body_mb:.1f}",
            row.alone.shown(),
            row.expected.answer,
            seconds([row.alone]),
            seconds(row.concurrent),
            f"{row.idle_mb:,.0f}",
            f"{growth:,.0f}" + (" (cap)" if row.over_cap else ""),
            "-" if math.isnan(row.after_mb) else f"{row.after_mb - row.idle_mb:,.0f}",
            f"{statistics.median(row.health_ms):.1f}" if row.health_ms else "-",
            "-" if math.isnan(health_max) else f"{health_max:.1f}",
            right_answer(row),
            verdict(row.alone.status > 0 and row.alone.seconds < TARGET_ALONE_S),
            verdict(growth < TARGET_RSS_GROWTH_MB and not row.over_cap),
            verdict(health_max < TARGET_HEALTH_MS),
        )
    return out


async def bench(args: argparse.Namespace, console: Console) -> int:
    from protocol_adapters import QwenTokenizerConfig, load_qwen3_vocabulary
    from protocol_adapters.testing import EngineDouble
    from protocol_adapters.testing.stack import VocabularyTokenizer

    vocabulary = load_qwen3_vocabulary(QwenTokenizerConfig(args.cache_dir))
    texts = {
        ("text", MESSAGES): lambda: log_text(args.body_mb),
        ("text", COUNT_TOKENS): lambda: log_text(args.count_body_mb),
        ("word", MESSAGES): lambda: one_word(args.word_mb),
        ("word", COUNT_TOKENS): lambda: one_word(args.word_mb),
    }
    rows: list[Row] = []
    expectations: dict[tuple[str, int, int], Expected] = {}  # the word cases share their text
    for case in args.cases:
        text = texts[case.body, case.endpoint]()
        body = request_body(text, case.endpoint)
        for context in args.context:
            # A GPT-2 split counts somewhat differently from Qwen's: a wider margin.
            margin = EXPECTED_MARGIN + (context // 10 if args.pretokenizer != "qwen" else 0)
            key = (case.body, len(text), context)
            if key not in expectations:
                expectations[key] = expected_answer(
                    vocabulary, text, context - 2, margin, args.cache_dir
                )
            expected = expectations[key]
            console.print(
                f"  {case.name}, context {context:,}: expected {expected.answer} "
                f"(this checkout's Qwen3 count, stopped past {context - 2 + margin:,}: "
                f"{expected.counted:,}, {expected.seconds:.1f} s)"
            )
            async with EngineDouble(
                VocabularyTokenizer(vocabulary), [], context_length=context
            ) as double:
                rows.append(await measure(double.url, args, case, context, body, expected, console))
                if double.requests:
                    rows[-1].problems.append(f"{len(double.requests)} requests reached the engine")
        del text, body
    label = f"adapter from {args.adapter_src}" if args.adapter_src else "this checkout's adapter"
    label += f", {args.pretokenizer} pre-tokenizer, load average {os.getloadavg()[0]:.2f} at end"
    console.print(table(rows, label, args.concurrent))
    for row in rows:
        where = f"{row.case.name}, context {row.context:,}"
        for problem in row.problems:
            console.print(f"[red]{where}: {problem}[/]")
        console.print(f"{where}: {row.alone.message[:100]}")
        if row.concurrent:
            each = ", ".join(f"{answer.seconds:.1f} s ({answer.kind})" for answer in row.concurrent)
            console.print(f"{where}: {len(row.concurrent)} at once, each: {each}")
    return 1 if any(row.problems for row in rows) else 0


def main() -> int:
    if len(sys.argv) == 6 and sys.argv[1] == "--serve-adapter":
        serve_adapter(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cases",
        type=lambda s: [CASES[name] for name in s.split(",")],
        default=list(CASES.values()),
        help=f"comma-separated, of {', '.join(CASES)} (default: all)",
    )
    parser.add_argument("--body-mb", type=float, default=20.0, help="messages-text, MiB")
    parser.add_argument("--count-body-mb", type=float, default=4.0, help="count-text, MiB")
    parser.add_argument(
        "--word-mb", type=float, default=20.0, help="the word cases, million characters"
    )
    parser.add_argument("--concurrent", type=int, default=4)
    parser.add_argument(
        "--pretokenizer",
        choices=PRETOKENIZERS,
        default="qwen",
        help="the adapter's vocabulary: Qwen3 as is, or with GPT-2's ByteLevel regex split",
    )
    parser.add_argument(
        "--warm-up-mb",
        type=float,
        help="the warm-up /v1/messages request (default 9, over 8 MB, so it also warms the "
        "large-body thread; 1 with --pretokenizer gpt2, which would encode 9 MB whole); "
        "it must be over every context's limit, or it reaches the engine",
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
        "--row-budget",
        type=float,
        default=180.0,
        help="seconds a row (alone and concurrent) may take before it is cut",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "protocol-adapters-bench",
        help="where the converted Qwen3 tokenizer is cached",
    )
    args = parser.parse_args()
    if args.warm_up_mb is None:
        args.warm_up_mb = 1.0 if args.pretokenizer == "gpt2" else 9.0
    console = Console(width=300)
    console.print(
        f"[bold]big_body_bench[/] {os.cpu_count()} cores, load average "
        f"{os.getloadavg()[0]:.2f}; adapter in its own process; "
        f"Python {sys.version.split()[0]}"
    )
    return asyncio.run(bench(args, console))


if __name__ == "__main__":
    sys.exit(main())
