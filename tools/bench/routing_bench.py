"""What MoE routing capture costs trajectory-tree: CPU per turn, memory, linearize, sidecar.

    uv run tools/bench/routing_bench.py [--tokens 100000] [--turns 200] [--runs 3] [--quick]

A synthetic 64-layer top-8 MoE model: every position the engine computes has one row of
64 x 8 = 512 int32 expert ids (2,048 bytes). The engine's wire form is SGLang's
``meta_info.routed_experts``: base64 of little-endian int32, rows for the positions
``[start, prompt + output - 1)``, where ``start`` is where the branch's earlier calls stopped
(``SessionTree.routed_prefix`` of the route's anchor), so each turn returns only its new rows.

1. **Capture CPU per turn.** One agent session growing to ``--tokens`` (100k) with turns adding
   ~500 tokens each (a ~400-token tool result, ~100 generated tokens, 13 tokens of scaffold), the
   same calls recorded into two trees side by side in one run, alternating which goes first: one
   without routing (``route`` + ``Completion`` + ``record``) and one with it (``routed_prefix``,
   protocol-adapters' decoder ``int32_ids`` as the adapter runs it on every answer: base64 in
   slices into an exactly sized array, validated, signs checked; ``RoutedExperts``; ``route`` +
   ``record`` with it). CPU time of this thread (``time.thread_time_ns``), so other processes'
   load skews it less than wall time. Making the engine's base64 answer is not timed.
2. **Memory.** The same sessions built again, one tree at a time, under ``tracemalloc``: what
   dropping the tree frees, with and without routing, against the theoretical
   tokens x 512 x 4 bytes (204.8 MB per 100k tokens).
3. **Linearize and the sidecar.** A ``--turns`` (200) call session: a main agent and two
   5-turn sub-agents (own system prompt and task, ``agent_id`` set), recorded with and without
   routing; ``linearize`` of each (median of ``--runs``, CPU and wall, and the peak of traced
   memory in one more run), then ``dump_routing`` + ``dumps`` and ``loads(text, routing=...)``.

Every shape is checked before it is reported: each call continues its agent's previous reply and
asks for routing exactly from where its branch stopped; every sample's routing is complete
(``len(tokens) - 1`` rows, no gaps) and the main sample's rows are the main agent's calls' rows
in order; the sidecar read back is byte-identical. A failed check exits with status 1.
Ids are random (token ids in a Qwen-sized vocabulary, expert ids in 0..127); seeded.
"""

from __future__ import annotations

import argparse
import base64
import gc
import math
import os
import platform
import random
import shutil
import statistics
import sys
import time
import tracemalloc
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from protocol_adapters._engine.routed_experts import int32_ids
from trajectory_tree import (
    BridgedPrompt,
    Completion,
    FinishReason,
    LossReason,
    Message,
    Prompt,
    RoutedExperts,
    Segment,
    SessionTree,
    Text,
    ToolCall,
    ToolSpec,
    TurnMeta,
    dump_routing,
    dumps,
    linearize,
    loads,
)

# -- the model and the session's shape -------------------------------------------------------------

LAYERS, TOPK, EXPERTS = 64, 8, 128
ROW = LAYERS * TOPK
ROW_BYTES = 4 * ROW
THEORETICAL_PER_100K = 100_000 * ROW_BYTES
"""100k tokens x 512 ids x 4 bytes = 204.8 MB."""

VOCAB = 151_643
ID_POOL = 1 << 18
EXPERT_POOL_ROWS = 4_096
"""Rows of random expert ids the engine stand-in answers from (8 MB); a call's rows are a slice."""

CONTEXT_TOKENS = 2_000
"""System prompt, tools and task of the main agent: its first call's prompt."""
SUB_CONTEXT_TOKENS = 1_500
TOOL_TOKENS = (350, 450)
OUTPUT_TOKENS = (80, 120)
SUB_AGENTS = 2
SUB_TURNS = 5

NL, USER, ASSISTANT = 198, 872, 77091
IM_START, IM_END = 151_644, 151_645
TOOL_RESPONSE, TOOL_RESPONSE_END = 151_665, 151_666
OPEN_TOOL_RESPONSE = array("i", (NL, IM_START, USER, NL, TOOL_RESPONSE, NL))
CLOSE_TOOL_RESPONSE = array("i", (NL, TOOL_RESPONSE_END, IM_END, NL))
GENERATION_PROMPT = array("i", (IM_START, ASSISTANT, NL))
MAIN_TASK = "Fix the failing test in tests/test_router.py."
TOOLS = (ToolSpec("Bash", "Run a shell command.", '{"type":"object"}'),)


class BenchError(RuntimeError):
    """The session did not record the way an adapter relies on: the numbers would be meaningless."""


# -- the synthetic session and engine --------------------------------------------------------------


class Synth:
    """Seeded token ids, replies and tool results."""

    def __init__(self, seed: int) -> None:
        self.rng = rng = random.Random(seed)
        self._pool = array("i", rng.choices(range(VOCAB), k=ID_POOL))
        self._calls = 0

    def ids(self, n: int) -> array[int]:
        start = self.rng.randrange(len(self._pool) - n)
        return self._pool[start : start + n]

    def call_id(self) -> str:
        self._calls += 1
        return f"call_{self._calls:05d}_{self.rng.getrandbits(40):010x}"


@dataclass(frozen=True, slots=True)
class Call:
    """One model call as the adapter hands it to the tree (and the reply it parsed)."""

    agent: str | None
    prompt: Prompt
    segments: tuple[Segment, ...]
    output: array[int]
    logprobs: array[float]
    reply: Message

    @property
    def meta(self) -> TurnMeta:
        return TurnMeta(agent_id=self.agent)

    def bridged(self) -> BridgedPrompt:
        return BridgedPrompt(self.segments, GENERATION_PROMPT)


class Conversation:
    """One agent's history: each call answers with a tool call, each answer adds a tool result."""

    def __init__(self, synth: Synth, agent: str | None, task: str, context_tokens: int) -> None:
        self.synth = synth
        self.agent = agent
        self.messages: list[Message] = [
            Message.text("system", f"You are {agent or 'the main agent'}."),
            Message.text("user", task),
        ]
        self.segments: tuple[Segment, ...] = (
            Segment(LossReason.CONTEXT, synth.ids(context_tokens)),
        )
        self.tokens = 0
        """Prompt plus output tokens of the last call: the context this agent reached."""
        self.routed_end = 0
        """Where the routing of this agent's calls stopped: the next call's expected start."""
        self.turns = 0

    def next_call(self) -> Call:
        synth, rng = self.synth, self.synth.rng
        output = synth.ids(rng.randint(*OUTPUT_TOKENS))
        logprobs = array("d", (-rng.expovariate(4.0) for _ in output))
        reply = Message(
            "assistant",
            (
                Text(f"Turn {self.turns}: checking the next file."),
                ToolCall(synth.call_id(), "Bash", f'{{"command": "cat src/m{self.turns}.py"}}'),
            ),
        )
        return Call(
            self.agent, Prompt(tuple(self.messages), TOOLS), self.segments, output, logprobs, reply
        )

    def answered(self, call: Call, prompt_length: int) -> None:
        """The call was recorded: append its reply and the tool's result for the next call."""
        self.tokens = prompt_length + len(call.output)
        self.routed_end = self.tokens - 1
        self.turns += 1
        call_id = call.reply.tool_calls[0].id
        text = f"{self.agent or 'main'} result {self.turns}: {self.synth.rng.getrandbits(64):x}"
        self.messages += [call.reply, Message("tool", (Text(text),), tool_call_id=call_id)]
        tokens = self.synth.rng.randint(*TOOL_TOKENS)
        self.segments = (
            Segment(LossReason.TEMPLATE_SCAFFOLD, OPEN_TOOL_RESPONSE),
            Segment(LossReason.TOOL_OUTPUT, self.synth.ids(tokens)),
            Segment(LossReason.TEMPLATE_SCAFFOLD, CLOSE_TOOL_RESPONSE),
        )


class Engine:
    """Stands in for SGLang's routing capture: rows of random expert ids, as base64 of LE int32."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        ids = self._rng.randbytes(EXPERT_POOL_ROWS * ROW).translate(bytes(range(128)) * 2)
        pool = bytearray(EXPERT_POOL_ROWS * ROW_BYTES)
        pool[0::4] = ids  # little-endian int32: the low byte first, ids < 128
        self._pool = bytes(pool)

    def routed_experts(self, start: int, end: int) -> str:
        """``meta_info.routed_experts`` for positions ``[start, end)``."""
        rows = end - start
        if not 0 <= rows <= EXPERT_POOL_ROWS:
            raise BenchError(f"a call asked for {rows} rows of routing")
        offset = self._rng.randrange(EXPERT_POOL_ROWS - rows + 1) * ROW_BYTES
        return base64.b64encode(self._pool[offset : offset + rows * ROW_BYTES]).decode("ascii")


def main_session(synth: Synth, target_tokens: int) -> Iterator[tuple[Conversation, Call]]:
    """One agent's calls until its context reaches ``target_tokens``."""
    main = Conversation(synth, None, MAIN_TASK, CONTEXT_TOKENS)
    while main.tokens < target_tokens:
        yield main, main.next_call()


def branched_session(synth: Synth, calls: int) -> Iterator[tuple[Conversation, Call]]:
    """``calls`` calls: a main agent, with :data:`SUB_AGENTS` sub-agents of :data:`SUB_TURNS`
    calls each started at evenly spaced main turns (each runs to its end, as a Task does)."""
    main = Conversation(synth, None, MAIN_TASK, CONTEXT_TOKENS)
    main_calls = max(1, calls - SUB_AGENTS * SUB_TURNS)
    spawn = {main_calls * (k + 1) // (SUB_AGENTS + 1): k for k in range(SUB_AGENTS)}
    for number in range(main_calls):
        yield main, main.next_call()
        if number in spawn:
            name = f"sub-agent-{spawn[number] + 1}"
            sub = Conversation(synth, name, f"Find where {name} should look.", SUB_CONTEXT_TOKENS)
            for _ in range(SUB_TURNS):
                yield sub, sub.next_call()


# -- recording -------------------------------------------------------------------------------------


@dataclass(slots=True)
class CaptureCosts:
    """CPU nanoseconds per turn, each list in turn order."""

    plain: list[int] = field(default_factory=list)
    """route + Completion + record, no routing."""
    prefix: list[int] = field(default_factory=list)
    decode: list[int] = field(default_factory=list)
    """protocol-adapters' ``int32_ids`` of the answer's base64."""
    experts: list[int] = field(default_factory=list)
    """``RoutedExperts(...)``: its validation."""
    routed_record: list[int] = field(default_factory=list)
    """route + Completion + record, with routing."""
    rows: list[int] = field(default_factory=list)
    wire_bytes: list[int] = field(default_factory=list)

    def routed_total(self) -> list[int]:
        return [
            sum(parts)
            for parts in zip(
                self.prefix,
                self.decode,
                self.experts,
                self.routed_record,
                strict=True,
            )
        ]


def record_plain(tree: SessionTree, call: Call, costs: CaptureCosts | None = None) -> int:
    """Record ``call`` without routing; returns its prompt length."""
    bridged, meta = call.bridged(), call.meta
    clock = time.thread_time_ns
    t0 = clock()
    route = tree.route(call.prompt)
    completion = Completion(call.output, call.logprobs, FinishReason.STOP, "w1")
    turn = tree.record(route, bridged, completion, call.reply, meta)
    t1 = clock()
    if costs is not None:
        costs.plain.append(t1 - t0)
    return turn.prompt_length


def record_routed(
    tree: SessionTree,
    call: Call,
    engine: Engine,
    expected_start: int,
    costs: CaptureCosts | None = None,
    peaks: list[int] | None = None,
) -> int:
    """Record ``call`` with the routing the engine returns for it; returns its prompt length.

    ``peaks`` (under tracemalloc) gets the traced memory the capture needed beyond the wire
    string it started from.
    """
    bridged, meta = call.bridged(), call.meta
    clock = time.thread_time_ns
    t0 = clock()
    route = tree.route(call.prompt)
    t1 = clock()
    start = tree.routed_prefix(route.anchor)
    t2 = clock()
    if start != expected_start:
        raise BenchError(
            f"asked for routing from {start}; the branch's calls stopped at {expected_start}"
        )
    prompt_length = route.prefix_length + bridged.new_length
    wire = engine.routed_experts(start, prompt_length + len(call.output) - 1)
    if peaks is not None:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
    t3 = clock()
    experts = int32_ids(wire)
    t5 = clock()
    routing = RoutedExperts(start, LAYERS, TOPK, experts)
    t6 = clock()
    completion = Completion(
        call.output, call.logprobs, FinishReason.STOP, "w1", routed_experts=routing
    )
    turn = tree.record(route, bridged, completion, call.reply, meta)
    t7 = clock()
    if peaks is not None:
        peaks.append(tracemalloc.get_traced_memory()[1] - base)
    if turn.prompt_length != prompt_length:
        raise BenchError(f"recorded a prompt of {turn.prompt_length}, not {prompt_length}")
    if costs is not None:
        costs.prefix.append(t2 - t1)
        costs.decode.append(t5 - t3)
        costs.experts.append(t6 - t5)
        costs.routed_record.append((t1 - t0) + (t7 - t6))
        costs.rows.append(routing.rows)
        costs.wire_bytes.append(len(wire))
    return prompt_length


def check_continues(tree: SessionTree, conversation: Conversation, call: Call) -> None:
    """The call must extend its agent's previous reply by exactly one tool result."""
    route = tree.route(call.prompt)
    if conversation.turns and (
        route.previous_generated is None
        or route.previous_generated.reply is not conversation.messages[-2]
        or len(route.new_messages) != 1
    ):
        raise BenchError(
            f"{conversation.agent or 'main'} call {conversation.turns} forked "
            f"(anchor {route.anchor!r}, {len(route.new_messages)} new messages)"
        )


@dataclass(frozen=True, slots=True)
class SideBySide:
    costs: CaptureCosts
    turns: int
    context_tokens: int


def capture_side_by_side(target_tokens: int, seed: int, progress: Progress) -> SideBySide:
    """Part 1: the same calls into a tree without and a tree with routing, alternating."""
    synth, engine = Synth(seed), Engine(seed + 1)
    plain, routed = SessionTree("plain"), SessionTree("routed")
    costs = CaptureCosts()
    task = progress.add_task("capture, side by side", total=target_tokens)
    for index, (conversation, call) in enumerate(main_session(synth, target_tokens)):
        check_continues(routed, conversation, call)
        if index % 2:
            length = record_plain(plain, call, costs)
            routed_length = record_routed(routed, call, engine, conversation.routed_end, costs)
        else:
            routed_length = record_routed(routed, call, engine, conversation.routed_end, costs)
            length = record_plain(plain, call, costs)
        if length != routed_length:
            raise BenchError(f"the two trees disagree on call {index}'s prompt length")
        conversation.answered(call, length)
        progress.update(task, completed=min(conversation.tokens, target_tokens))
    progress.remove_task(task)
    last = routed.turns[-1]
    return SideBySide(costs, len(routed.turns), last.prompt_length + last.output_length)


def build(
    calls: Iterator[tuple[Conversation, Call]],
    engine: Engine | None,
    peaks: list[int] | None = None,
) -> SessionTree:
    """A tree of ``calls``, with routing when an ``engine`` answers it."""
    tree = SessionTree("routed" if engine else "plain")
    for conversation, call in calls:
        check_continues(tree, conversation, call)
        if engine is None:
            length = record_plain(tree, call)
        else:
            length = record_routed(tree, call, engine, conversation.routed_end, None, peaks)
        conversation.answered(call, length)
    return tree


# -- part 2: memory --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Memory:
    plain: int
    routed: int
    routing_ids: int
    """Expert ids the routed tree's turns hold."""
    context_tokens: int
    capture_peaks: list[int]

    @property
    def routing_share(self) -> int:
        return self.routed - self.plain


def retained(make: Callable[[], SessionTree]) -> int:
    """Bytes dropping the tree ``make`` builds frees (tracemalloc: held vs. freed)."""
    gc.collect()
    tracemalloc.start()
    try:
        tree = make()
        gc.collect()
        held = tracemalloc.get_traced_memory()[0]
        del tree
        gc.collect()
        freed = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return held - freed


def measure_memory(target_tokens: int, seed: int) -> Memory:
    peaks: list[int] = []
    shape: list[int] = []

    def routed_tree() -> SessionTree:
        tree = build(main_session(Synth(seed), target_tokens), Engine(seed + 1), peaks)
        last = tree.turns[-1]
        shape.append(last.prompt_length + last.output_length)
        shape.append(
            sum(len(t.routed_experts.experts) for t in tree.turns if t.routed_experts is not None)
        )
        return tree

    plain = retained(lambda: build(main_session(Synth(seed), target_tokens), None))
    routed = retained(routed_tree)
    return Memory(plain, routed, shape[1], shape[0], peaks)


# -- part 3: linearize and the sidecar -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Timed:
    cpu_ms: float
    wall_ms: float


def timed(function: Callable[[], object], runs: int) -> Timed:
    """Medians over ``runs`` of this thread's CPU time and of wall time."""
    cpu: list[int] = []
    wall: list[int] = []
    for _ in range(runs):
        c0, w0 = time.thread_time_ns(), time.perf_counter_ns()
        result = function()
        c1, w1 = time.thread_time_ns(), time.perf_counter_ns()
        del result
        cpu.append(c1 - c0)
        wall.append(w1 - w0)
    return Timed(statistics.median(cpu) / 1e6, statistics.median(wall) / 1e6)


def traced_peak(function: Callable[[], object]) -> int:
    """The most traced memory ``function`` held at once, above what was held before it."""
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        result = function()
        peak = tracemalloc.get_traced_memory()[1] - base
        del result
    finally:
        tracemalloc.stop()
    return peak


@dataclass(frozen=True, slots=True)
class Branched:
    calls: int
    samples: int
    tokens: int
    """Tokens over all samples."""
    linearize_plain: Timed
    linearize_routed: Timed
    linearize_plain_peak: int
    linearize_routed_peak: int
    dumps_plain: Timed
    dumps_routed: Timed
    dump_routing: Timed
    loads_plain: Timed
    loads_routed: Timed
    json_plain_bytes: int
    json_routed_bytes: int
    sidecar_bytes: int


def check_samples(tree: SessionTree) -> tuple[int, int]:
    """Every sample's routing complete; the main sample's rows its branch's calls' rows in order.
    Returns the samples and their tokens."""
    lin = linearize(tree)
    if lin.exclusions or len(lin.samples) != 1 + SUB_AGENTS:
        raise BenchError(f"{len(lin.samples)} samples, {len(lin.exclusions)} exclusions")
    for sample in lin.samples:
        routing = sample.routing
        if routing is None or routing.gaps or routing.rows != len(sample.tokens) - 1:
            raise BenchError(f"sample {sample.index}'s routing is not complete: {routing!r}"[:200])
    main = next(s for s in lin.samples if tree.turns[s.leaf_turn].meta.agent_id is None)
    rows: array[int] = array("i")
    for turn in tree.turns:
        if turn.meta.agent_id is None and turn.routed_experts is not None:
            rows.extend(turn.routed_experts.experts)
    assert main.routing is not None
    if main.routing.experts != rows:
        raise BenchError("the main sample's routing is not its calls' rows in order")
    return len(lin.samples), sum(len(s.tokens) for s in lin.samples)


def measure_branched(calls: int, seed: int, runs: int, progress: Progress) -> Branched:
    task = progress.add_task("linearize and sidecar", total=8)
    plain = build(branched_session(Synth(seed), calls), None)
    routed = build(branched_session(Synth(seed), calls), Engine(seed + 1))
    if len(routed.turns) != calls:
        raise BenchError(f"the session has {len(routed.turns)} calls, not {calls}")
    samples, tokens = check_samples(routed)
    progress.advance(task)
    linearize_plain = timed(lambda: linearize(plain), runs)
    linearize_routed = timed(lambda: linearize(routed), runs)
    progress.advance(task)
    plain_peak = traced_peak(lambda: linearize(plain))
    routed_peak = traced_peak(lambda: linearize(routed))
    progress.advance(task)
    dumps_plain = timed(lambda: dumps(plain), runs)
    dumps_routed = timed(lambda: dumps(routed), runs)
    progress.advance(task)
    dump_time = timed(lambda: dump_routing(routed), runs)
    progress.advance(task)
    text_plain, text_routed, sidecar = dumps(plain), dumps(routed), dump_routing(routed)
    loads_plain = timed(lambda: loads(text_plain), runs)
    progress.advance(task)
    loads_routed = timed(lambda: loads(text_routed, routing=sidecar), runs)
    progress.advance(task)
    if dump_routing(loads(text_routed, routing=sidecar)) != sidecar:
        raise BenchError("the routing read back differs from the sidecar written")
    progress.remove_task(task)
    return Branched(
        calls=calls,
        samples=samples,
        tokens=tokens,
        linearize_plain=linearize_plain,
        linearize_routed=linearize_routed,
        linearize_plain_peak=plain_peak,
        linearize_routed_peak=routed_peak,
        dumps_plain=dumps_plain,
        dumps_routed=dumps_routed,
        dump_routing=dump_time,
        loads_plain=loads_plain,
        loads_routed=loads_routed,
        json_plain_bytes=len(text_plain.encode()),
        json_routed_bytes=len(text_routed.encode()),
        sidecar_bytes=len(sidecar),
    )


# -- reporting -------------------------------------------------------------------------------------


def _ms(ns: Sequence[int]) -> tuple[float, float, float]:
    """Mean, p50 and p99 in milliseconds."""
    ordered = sorted(ns)
    p99 = ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]
    return statistics.fmean(ordered) / 1e6, statistics.median(ordered) / 1e6, p99 / 1e6


def _f(value: float) -> str:
    return f"{value:.3f}" if value < 10 else f"{value:,.1f}"


def _mb(value: float) -> str:
    return f"{value / 1e6:,.1f}"


def capture_table(result: SideBySide) -> Table:
    costs = result.costs
    table = Table(
        title=(
            f"1. capture, CPU ms per turn ({result.turns} turns to "
            f"{result.context_tokens:,} tokens, {LAYERS}x{TOPK})"
        ),
        title_justify="left",
        caption=(
            f"rows per turn: median {statistics.median(costs.rows):,.0f} (first turn "
            f"{costs.rows[0]:,}); base64 per turn: median "
            f"{statistics.median(costs.wire_bytes) / 1e6:.2f} MB."
        ),
        caption_justify="left",
    )
    for name in ("step", "mean", "p50", "p99", "x no routing (mean)"):
        table.add_column(name, justify="left" if name == "step" else "right", no_wrap=True)
    plain_mean = _ms(costs.plain)[0]
    rows: list[tuple[str, list[int], bool]] = [
        ("no routing: route + record", costs.plain, True),
        ("with routing: routed_prefix", costs.prefix, False),
        ("  int32_ids (the adapter's decoder)", costs.decode, False),
        ("  RoutedExperts(...)", costs.experts, False),
        ("  route + record", costs.routed_record, False),
        ("with routing: total", costs.routed_total(), True),
    ]
    for label, values, ratio in rows:
        mean, p50, p99 = _ms(values)
        table.add_row(
            label,
            _f(mean),
            _f(p50),
            _f(p99),
            f"{mean / plain_mean:,.1f}x" if ratio else "",
            style="bold" if label.startswith("with routing: total") else None,
        )
    return table


def memory_table(memory: Memory) -> Table:
    per_100k = 100_000 / memory.context_tokens
    table = Table(
        title=f"2. memory retained by the tree, {memory.context_tokens:,} tokens (tracemalloc)",
        title_justify="left",
        caption=(
            f"theoretical: 100k x {ROW} x 4 B = {THEORETICAL_PER_100K / 1e6:.1f} MB per 100k "
            "tokens (one row per position but the last).\n"
            f"capture transient per turn (decoded bytes + array, beyond the base64 string): "
            f"median {_mb(statistics.median(memory.capture_peaks))} MB, "
            f"max {_mb(max(memory.capture_peaks))} MB (first turn)."
        ),
        caption_justify="left",
    )
    for name in ("tree", "MB", "MB per 100k tokens", "theoretical MB per 100k"):
        table.add_column(name, justify="left" if name == "tree" else "right", no_wrap=True)
    theory = _mb(THEORETICAL_PER_100K)
    table.add_row("without routing", _mb(memory.plain), _mb(memory.plain * per_100k), "")
    table.add_row("with routing", _mb(memory.routed), _mb(memory.routed * per_100k), "")
    table.add_row(
        "routing's share (difference)",
        _mb(memory.routing_share),
        _mb(memory.routing_share * per_100k),
        theory,
        style="bold",
    )
    table.add_row(
        "expert ids held x 4 B",
        _mb(4 * memory.routing_ids),
        _mb(4 * memory.routing_ids * per_100k),
        theory,
    )
    return table


def branched_table(result: Branched) -> Table:
    table = Table(
        title=(
            f"3. linearize and sidecar ({result.calls} calls, {result.samples} samples, "
            f"{result.tokens:,} tokens)"
        ),
        title_justify="left",
        caption=(
            f"main agent + {SUB_AGENTS} sub-agents of {SUB_TURNS} calls; medians of the runs.\n"
            "peak: the most traced memory the call held at once, beyond what existed before it.\n"
            "dumps with routing includes a SHA-256 per turn of its routing; loads with routing "
            "checks them and rebuilds RoutedExperts."
        ),
        caption_justify="left",
    )
    for name in ("step", "no routing", "with routing", "ratio"):
        table.add_column(name, justify="left" if name == "step" else "right", no_wrap=True)

    def pair(label: str, plain: Timed | None, routed: Timed) -> None:
        for kind, attr in (("CPU ms", "cpu_ms"), ("wall ms", "wall_ms")):
            r = getattr(routed, attr)
            p = None if plain is None else getattr(plain, attr)
            table.add_row(
                f"{label} {kind}",
                "" if p is None else _f(p),
                _f(r),
                "" if p is None else f"{r / p:,.1f}x",
                end_section=kind == "wall ms",
            )

    pair("linearize", result.linearize_plain, result.linearize_routed)
    table.add_row(
        "linearize peak MB",
        _mb(result.linearize_plain_peak),
        _mb(result.linearize_routed_peak),
        "",
        end_section=True,
    )
    pair("dumps (JSON)", result.dumps_plain, result.dumps_routed)
    pair("dump_routing (sidecar)", None, result.dump_routing)
    pair("loads", result.loads_plain, result.loads_routed)
    table.add_row("JSON MB", _mb(result.json_plain_bytes), _mb(result.json_routed_bytes), "")
    table.add_row("sidecar MB", "", _mb(result.sidecar_bytes), "")
    return table


# -- command line ----------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--tokens", type=int, default=None, help="parts 1-2: session length (100000; quick 10000)"
    )
    parser.add_argument(
        "--turns", type=int, default=None, help="part 3: calls in the session (200; quick 30)"
    )
    parser.add_argument("--runs", type=int, default=None, help="part 3: timed runs (3; quick 1)")
    parser.add_argument("--quick", action="store_true", help="a small smoke run (a few seconds)")
    parser.add_argument("--seed", type=int, default=23, help="session seed (default 23)")
    args = parser.parse_args(argv)
    tokens: int = args.tokens or (10_000 if args.quick else 100_000)
    turns: int = args.turns or (30 if args.quick else 200)
    runs: int = args.runs or (1 if args.quick else 3)
    if tokens < 1 or turns <= SUB_AGENTS * SUB_TURNS or runs < 1:
        parser.error(f"--tokens and --runs must be positive, --turns > {SUB_AGENTS * SUB_TURNS}")

    console = Console(width=max(shutil.get_terminal_size((140, 40)).columns, 140))
    console.print(
        f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} cpus, "
        f"load average {os.getloadavg()[0]:.2f} at start (other work skews the timings); "
        f"seed {args.seed}; CPU = this thread's CPU time",
        style="dim",
    )
    started = time.perf_counter()
    try:
        with progress_bar(console) as progress:
            capture = capture_side_by_side(tokens, args.seed, progress)
            gc.collect()
            status = progress.add_task("memory (tracemalloc, 2 builds)", total=None)
            memory = measure_memory(tokens, args.seed)
            progress.remove_task(status)
            branched = measure_branched(turns, args.seed, runs, progress)
    except BenchError as exc:
        console.print(f"FAILED: {exc}", style="bold red")
        return 1
    console.print(capture_table(capture))
    console.print(memory_table(memory))
    console.print(branched_table(branched))
    console.print(
        f"ran in {time.perf_counter() - started:.1f} s; load average at the end: "
        f"{os.getloadavg()[0]:.2f}",
        style="dim",
    )
    return 0


def progress_bar(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )


if __name__ == "__main__":
    sys.exit(main())
