"""How trajectory-tree holds up over a long Claude Code session, driven as an adapter drives it.

    uv run tools/bench/trajectory_tree_bench.py [--turns 20,200,1000] [--quick] [--profile]

Every turn of a synthetic session is driven the way the Anthropic adapter drives the tree: Claude
Code's real request body (the whole history, tool_use/tool_result blocks, ~3 MB at 200 turns) is
parsed with ``json.loads``, turned into a neutral ``Prompt`` by the Anthropic dialect's own
``parse_request``, routed, the engine prompt is materialized with ``route.prefix_ids()``, and the
reply is recorded from a ``BridgedPrompt`` (scaffold + tool output segments). Each turn adds one
assistant tool call and a ~5k-token tool result, so 200 turns reach a 1M-token context and 1,000
turns reach 5M. Claude Code echoes each tool call's ``input`` with sorted keys and no whitespace
while the model emitted spaces, so every turn exercises the canonical (slow-path) match once.

``json.loads`` of the body is the floor the client already imposes on every adapter: the tree's own
cost (route + record) is printed next to it, with linearization time and the memory the tree retains
(tracemalloc, measured in a separate pass so it does not distort the timings) against the raw token
arrays it has to hold at minimum (int32 per unique token + float64 per generated logprob).
``--profile`` adds cProfile reports of the 200-turn route + record loop and of ``linearize``.

Token ids are random in a Qwen-sized vocabulary (no tokenizer is involved: the tree never looks at
text), tool results are generated log and code lines at ~3 characters per token, and the session is
seeded, so runs are comparable.
"""

from __future__ import annotations

import argparse
import base64
import cProfile
import gc
import io
import json
import math
import os
import platform
import pstats
import random
import shutil
import statistics
import sys
import time
import tracemalloc
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text as RichText

from protocol_adapters._dialects.anthropic import parse_request
from trajectory_tree import (
    BridgedPrompt,
    Completion,
    FinishReason,
    LossReason,
    Message,
    Reasoning,
    Segment,
    SessionTree,
    Text,
    ToolCall,
    linearize,
)

# -- targets and the peers' numbers (quoted from the issue, never measured here) -------------------

TARGET_ROUTE_RECORD_MS = 0.25
TARGET_LINEARIZE_MS = 20.0
TARGET_MEMORY_RATIO = 2.0
TARGET_GROWTH_FACTOR = 1.5
"""A per-token cost may grow by at most this factor from 200 to 1,000 turns ("roughly linear")."""
TARGET_SHAPE = 200
GROWTH_SHAPE = 1000

PEERS_ROUTE_MS = "0.7-0.8"
PEERS_LINEARIZE_MS = "2,200-2,400"
PEERS_RETAINED = "3.9 GB"
PEERS_AT_1000 = "RecursionError"

# -- token ids: the real Qwen special ids, random ids elsewhere ------------------------------------

VOCAB = 151_643  # Qwen's ordinary (non-special) token ids are 0..151642
NL, USER, ASSISTANT = 198, 872, 77091
IM_START, IM_END = 151_644, 151_645
TOOL_CALL, TOOL_CALL_END = 151_657, 151_658
TOOL_RESPONSE, TOOL_RESPONSE_END = 151_665, 151_666
THINK, THINK_END = 151_667, 151_668
CHARS_PER_TOKEN = 3
TOOL_RESULT_TOKENS = (4_500, 5_500)
ID_POOL = 1 << 20
LINE_POOL = 8_192

OPEN_TOOL_RESPONSE = (NL, IM_START, USER, NL, TOOL_RESPONSE, NL)
"""Closes the previous reply (its ``<|im_end|>`` was generated) and opens the tool message."""
CLOSE_TOOL_RESPONSE = (NL, TOOL_RESPONSE_END, IM_END, NL)
GENERATION_PROMPT = (IM_START, ASSISTANT, NL)

TOOL_NAMES = (
    "Agent",
    "Bash",
    "Glob",
    "Grep",
    "Read",
    "Edit",
    "Write",
    "NotebookEdit",
    "WebFetch",
    "TodoWrite",
    "WebSearch",
    "BashOutput",
)
_WORD_LIST = """parser config session cache request worker token schema module buffer index handler
router branch sample reward episode sandbox engine stream client server value result record batch
window limit offset payload header status commit patch diff test fixture"""
WORDS = tuple(_WORD_LIST.split())


# -- the synthetic session -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ModelReply:
    """One engine reply: what the model generated and what Claude Code echoes back later."""

    thinking: str
    signature: str
    text: str
    call_id: str
    tool: str
    arguments: dict[str, Any]
    """In the order the model emitted them."""
    raw_arguments: str
    """The model's own JSON text (default separators: spaces after ``:`` and ``,``)."""
    output_ids: array[int]
    logprobs: array[float]

    def message(self) -> Message:
        """The assistant message the adapter's parser builds from the output."""
        return Message(
            "assistant",
            (
                Reasoning(self.thinking, signature=self.signature),
                Text(self.text),
                ToolCall(self.call_id, self.tool, self.raw_arguments),
            ),
        )

    def echo(self) -> dict[str, Any]:
        """The assistant entry in Claude Code's next request: ``input`` re-serialized, sorted."""
        return {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": self.thinking, "signature": self.signature},
                {"type": "text", "text": self.text},
                {
                    "type": "tool_use",
                    "id": self.call_id,
                    "name": self.tool,
                    "input": dict(sorted(self.arguments.items())),
                },
            ],
        }


@dataclass(frozen=True, slots=True)
class ToolResult:
    call_id: str
    text: str
    ids: array[int]


class SyntheticSession:
    """A seeded Claude Code session: system prompt, 12 tools, a task, then tool-call turns."""

    def __init__(self, seed: int) -> None:
        self._rng = rng = random.Random(seed)
        # Pools drawn once, sampled per turn: keeps setting up 1,000 turns cheap and leaves
        # every tool result's text and ids distinct objects, as the adapter would see them.
        self._id_pool = array("i", rng.choices(range(VOCAB), k=ID_POOL))
        makers = (self._log_line, self._code_line, self._test_line)
        self._lines = [rng.choice(makers)() for _ in range(LINE_POOL)]
        self.system = [
            "You are Claude Code, Anthropic's official CLI for Claude.",
            self._prose(12_000),
        ]
        self.tools = [
            {
                "name": name,
                "description": self._prose(1_900),
                "input_schema": self._schema(name),
            }
            for name in TOOL_NAMES
        ]
        self.task = [
            "<system-reminder>As you answer the user's questions, you can use the following "
            "context.</system-reminder>",
            "Fix the failing test in tests/test_router.py. " + self._prose(1_200),
        ]
        self.environment = "<env>Working directory: /repo\nPlatform: linux\n" + self._log(400)

    def context_ids(self) -> array[int]:
        """Token ids of everything before the first reply (system, tools, task, environment)."""
        chars = (
            sum(map(len, self.system))
            + len(json.dumps(self.tools))
            + sum(map(len, self.task))
            + len(self.environment)
        )
        return self._ids(chars // CHARS_PER_TOKEN)

    def reply(self, turn: int) -> ModelReply:
        rng = self._rng
        tool = rng.choice(("Bash", "Read", "Grep", "Edit"))
        arguments = self._arguments(tool, turn)
        raw = json.dumps(arguments, ensure_ascii=False)
        thinking = self._prose(rng.randint(200, 600))
        text = f"Let me look at the {rng.choice(WORDS)} {rng.choice(WORDS)} next."
        call = f'{{"name": "{tool}", "arguments": {raw}}}'
        output_ids = array("i", (THINK, NL))
        output_ids.extend(self._ids(len(thinking) // CHARS_PER_TOKEN))
        output_ids.extend((NL, THINK_END, NL, NL))
        output_ids.extend(self._ids(len(text) // CHARS_PER_TOKEN))
        output_ids.extend((NL, NL, TOOL_CALL, NL))
        output_ids.extend(self._ids(len(call) // CHARS_PER_TOKEN))
        output_ids.extend((NL, TOOL_CALL_END, IM_END))
        logprobs = array("d", (-rng.expovariate(4.0) for _ in output_ids))
        return ModelReply(
            thinking=thinking,
            signature=base64.b64encode(rng.randbytes(240)).decode(),
            text=text,
            call_id="toolu_01"
            + "".join(rng.choices("ABCDEFGHJKLMNPQRSTUVWXYZabcdefgh23456789", k=22)),
            tool=tool,
            arguments=arguments,
            raw_arguments=raw,
            output_ids=output_ids,
            logprobs=logprobs,
        )

    def tool_result(self, reply: ModelReply) -> ToolResult:
        tokens = self._rng.randint(*TOOL_RESULT_TOKENS)
        text = self._log(tokens * CHARS_PER_TOKEN)
        return ToolResult(reply.call_id, text, self._ids(len(text) // CHARS_PER_TOKEN))

    # -- generators ----------------------------------------------------------------------------

    def _ids(self, n: int) -> array[int]:
        start = self._rng.randrange(len(self._id_pool) - n)
        return self._id_pool[start : start + n]

    def _word(self) -> str:
        return self._rng.choice(WORDS)

    def _prose(self, chars: int) -> str:
        rng = self._rng
        parts: list[str] = []
        size = 0
        while size < chars:
            words = " ".join(rng.choices(WORDS, k=rng.randint(6, 16)))
            sentence = f"{words.capitalize()}{rng.choice('.....?:')} "
            parts.append(sentence)
            size += len(sentence)
        return "".join(parts).rstrip()

    def _log(self, chars: int) -> str:
        """Tool output: a mix of log lines, source code and test results."""
        choose = self._rng.choice
        lines: list[str] = []
        size = 0
        while size < chars:
            line = choose(self._lines)
            lines.append(line)
            size += len(line) + 1
        return "\n".join(lines)

    def _log_line(self) -> str:
        r = self._rng
        return (
            f"2026-11-{r.randint(1, 28):02d}T{r.randint(0, 23):02d}:{r.randint(0, 59):02d}:"
            f"{r.randint(0, 59):02d}.{r.randint(0, 999):03d}Z "
            f"{r.choice(('INFO', 'DEBUG', 'WARN', 'ERROR')):<5} "
            f"{self._word()}[{r.randint(1, 64)}]: "
            f"{self._word()} {self._word()} {r.randint(0, 99999)} in {r.randint(1, 900)}ms"
        )

    def _code_line(self) -> str:
        r = self._rng
        indent = "    " * r.randint(0, 3)
        name = f"{self._word()}_{self._word()}"
        return r.choice(
            (
                f"{indent}def {name}(self, {self._word()}: int) -> {self._word().title()}:",
                f"{indent}if {self._word()} > {r.randint(0, 512)}:",
                f"{indent}return self.{name}[{self._word()}] + {r.randint(1, 9)}",
                f"{indent}{name} = {self._word()}.get({self._word()!r}, None)",
                f"{indent}raise ValueError(f'unknown {self._word()}: {{{self._word()}!r}}')",
            )
        )

    def _test_line(self) -> str:
        r = self._rng
        outcome = r.choice(("PASSED", "PASSED", "PASSED", "FAILED", "SKIPPED"))
        return (
            f"tests/test_{self._word()}.py::test_{self._word()}_{self._word()} {outcome}"
            f" [{r.randint(0, 100):3d}%]"
        )

    def _schema(self, tool: str) -> dict[str, Any]:
        properties = {
            f"{self._word()}_{i}": {"type": "string", "description": self._prose(140)}
            for i in range(5)
        }
        return {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "object",
            "properties": properties,
            "required": sorted(properties)[:2],
            "additionalProperties": False,
            "title": tool,
        }

    def _arguments(self, tool: str, turn: int) -> dict[str, Any]:
        """Arguments in the order the model writes them; never already sorted."""
        r, w = self._rng, self._word
        path = f"src/{w()}/{w()}_{turn}.py"
        if tool == "Bash":
            return {
                "command": f"python -m pytest -x tests/test_{w()}.py -k {w()}",
                "timeout": 120_000,
                "description": f"Run the {w()} tests",
            }
        if tool == "Read":
            return {"file_path": path, "offset": r.randint(1, 400), "limit": 200}
        if tool == "Grep":
            return {"pattern": f"def {w()}_", "path": "src", "output_mode": "content", "-n": True}
        return {
            "file_path": path,
            "old_string": f"return {w()}",
            "new_string": f"return {w()} or {w()}",
            "replace_all": False,
        }


# -- Claude Code's request body, built as it grows -------------------------------------------------


class ClaudeCodeRequest:
    """The ``POST /v1/messages`` body Claude Code sends each turn: the whole history, every time.

    Each message is serialized once and the body is joined from the pieces (the bytes equal a
    ``json.dumps`` of the whole body), so building a 15 MB request does not dominate the run.
    """

    def __init__(self, session: SyntheticSession) -> None:
        head = {
            "model": "policy",
            "max_tokens": 128_000,
            "stream": True,
            "system": [
                {"type": "text", "text": t, "cache_control": {"type": "ephemeral"}}
                for t in session.system
            ],
            "tools": session.tools,
            "metadata": {"user_id": "user_bench_session"},
            "thinking": {"type": "adaptive"},
        }
        self._head = _dumps(head)[:-1] + ',"messages":['
        first_user = {
            "role": "user",
            "content": [{"type": "text", "text": t} for t in session.task],
        }
        self._pieces = [
            _dumps(first_user),
            _dumps({"role": "system", "content": session.environment}),
        ]
        self._last = ""
        self._marked = ""
        self.messages = 2

    def add_turn(self, reply: ModelReply, result: ToolResult) -> None:
        """Append the echoed reply and its tool result (the last result carries cache_control)."""
        if self._last:
            self._pieces.append(self._last)
        self._pieces.append(_dumps(reply.echo()))
        block = {"type": "tool_result", "tool_use_id": result.call_id, "content": result.text}
        self._last = _dumps({"role": "user", "content": [block]})
        marked = {**block, "cache_control": {"type": "ephemeral"}}
        self._marked = _dumps({"role": "user", "content": [marked]})
        self.messages += 2

    def body(self) -> bytes:
        pieces = [*self._pieces, self._marked] if self._last else self._pieces
        return (self._head + ",".join(pieces) + "]}").encode()


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


# -- one shape, measured ---------------------------------------------------------------------------


class BenchError(RuntimeError):
    """The session did not route the way an adapter relies on: the numbers would be meaningless."""


@dataclass(frozen=True, slots=True)
class Timings:
    """Nanoseconds per turn."""

    loads: list[int]
    convert: list[int]
    route_record: list[int]
    prefix_ids: list[int]


@dataclass(frozen=True, slots=True)
class Built:
    tree: SessionTree
    timings: Timings
    body_bytes: int
    context_tokens: int
    """Prompt plus output tokens of the last turn: the context the session reached."""


@dataclass(frozen=True, slots=True)
class Profilers:
    route_record: cProfile.Profile
    linearize: cProfile.Profile


def build_session(turns: int, seed: int, profiler: cProfile.Profile | None = None) -> Built:
    """Drive ``turns`` model calls through a fresh tree exactly as the adapter would.

    Only ``json.loads``, the JSON -> ``Prompt`` conversion, ``route()`` + ``record()`` and
    ``prefix_ids()`` are timed; making the session and its request bodies is not.
    """
    session = SyntheticSession(seed)
    request = ClaudeCodeRequest(session)
    tree = SessionTree(f"bench-{turns}")
    timings = Timings([], [], [], [])
    clock = time.perf_counter_ns
    previous_turn = None
    expected_prefix = 0
    body = b""
    reply = session.reply(0)
    segments: list[Segment] = [Segment(LossReason.CONTEXT, session.context_ids())]
    for index in range(turns):
        body = request.body()
        bridged = BridgedPrompt(segments, GENERATION_PROMPT)
        completion = Completion(reply.output_ids, reply.logprobs, FinishReason.STOP)
        message = reply.message()

        t0 = clock()
        parsed = json.loads(body)
        t1 = clock()
        prompt = parse_request(parsed).prompt
        t2 = clock()
        del parsed
        if profiler is not None:
            profiler.enable()
        t3 = clock()
        route = tree.route(prompt)
        t4 = clock()
        if profiler is not None:
            profiler.disable()
        prefix = route.prefix_ids()
        t5 = clock()
        if profiler is not None:
            profiler.enable()
        turn = tree.record(route, bridged, completion, message)
        t6 = clock()
        if profiler is not None:
            profiler.disable()

        timings.loads.append(t1 - t0)
        timings.convert.append(t2 - t1)
        timings.route_record.append((t4 - t3) + (t6 - t5))
        timings.prefix_ids.append(t5 - t4)
        if len(prompt.messages) != request.messages + 1:
            raise BenchError(f"turn {index}: the request lost messages in conversion")
        if previous_turn is not None and (
            route.previous_generated is not previous_turn or len(route.new_messages) != 1
        ):
            raise BenchError(
                f"turn {index}: the echoed reply did not match (anchor {route.anchor!r}, "
                f"{len(route.new_messages)} new messages): the session forked"
            )
        if previous_turn is not None and len(route.anchor.aliases) != 1:
            raise BenchError(f"turn {index}: the echo was not matched through canonical JSON")
        if len(prefix) != expected_prefix:
            raise BenchError(f"turn {index}: prefix has {len(prefix)} ids, not {expected_prefix}")
        del prefix, route, prompt
        expected_prefix = turn.prompt_length + turn.output_length
        previous_turn = turn

        result = session.tool_result(reply)
        request.add_turn(reply, result)
        segments = [
            Segment(LossReason.TEMPLATE_SCAFFOLD, OPEN_TOOL_RESPONSE),
            Segment(LossReason.TOOL_OUTPUT, result.ids),
            Segment(LossReason.TEMPLATE_SCAFFOLD, CLOSE_TOOL_RESPONSE),
        ]
        if index + 1 < turns:
            reply = session.reply(index + 1)
    return Built(tree, timings, len(body), expected_prefix)


def check_linearization(tree: SessionTree, context_tokens: int) -> None:
    """One branch, every reply trained once, the sample exactly the last turn's prompt + output."""
    lin = linearize(tree)
    generated = sum(t.output_length for t in tree.turns)
    if len(lin.samples) != 1 or lin.exclusions:
        raise BenchError(f"{len(lin.samples)} samples, {len(lin.exclusions)} exclusions; want 1, 0")
    sample = lin.samples[0]
    if len(sample.tokens) != context_tokens or sample.trained_tokens != generated:
        raise BenchError(
            f"sample has {len(sample.tokens)} tokens ({sample.trained_tokens} trained); "
            f"want {context_tokens} ({generated} trained)"
        )


def time_linearize(tree: SessionTree, runs: int, profiler: cProfile.Profile | None) -> list[int]:
    spent: list[int] = []
    for _ in range(runs):
        if profiler is not None:
            profiler.enable()
        t0 = time.perf_counter_ns()
        lin = linearize(tree)
        spent.append(time.perf_counter_ns() - t0)
        if profiler is not None:
            profiler.disable()
        del lin
    return spent


def raw_token_bytes(tree: SessionTree) -> int:
    """The least any representation must hold: int32 per unique token, float64 per logprob."""
    unique = sum(len(n.delta) for n in tree.nodes if n.delta is not None)
    generated = sum(t.output_length for t in tree.turns)
    return 4 * unique + 8 * generated


def retained_bytes(turns: int, seed: int) -> int:
    """Bytes reachable only from the tree after building it (tracemalloc; tree held vs. freed)."""
    gc.collect()
    tracemalloc.start()
    try:
        tree = build_session(turns, seed).tree
        gc.collect()
        held = tracemalloc.get_traced_memory()[0]
        del tree
        gc.collect()
        freed = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return held - freed


@dataclass(frozen=True, slots=True)
class Stats:
    median_ms: float
    p99_ms: float
    mean_ms: float
    total_s: float

    @classmethod
    def of(cls, ns: Sequence[int]) -> Stats:
        ordered = sorted(ns)
        p99 = ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]
        total = sum(ordered)
        return cls(
            statistics.median(ordered) / 1e6, p99 / 1e6, total / len(ordered) / 1e6, total / 1e9
        )


@dataclass(frozen=True, slots=True)
class ShapeResult:
    turns: int
    context_tokens: int = 0
    body_mb: float = 0.0
    loads: Stats | None = None
    convert: Stats | None = None
    route_record: Stats | None = None
    prefix_ids: Stats | None = None
    linearize_ms: float = 0.0
    retained: int = 0
    raw: int = 0
    error: str | None = None

    @property
    def memory_ratio(self) -> float:
        return self.retained / self.raw if self.raw else math.nan


def measure(turns: int, seed: int, linearize_runs: int) -> ShapeResult:
    """Time one shape, then build it again under tracemalloc for its retained memory."""
    try:
        built = build_session(turns, seed)
        check_linearization(built.tree, built.context_tokens)
        linearize_ns = time_linearize(built.tree, linearize_runs, None)
        raw = raw_token_bytes(built.tree)
        timings, body_bytes, context_tokens = built.timings, built.body_bytes, built.context_tokens
        del built
        retained = retained_bytes(turns, seed)
    except (BenchError, RecursionError, MemoryError, ValueError) as exc:
        return ShapeResult(turns=turns, error=f"{type(exc).__name__}: {exc}")
    return ShapeResult(
        turns=turns,
        context_tokens=context_tokens,
        body_mb=body_bytes / 1e6,
        loads=Stats.of(timings.loads),
        convert=Stats.of(timings.convert),
        route_record=Stats.of(timings.route_record),
        prefix_ids=Stats.of(timings.prefix_ids),
        linearize_ms=statistics.median(linearize_ns) / 1e6,
        retained=retained,
        raw=raw,
    )


# -- reporting -------------------------------------------------------------------------------------


def _ms(value: float) -> str:
    return f"{value:.3f}" if value < 10 else f"{value:,.1f}"


def _pair(stats: Stats) -> str:
    return f"{_ms(stats.median_ms)}\n{_ms(stats.p99_ms)}"


RESULT_COLUMNS = (
    "session",
    "context\ntokens",
    "last\nbody MB",
    "json.loads\np50\np99",
    "JSON->\nPrompt\np50 p99",
    "route+\nrecord\np50 p99",
    "route+\nrecord\nmean",
    "route+\nrecord\ntotal s",
    "prefix_\nids()\np50 p99",
    "linearize\nms",
    "retained\nby tree\nMB",
    "raw ids\n+ lp\nMB",
    "retained\n/ raw",
)


def results_table(results: Sequence[ShapeResult]) -> Table:
    """One row per session length; the target row and the peers' quoted rows below them."""
    table = Table(
        title="trajectory-tree over a Claude Code session (ms per turn unless noted)",
        title_justify="left",
        caption=(
            "json.loads: the floor the client imposes; JSON->Prompt: protocol_adapters' Anthropic "
            "parse_request;\n"
            "p50 over p99 per cell; raw = int32 per unique token + float64 per generated logprob;\n"
            "peer rows are QUOTED from the issue, NOT measured here."
        ),
        caption_justify="left",
    )
    for index, name in enumerate(RESULT_COLUMNS):
        table.add_column(name, justify="left" if index == 0 else "right", no_wrap=True)
    for r in results:
        label = f"{r.turns:,} turns"
        if r.error is not None:
            table.add_row(label, RichText(f"FAILED: {r.error}", style="bold red"), end_section=True)
            continue
        assert r.loads is not None
        assert r.convert is not None
        assert r.route_record is not None
        assert r.prefix_ids is not None
        table.add_row(
            label,
            f"{r.context_tokens:,}",
            f"{r.body_mb:.1f}",
            _pair(r.loads),
            _pair(r.convert),
            _pair(r.route_record),
            _ms(r.route_record.mean_ms),
            f"{r.route_record.total_s:.2f}",
            _pair(r.prefix_ids),
            _ms(r.linearize_ms),
            f"{r.retained / 1e6:,.1f}",
            f"{r.raw / 1e6:,.1f}",
            f"{r.memory_ratio:.2f}x",
            end_section=True,
        )
    blank = [""] * len(RESULT_COLUMNS)
    target = [*blank]
    target[0] = f"target @{TARGET_SHAPE} turns"
    target[6] = f"<= {TARGET_ROUTE_RECORD_MS}"
    target[9] = f"<= {TARGET_LINEARIZE_MS:g}"
    target[12] = f"<= {TARGET_MEMORY_RATIO:g}x"
    table.add_row(*target, style="cyan")
    peers = [*blank]
    peers[0] = "peers @200 turns\n(QUOTED, not measured)"
    peers[6] = PEERS_ROUTE_MS
    peers[9] = PEERS_LINEARIZE_MS
    peers[10] = PEERS_RETAINED
    table.add_row(*peers, style="magenta")
    crash = [*blank]
    crash[0] = "peers @1,000 turns\n(QUOTED, not measured)"
    crash[1] = PEERS_AT_1000
    table.add_row(*crash, style="magenta")
    return table


def verdict_table(results: Sequence[ShapeResult]) -> Table:
    by_turns = {r.turns: r for r in results if r.error is None}
    table = Table(title="targets", title_justify="left")
    table.add_column("target")
    table.add_column("measured")
    table.add_column("result")
    at = by_turns.get(TARGET_SHAPE)
    if at is not None and at.route_record is not None:
        table.add_row(
            f"route+record <= {TARGET_ROUTE_RECORD_MS} ms per turn (mean) at {TARGET_SHAPE} turns",
            f"{at.route_record.mean_ms:.3f} ms (p50 {at.route_record.median_ms:.3f})",
            _verdict(at.route_record.mean_ms <= TARGET_ROUTE_RECORD_MS),
        )
        table.add_row(
            f"linearize <= {TARGET_LINEARIZE_MS:g} ms at {TARGET_SHAPE} turns",
            f"{at.linearize_ms:.2f} ms",
            _verdict(at.linearize_ms <= TARGET_LINEARIZE_MS),
        )
    else:
        table.add_row(f"{TARGET_SHAPE}-turn targets", "shape not run", _verdict(None))
    worst = max((r for r in results if r.error is None), key=lambda r: r.memory_ratio, default=None)
    if worst is not None:
        table.add_row(
            f"retained memory <= {TARGET_MEMORY_RATIO:g}x raw token arrays (every shape)",
            f"{worst.memory_ratio:.2f}x (worst, {worst.turns:,} turns)",
            _verdict(worst.memory_ratio <= TARGET_MEMORY_RATIO),
        )
    table.add_row(*_growth_row(results))
    return table


def _growth_row(results: Sequence[ShapeResult]) -> tuple[str, str, RichText]:
    title = f"{GROWTH_SHAPE:,} turns work, per-token costs grow <= {TARGET_GROWTH_FACTOR}x vs 200"
    big = next((r for r in results if r.turns == GROWTH_SHAPE), None)
    base = next((r for r in results if r.turns == TARGET_SHAPE and r.error is None), None)
    if big is None or base is None:
        return title, "shape not run", _verdict(None)
    if big.error is not None:
        return title, big.error, _verdict(False)
    assert big.route_record is not None
    assert base.route_record is not None
    assert big.prefix_ids is not None
    assert base.prefix_ids is not None
    tokens = big.context_tokens / base.context_tokens
    factors = {
        "retained": big.retained / base.retained / tokens,
        "linearize": big.linearize_ms / base.linearize_ms / tokens,
        "route+record/turn": big.route_record.mean_ms / base.route_record.mean_ms / tokens,
        "prefix_ids/turn": big.prefix_ids.mean_ms / base.prefix_ids.mean_ms / tokens,
    }
    name, factor = max(factors.items(), key=lambda kv: kv[1])
    shown = ", ".join(f"{k} {v:.2f}x" for k, v in factors.items())
    return title, f"{shown}\n(worst: {name})", _verdict(factor <= TARGET_GROWTH_FACTOR)


def _verdict(ok: bool | None) -> RichText:
    if ok is None:
        return RichText("n/a", style="yellow")
    return RichText("PASS", style="bold green") if ok else RichText("MISS", style="bold red")


def profile(turns: int, seed: int, top: int) -> str:
    """cProfile reports of the route + record calls of a ``turns`` session and of linearize."""
    profilers = Profilers(cProfile.Profile(), cProfile.Profile())
    built = build_session(turns, seed, profilers.route_record)
    time_linearize(built.tree, 3, profilers.linearize)
    out = io.StringIO()
    for title, profiler in (
        (f"route() + record(), {turns} turns", profilers.route_record),
        ("linearize(), 3 runs", profilers.linearize),
    ):
        out.write(f"\n== cProfile: {title} (by own time) ==\n")
        pstats.Stats(profiler, stream=out).strip_dirs().sort_stats("tottime").print_stats(top)
    return out.getvalue()


# -- command line ----------------------------------------------------------------------------------


def parse_turns(text: str) -> list[int]:
    try:
        shapes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated turn counts, got {text!r}"
        ) from None
    if not shapes or min(shapes) < 1:
        raise argparse.ArgumentTypeError("turn counts must be positive")
    return shapes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--turns",
        type=parse_turns,
        default=None,
        help="comma-separated session lengths (default 20,200,1000; --quick: 20,200)",
    )
    parser.add_argument("--quick", action="store_true", help="skip the 1,000-turn shape")
    parser.add_argument(
        "--profile",
        action="store_true",
        help=f"also print cProfile of the {TARGET_SHAPE}-turn route+record loop and of linearize",
    )
    parser.add_argument("--seed", type=int, default=17, help="session seed (default 17)")
    args = parser.parse_args(argv)
    shapes: list[int] = args.turns or ([20, 200] if args.quick else [20, 200, 1000])

    width = max(shutil.get_terminal_size((170, 40)).columns, 170)
    console = Console(width=width)
    console.print(
        f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} cpus, "
        f"load average {os.getloadavg()[0]:.2f} at start (other work skews the timings); "
        f"seed {args.seed}; gc enabled; tracemalloc only in a separate memory pass",
        style="dim",
    )
    results: list[ShapeResult] = []
    for turns in shapes:
        started = time.perf_counter()
        with console.status(f"{turns:,} turns ..."):
            result = measure(turns, args.seed, linearize_runs=3)
        results.append(result)
        console.print(
            f"  {turns:,} turns measured in {time.perf_counter() - started:.1f} s", style="dim"
        )
    console.print(results_table(results))
    console.print(verdict_table(results))
    console.print(f"load average at the end: {os.getloadavg()[0]:.2f}", style="dim")
    if args.profile:
        console.print(profile(TARGET_SHAPE, args.seed, top=18), markup=False, highlight=False)
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
