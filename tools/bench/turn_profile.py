"""Where an adapter turn's CPU goes: one streamed Anthropic session, phase by phase, 8k-128k.

    uv run tools/bench/turn_profile.py                     # 8k, 32k, 128k x 4 and 32 KB results
    uv run tools/bench/turn_profile.py --quick             # 8k, 32k, 3 turns each: < 1 min
    uv run tools/bench/turn_profile.py --contexts 64000 --tool-kb 8 --turns 20
    uv run tools/bench/turn_profile.py --markdown table.md # the table as Markdown too
    uv run tools/bench/turn_profile.py --tokenize-calls 200 # more calls in the tokenizing table
    uv run tools/bench/turn_profile.py --cprofile 10       # and the loop thread under cProfile
    uv run tools/bench/turn_profile.py --adapter-src OTHER/packages/protocol-adapters/src
    uv run tools/bench/turn_profile.py --baseline OTHER/packages/protocol-adapters/src

Two processes. The adapter (the real ``AdapterServer``: Anthropic dialect, bridge renderer with
the real Qwen3 tokenizer, SGLang client) runs in a Python of its own, so that its CPU is its own;
this process holds the client (raw aiohttp, ``stream: true``, as Claude Code speaks) and the
SGLang-wire engine double, which answers at once (no latency), one token per streamed chunk
(SGLang's default stream interval): a short reasoning, a sentence and one ``Bash`` call, which the
client echoes back (thinking with its signature) as Claude Code does. ``--adapter-src`` puts
another checkout's ``packages/protocol-adapters/src`` first on the adapter's path (as
big_body_bench.py does).

``--baseline SRC`` measures two adapters side by side in one run: a second adapter process runs
the ``packages/protocol-adapters/src`` at SRC (the baseline; the bench checks it imported from
there), the first the current one (the workspace's, or ``--adapter-src``). Every turn of the
session goes to both, with the same tool result and the same engine double (each adapter keeps
its own copy of the history, since tool-use ids and thinking signatures are each adapter's own),
and the measured turns alternate between them (which one goes first alternates too), so both
see the same machine load. Then a before/after table: total CPU per turn, the context-dependent
phases, and current / baseline per column; the detailed table is the current adapter's.

For each tool-result size (``--tool-kb``: line-numbered slices of the standard library's source,
as Claude Code's Read shows a file), one session grows turn by turn until the next turn's prompt
would be nearest each context size (``--contexts``, in prompt tokens). There, after one warm-up
turn, ``--turns`` turns are measured with the phase hooks and as many without, alternated; each
sends the same history plus a new tool result (siblings in the tree, so the context stays where it
is; each is routed, bridged and recorded like the next turn of the session, which the bench
checks). Then one turn with the bridge check forced: the full check a ``check_sample_rate`` of
0.01 runs on 1% of turns (the measured turns run with the rate at 0, so none is sampled by chance).

How CPU is counted, and why. The client tells the adapter to open a window, sends the turn, reads
its stream to the end, and closes the window. The window's total is the adapter process's CPU
time (``time.process_time_ns``: every thread, the event loop, the worker threads that decode large
bodies and render, the thread that JSON-encodes the engine request, any native thread), less the
CPU of the bench's own control thread in the window (read with its own clock, shown apart), and
split by thread from ``/proc/self/task/*/schedstat``. Phases are attributed by wrappers the bench
installs on the server's functions (the package sources are untouched): each reads
``time.thread_time_ns`` on entry and exit, so a phase is charged exactly the CPU its own thread
spent inside it, on whichever thread it ran; time blocked or waiting for the GIL is charged to
nothing. Nested hooks charge the innermost phase where the outer one nests (a render charges the
tokenizer's time to tokenizing); elsewhere the outer phase keeps it (the prompt check keeps the
encoding it does). The wrappers on coroutines (awaiting the body, sending the engine request,
writing the client's stream) charge the event loop's CPU while they are awaited: one turn is in
flight, so what the loop runs then is that step's protocol callbacks. "other" is the total minus
every phase, shown per thread: on the loop, aiohttp's handler dispatch, tasks, the turn runner's
per-chunk loop, the asyncio loop itself (``--cprofile`` lists its functions); on workers, the
executor hops. cProfile is not the measure: it costs every Python call, not just the hooked ones,
and so inflates Python-heavy phases against C-heavy ones (json, the tokenizer), the very split
this table is for. The hooks' own cost is shown twice: hooked turns against turns without hooks
(noisy on a shared machine), and hooked calls per turn times a calibrated cost per call.

Then, per tool-result size (and per adapter, with ``--baseline``), a table apart: tokenizing a
turn's new text, the adapter against the Rust tokenizer. One more sibling turn (without hooks) at
the session's last context, during which the adapter's ``Vocabulary.encode_with_starts`` (before:
``encode_with_offsets``) and the bridge's ``segment_ids`` are wrapped to keep what they are called
with (the bridge's one call of each: the new messages as the template renders them, their spans);
then, in the adapter's process (idle: no turn in flight), on that text and with the same
arguments, interleaved calls of (a) ``tokenizer.encode``, (b) ``tokenizer.encode_batch([text])``,
(c) that and its ``.ids`` and ``.offsets`` lists, (d) the vocabulary's call, (f) ``segment_ids``
on (d)'s result (timed alone), all on one worker thread of a ``ThreadPoolExecutor``, and (e) (d)
through ``loop.run_in_executor`` to that thread, timed on the event loop; CPU is the process's
(every thread, the tokenizer's own too). The overheads (d)-(a),
(d)-(c) and (e)-(d) are medians of per-round differences with a ~95% confidence interval, judged
against 0.2 ms (``--tokenize-calls``: calls of each, 100 by default, 50 with ``--quick``); beside
them, the same measured directly, without the tokenizer's call-to-call spread (a millisecond at
32 KB): each call's CPU outside the tokenizer's encode calls (timed around them), and (e)'s less
the (d) inside it; the verdict is the direct measurements'. For reference: a hop of nothing, a
hop around a sleep as long as (d), and (a) on the main thread (the tokenizer is slower there:
glibc's main malloc arena).

Also printed: the floor every adapter pays, measured in this process on the same body and ids:
``json.loads`` of the client's body and ``json.dumps`` of the whole prompt's id list (what
``/generate`` carries). The exit status is 1 if a measured turn was not a bridged continuation of
the session (a fork or a full render would make the numbers meaningless).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import cProfile
import dataclasses
import fnmatch
import functools
import gc
import inspect
import io
import json
import math
import os
import pstats
import random
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from adapter_concurrency_bench import REPLY, SYSTEM, TOOLS
from rich.console import Console
from rich.table import Table

CONTEXT_TOKENS = 262_144
"""The session's and the engine double's context: room for 128k plus the growth around it."""
TURN_REPLY = dataclasses.replace(
    REPLY, reasoning="The tests fail in the parser module. List the sources before reading one."
)
SETTLE_S = 0.005
"""Pause after a turn's last byte before the window closes: the handler's epilogue runs."""

# -- the phases and the hooks: the only place that names the adapter's private modules ----------
#
# A hook names functions by "module glob:qualified-name glob" and is resolved at run time against
# the modules the adapter has loaded, so a function that moves to another private module is still
# found; a hook that finds nothing is reported, and its phase's CPU shows in "other" until the
# glob is updated here. Older names are listed too (before the _rendering split; before the
# ids' JSON was reused from the session's previous prompt: sglang's _encode_off_loop / _encode of
# the whole body, wire's request_body), so --adapter-src and --baseline work against checkouts
# from before those changes; each adapter misses the other era's names.

PA = "protocol_adapters"
BASE = "(outside hooks)"


@dataclass(frozen=True)
class Phase:
    key: str
    label: str
    hooks: tuple[str, ...]
    nests: bool = False
    """Whether hooks called inside it charge their own phases (else it keeps all it calls).
    The coroutine phases nest: the protocol callbacks the loop runs while they are awaited are
    charged to their own phases when they are hooked (the engine's bytes arriving meanwhile)."""


PHASES: tuple[Phase, ...] = (
    Phase(
        "body",
        "body read (aiohttp: request bytes in, body buffered)",
        ("aiohttp.web_protocol:RequestHandler.data_received", f"{PA}._server*:read_body"),
        nests=True,
    ),
    Phase(
        "decode",
        "JSON decode (UTF-8, json.loads, surrogate scan)",
        (f"{PA}._server*:decode_body",),
        nests=True,
    ),
    Phase(
        "parse",
        "request parsing (Anthropic dialect)",
        (f"{PA}._dialects*:parse_request", f"{PA}._dialects*:Anthropic*.parse_request"),
    ),
    Phase("route", "routing onto the tree", ("trajectory_tree*:SessionTree.route",)),
    Phase(
        "render",
        "rendering the new messages (template, segments)",
        (f"{PA}*:Renderer.render",),
        nests=True,
    ),
    Phase(
        "tokenize",
        "tokenizing (new messages, scaffold)",
        (
            f"{PA}._tokenizer*:Vocabulary.encode",
            f"{PA}._tokenizer*:Vocabulary.encode_with_starts",
            f"{PA}._tokenizer*:Vocabulary.encode_with_offsets",
        ),
    ),
    Phase("check", "prompt check (reply check)", (f"{PA}*:check_reply", f"{PA}*:check_bridge")),
    Phase(
        "notes",
        "kept-output notes (skeleton render, path walk)",
        (f"{PA}*:_reasoning_kept", f"{PA}*:Renderer._reasoning_kept", f"{PA}*:_kept_on_path"),
    ),
    Phase(
        "ids",
        "whole-prompt ids (route prefix + new: a list, then an array('i'))",
        (f"{PA}._bridge*:prompt_ids", f"{PA}*:Renderer._ids"),
    ),
    Phase(
        "build",
        "engine request: build (GenerateRequest, body fields)",
        (
            f"{PA}._server*:TurnRunner._build",
            f"{PA}._engine*:request_body",
            f"{PA}._engine*:request_fields",
        ),
        nests=True,
    ),
    Phase(
        "idcheck",
        "engine request: id check (GenerateRequest's _check_token_ids)",
        (f"{PA}._engine*:_check_token_ids",),
    ),
    Phase(
        "encode",
        "engine request: ids' JSON + body bytes (whole, then reused + new ids)",
        (
            f"{PA}._engine.sglang:_encode_off_loop",
            f"{PA}._engine.sglang:_encode",
            f"{PA}._engine*:SGLangEngine._body",
            f"{PA}._engine.ids_json:encode",
            f"{PA}._engine.ids_json:IdsJson.plan",
            f"{PA}._engine.ids_json:IdsJson.keep",
            f"{PA}._engine*:encoded_body",
        ),
        nests=True,
    ),
    Phase(
        "send",
        "engine request: send (aiohttp client, until the answer's headers)",
        (f"{PA}._engine*:SGLangEngine._post",),
        nests=True,
    ),
    Phase(
        "stream",
        "engine stream: read + decode",
        (
            "aiohttp.client_proto:ResponseHandler.data_received",
            f"{PA}._engine*:SSEParser.feed",
            f"{PA}._engine.sglang:_chunk",
        ),
    ),
    Phase(
        "drain",
        "engine stream: drain after [DONE]",
        (f"{PA}._engine*:SGLangEngine._drain",),
        nests=True,
    ),
    Phase(
        "reply",
        "reply parsing (detokenize, tool call)",
        (
            f"{PA}._parsing*:IncrementalDecoder.feed",
            f"{PA}._parsing*:IncrementalDecoder.finish",
            f"{PA}._parsing*:ReplyStream.feed",
            f"{PA}._parsing*:ReplyStream.finish",
            f"{PA}._parsing*:ReplyStream.reply",
        ),
    ),
    Phase(
        "record",
        "recording in the tree",
        (f"{PA}._server*:TurnRunner._record", f"{PA}._server*:_meta"),
    ),
    Phase(
        "sse_encode",
        "client SSE: encode events",
        (
            f"{PA}._dialects.anthropic*:*Encoder.start",
            f"{PA}._dialects.anthropic*:*Encoder.event",
            f"{PA}._dialects.anthropic*:*Encoder.finish",
        ),
    ),
    Phase(
        "sse_write",
        "client SSE: write (aiohttp)",
        (
            "aiohttp.web_response:StreamResponse.prepare",
            "aiohttp.web_response:StreamResponse.write",
            "aiohttp.web_response:StreamResponse.write_eof",
        ),
        nests=True,
    ),
)
GC = Phase("gc", "garbage collection (whichever phase allocated)", ())
"""Collections are charged to themselves, not to the phase whose allocation set them off (an
occasional full collection would otherwise land on one phase of one turn: 100+ ms seen)."""
FORCE_CHECK_HOOK = f"{PA}*:Renderer._sample_check"
"""Replaced by ``lambda self: True`` for the forced-check turn."""
ENCODE_CALLS = ("encode_with_starts", "encode_with_offsets")
"""The ``Vocabulary`` method a bridged turn encodes its new text with, the first one the adapter
has (ids and token starts; before, ids and offsets): the tokenizing table's (d)."""
CUT_HOOK = f"{PA}._bridge*:segment_ids"
"""What cuts (d)'s ids at the turn's span ends, with (d)'s second result: the tokenizing
table's (f)."""
SEARCHED = (PA, "trajectory_tree", "aiohttp")
"""Packages whose modules' globals (and the objects in their module-level dicts) are searched
for references to a hooked function, so every caller reaches the wrapper."""


# -- the ledger: CPU per phase, per thread (runs in the adapter's process) ----------------------


class Ledger:
    """One thread's phase stack and what each phase has spent on it (thread CPU, ns)."""

    __slots__ = ("calls", "last", "spent", "stack", "tid")

    def __init__(self) -> None:
        self.tid = threading.get_native_id()
        self.stack: list[str] = [BASE]
        self.last = time.thread_time_ns()
        self.spent: defaultdict[str, int] = defaultdict(int)
        self.calls = 0


_local = threading.local()
_ledgers: list[Ledger] = []
_ledgers_lock = threading.Lock()
_whole: set[str] = set()
"""Phases that keep what their callees spend (every phase whose ``nests`` is False)."""


def _ledger() -> Ledger:
    try:
        ledger: Ledger = _local.ledger
    except AttributeError:
        ledger = _local.ledger = Ledger()
        with _ledgers_lock:
            _ledgers.append(ledger)
    return ledger


def enter(phase: str, *, own: bool = False) -> tuple[Ledger, int]:
    """Start charging ``phase`` on this thread (the enclosing phase instead, when that one keeps
    what it calls, unless ``own``); returns what :func:`leave` needs."""
    ledger = _ledger()
    now = time.thread_time_ns()
    top = ledger.stack[-1]
    ledger.spent[top] += now - ledger.last
    ledger.last = now
    depth = len(ledger.stack)
    ledger.stack.append(top if top in _whole and not own else phase)
    ledger.calls += 1
    return ledger, depth


def leave(ledger: Ledger, depth: int) -> None:
    now = time.thread_time_ns()
    ledger.spent[ledger.stack[-1]] += now - ledger.last
    ledger.last = now
    del ledger.stack[depth:]


def _collecting(stage: str, info: dict[str, int]) -> None:
    """``gc.callbacks`` entry: a collection is a phase of its own, on the thread it runs on."""
    del info
    if stage == "start":
        _local.collection = enter(GC.key, own=True)
    elif (started := getattr(_local, "collection", None)) is not None:
        _local.collection = None
        leave(*started)


def sync_hook(fn: Callable[..., Any], phase: str) -> Callable[..., Any]:
    @functools.wraps(fn)
    def hooked(*args: Any, **kwargs: Any) -> Any:
        ledger, depth = enter(phase)
        try:
            return fn(*args, **kwargs)
        finally:
            leave(ledger, depth)

    return hooked


def async_hook(fn: Callable[..., Any], phase: str) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def hooked(*args: Any, **kwargs: Any) -> Any:
        ledger, depth = enter(phase)
        try:
            return await fn(*args, **kwargs)
        finally:
            leave(ledger, depth)

    return hooked


@dataclass
class Patch:
    owner: object
    attribute: str
    original: object
    replacement: object

    def apply(self, value: object) -> None:
        if isinstance(self.owner, type) or inspect.ismodule(self.owner):
            setattr(self.owner, self.attribute, value)
        else:  # a frozen (or slotted) instance, such as a dialect in a module-level table
            object.__setattr__(self.owner, self.attribute, value)


def _searched_modules() -> list[Any]:
    return [
        module
        for name, module in list(sys.modules.items())
        if module is not None and name.split(".")[0] in SEARCHED
    ]


def _references(function: object) -> Iterator[tuple[object, str]]:
    """Every ``(owner, attribute)`` that holds ``function``: module globals, and the fields of
    objects held in module-level dicts (a dialect table's entries, say)."""
    for module in _searched_modules():
        for name, value in list(vars(module).items()):
            if value is function:
                yield module, name
            elif isinstance(value, dict):
                for entry in list(value.values()):
                    if isinstance(entry, type) or inspect.ismodule(entry):
                        continue
                    slots = getattr(type(entry), "__slots__", ())
                    fields = (slots,) if isinstance(slots, str) else tuple(slots)
                    fields += tuple(getattr(entry, "__dict__", {}))
                    for attribute in fields:
                        try:
                            held = getattr(entry, attribute, None)
                        except Exception:  # a property or slot that cannot be read: not ours
                            continue
                        if held is function:
                            yield entry, attribute


def find(spec: str) -> list[tuple[object, str, object]]:
    """``(owner, attribute, value)`` of what ``spec`` ("module glob:qualname glob") names: a
    method on its class, or a function at every reference to it."""
    module_glob, qual_glob = spec.split(":")
    found: list[tuple[object, str, object]] = []
    seen: set[tuple[int, str]] = set()
    for module in _searched_modules():
        name = module.__name__
        if not fnmatch.fnmatchcase(name, module_glob):
            continue
        for value in list(vars(module).values()):
            if isinstance(value, type) and value.__module__ == name:
                for key, member in list(vars(value).items()):
                    inner = getattr(member, "__func__", member)
                    wanted = f"{value.__qualname__}.{key}"
                    if (
                        inspect.isfunction(inner)
                        and fnmatch.fnmatchcase(wanted, qual_glob)
                        and (id(value), key) not in seen
                    ):
                        seen.add((id(value), key))
                        found.append((value, key, member))
            elif (
                inspect.isfunction(value)
                and value.__module__ == name
                and fnmatch.fnmatchcase(value.__qualname__, qual_glob)
                and (id(value), "") not in seen
            ):
                seen.add((id(value), ""))
                found.extend((owner, attr, value) for owner, attr in _references(value))
    return found


def _wrapped(member: object, phase: Phase) -> object:
    inner: Callable[..., Any] = getattr(member, "__func__", None) or member  # type: ignore[assignment]
    make = async_hook if inspect.iscoroutinefunction(inner) else sync_hook
    hooked = make(inner, phase.key)
    if isinstance(member, staticmethod):
        return staticmethod(hooked)
    if isinstance(member, classmethod):
        return classmethod(hooked)
    return hooked


class Hooks:
    """The phase wrappers: resolved once, installed and removed between turns."""

    def __init__(self) -> None:
        self.patches: list[Patch] = []
        self.found: dict[str, int] = {}
        self.forced: list[Patch] = []
        self.on = False
        _whole.update(p.key for p in PHASES if not p.nests)

    def resolve(self) -> None:
        done: set[tuple[int, str]] = set()
        for phase in PHASES:
            for spec in phase.hooks:
                hits = [hit for hit in find(spec) if (id(hit[0]), hit[1]) not in done]
                for owner, attribute, value in hits:
                    done.add((id(owner), attribute))
                    self.patches.append(Patch(owner, attribute, value, _wrapped(value, phase)))
                self.found[spec] = len(hits)
        for owner, attribute, value in find(FORCE_CHECK_HOOK):
            self.forced.append(Patch(owner, attribute, value, _always))
        self.found[FORCE_CHECK_HOOK] = len(self.forced)

    def set(self, on: bool, *, force_check: bool = False) -> None:
        if on != self.on:
            for patch in self.patches if on else reversed(self.patches):
                patch.apply(patch.replacement if on else patch.original)
            if on:
                gc.callbacks.append(_collecting)
            else:
                gc.callbacks.remove(_collecting)
            self.on = on
        for patch in self.forced:
            patch.apply(patch.replacement if force_check else patch.original)


def _always(self: object) -> bool:
    del self
    return True


def calibrate(rounds: int = 50_000) -> float:
    """Thread CPU ns one hooked call costs over the bare call (median of 5 runs)."""

    def bare() -> None:
        return None

    hooked = sync_hook(bare, "calibration")
    costs = []
    for _ in range(5):
        began = time.thread_time_ns()
        for _ in range(rounds):
            bare()
        middle = time.thread_time_ns()
        for _ in range(rounds):
            hooked()
        costs.append(((time.thread_time_ns() - middle) - (middle - began)) / rounds)
    return statistics.median(costs)


def thread_cpu_ns() -> dict[int, int]:
    """CPU ns of every thread of this process, by native id (``/proc``'s scheduler accounting)."""
    out: dict[int, int] = {}
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError, ValueError, IndexError):  # a thread that just ended
            out[int(tid)] = int(Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[0])
    return out


@dataclass
class Window:
    process: int
    threads: dict[int, int]
    control: int
    collections: list[int]


def collections() -> list[int]:
    """Collections so far, by generation (every thread's)."""
    return [generation["collections"] for generation in gc.get_stats()]


class Probe:
    """The adapter process's side of the bench: windows, hooks, counters."""

    def __init__(self, loop_tid: int, control_tid: int, stats: Callable[[], int]) -> None:
        self.loop_tid = loop_tid
        self.control_tid = control_tid
        self.stats = stats  # full renders so far
        self.hooks = Hooks()
        self.window: Window | None = None
        self.renders_before = 0
        self.routes: list[tuple[int, bool]] = []

    def categories(self, tids: Sequence[int]) -> dict[int, str]:
        python = {t.native_id for t in threading.enumerate() if t.native_id is not None}
        out: dict[int, str] = {}
        for tid in tids:
            if tid == self.loop_tid:
                out[tid] = "loop"
            elif tid == self.control_tid:
                out[tid] = "control"
            elif tid in python:
                out[tid] = "workers"
            else:
                out[tid] = "native"
        return out

    def begin(self, hooks: bool, force_check: bool) -> None:
        self.hooks.set(hooks, force_check=force_check)
        with _ledgers_lock:
            for ledger in _ledgers:
                ledger.spent.clear()
                ledger.calls = 0
        self.routes.clear()
        self.renders_before = self.stats()
        threads = thread_cpu_ns()
        # This (the control) thread's CPU in the window is the bench's, not the adapter's: read
        # with its own clock right next to the process's, and taken out of the total.
        control = time.thread_time_ns()
        self.window = Window(time.process_time_ns(), threads, control, collections())

    def end(self) -> dict[str, Any]:
        """The window's CPU: the adapter's total (the process's less this control thread's), by
        thread category, by phase, and the part of each category outside every phase."""
        process = time.process_time_ns()
        control = time.thread_time_ns()
        threads = thread_cpu_ns()
        assert self.window is not None
        categories = self.categories(list(threads))
        by_category: defaultdict[str, int] = defaultdict(int)
        for tid, category in categories.items():
            by_category[category] += threads[tid] - self.window.threads.get(tid, 0)
        by_category["control"] = control - self.window.control
        phases: defaultdict[str, int] = defaultdict(int)
        inside: defaultdict[str, int] = defaultdict(int)  # phase CPU by thread category
        calls = 0
        with _ledgers_lock:
            for ledger in _ledgers:
                calls += ledger.calls
                for phase, spent in ledger.spent.items():
                    if phase != BASE:
                        phases[phase] += spent
                        inside[categories.get(ledger.tid, "workers")] += spent
        hooked = self.hooks.on
        self.hooks.set(False)
        counts = zip(collections(), self.window.collections, strict=True)
        counted = [now - before for now, before in counts]
        return {
            "collections": counted,
            "process": process - self.window.process - by_category["control"],
            "threads": dict(by_category),
            "outside": {c: by_category[c] - inside[c] for c in ("loop", "workers", "native")},
            "phases": dict(phases) if hooked else {},
            "calls": calls if hooked else 0,
            "full_renders": self.stats() - self.renders_before,
            "routes": list(self.routes),
        }


# -- tokenizing: the adapter against the Rust tokenizer (runs in the adapter's process) ---------

VARIANTS: tuple[tuple[str, str], ...] = (
    ("a", "(a) tokenizer.encode(text)"),
    ("b", "(b) tokenizer.encode_batch([text])"),
    ("c", "(c) (b) + .ids, .offsets lists"),
    ("d", "(d) Vocabulary.encode_with_starts (before: _with_offsets)(text)"),
    ("e", "(e) (d) via loop.run_in_executor"),
    ("f", "(f) segment_ids(ids, (d)'s starts or offsets, the turn's spans)"),
    ("p", "(d) with its encode_batch calls timed"),
    ("h", "a hop of nothing (the worker answers at once)"),
    ("s", "a hop around time.sleep((d)'s CPU)"),
    ("m", "(a) on the main thread"),
)
"""The calls compared on one text. (a)-(c): the Rust tokenizer directly (``encode``, which holds
the GIL; ``encode_batch`` of one text, which releases it; and its ids and offsets as Python
lists, which the getters build). (d): the adapter's :data:`ENCODE_CALLS` method (pieces,
``encode_batch`` per piece, the ids extended; its token starts read lazily from the encodings, or
before, the offsets lists extended and shifted past the first piece). (e):
(d) through a worker-thread hop, as the server runs it (``loop.run_in_executor`` on a started
``ThreadPoolExecutor``, awaited on the event loop, timed there). (a)-(d) run on that executor's
thread, timed there: the server tokenizes on worker threads, and the Rust tokenizer is slower on
the main thread (glibc's main malloc arena, shared with the interpreter's own allocations,
against a thread's arena of its own), so (a) on the main thread (the event loop's) is a
reference apart.

The overheads are measured directly too, free of the tokenizer's call-to-call spread (a 32 KB
text's encode varies by a millisecond or more): each call's CPU outside the tokenizer's encode
calls (timed around them: in (a)-(c) inline; in "p", a twin of (d), by a stand-in for the
tokenizer that times its ``encode_batch`` calls, and the garbage collections during it too), and
(e)'s CPU less that of the (d) inside it, as the worker timed it. Two hops for reference: "h" of
nothing (the worker answers at once), "s" around a sleep as long as (d) (the event loop and the
worker both block and wake, as in (e), with no work done). (f): the bridge's ``segment_ids`` on
(d)'s result and the turn's spans (timed alone, after a (d)): the rest of what the turn does with
the encoding, which reads the token starts."""
OVERHEADS: tuple[tuple[str, str], ...] = (("d", "a"), ("d", "c"), ("e", "d"))
"""The overheads judged, CPU: (d)-(a), (d)-(c), (e)-(d)."""
OVERHEAD_LIMIT_MS = 0.2
WARM_UP_ROUNDS = 3
SERIES = ("cpu", "caller", "wall", "inside", "inside_wall", "gc", "ids", "offsets", "cut")
"""Per call, ns: the process's CPU (``time.process_time_ns``: every thread, the tokenizer's own
included); the calling thread's CPU (0 for the hops: timed on the loop); the wall as the caller
sees it; "inside": the process's CPU inside the tokenizer's encode calls (timed around them in
(a)-(c) and "p"), for the hops inside the hopped call as the worker timed it ("inside_wall": its
wall there); "p" only: "gc", the thread's CPU in garbage collections, "ids" and "offsets", the
process's CPU in those getters (the collections they set off included); "f" only: "cut", the
process's CPU in ``segment_ids``. 0 where not taken."""


class Capture:
    """The calls of the adapter's :data:`ENCODE_CALLS` method and of :data:`CUT_HOOK` while
    installed: in a bridged turn, exactly one of each, on the new messages' text (the bridge's
    ``appended.body``, through ``encode_within``) and its spans. Installed with the hooks off, the
    method on the class (so the renderer's instance, on whichever worker thread, is seen), the
    function at every reference to it; removed by putting back what was there."""

    def __init__(self, vocabulary: Any) -> None:
        self.owner = type(vocabulary)
        self.name = next((n for n in ENCODE_CALLS if n in vars(self.owner)), None)
        self.calls: list[dict[str, Any]] = []
        self.cuts: list[Any] = []
        self.patches: list[Patch] = []

    def start(self) -> None:
        self.calls.clear()
        self.cuts.clear()
        assert self.name is not None
        encode = vars(self.owner)[self.name]

        @functools.wraps(encode)
        def captured(vocabulary: Any, text: str, **kwargs: Any) -> Any:
            thread = threading.current_thread().name
            self.calls.append({"text": text, "kwargs": kwargs, "thread": thread})
            return encode(vocabulary, text, **kwargs)

        self.patches = [Patch(self.owner, self.name, encode, captured)]
        for owner, attribute, cut in find(CUT_HOOK):

            def cut_captured(ids: Any, starts: Any, spans: Any, cut: Any = cut) -> Any:
                self.cuts.append({"cut": cut, "spans": list(spans)})
                return cut(ids, starts, spans)

            self.patches.append(Patch(owner, attribute, cut, cut_captured))
        for patch in self.patches:
            patch.apply(patch.replacement)

    def stop(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        for patch in reversed(self.patches):
            patch.apply(patch.original)
        self.patches = []
        return list(self.calls), list(self.cuts)


class TimedTokenizer:
    """Stands in for the vocabulary's Rust tokenizer (its ``tokenizer`` slot, while no turn is in
    flight) to count its ``encode_batch`` / ``encode_batch_fast`` calls (the pieces the vocabulary
    cuts a text into, and any piece encoded again with offsets) and
    the process CPU spent inside them, and in the ``.ids`` and ``.offsets`` getters of the
    encodings they return; everything else is the tokenizer's own."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.batches = 0
        self.inside_ns = 0
        self.ids_ns = 0
        self.offsets_ns = 0

    def encode_batch(self, *args: Any, **kwargs: Any) -> Any:
        return self._timed(self.tokenizer.encode_batch, *args, **kwargs)

    def encode_batch_fast(self, *args: Any, **kwargs: Any) -> Any:
        """The same without offsets (the adapter's call where it finds starts without them)."""
        return self._timed(self.tokenizer.encode_batch_fast, *args, **kwargs)

    def _timed(self, encode: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        began = time.process_time_ns()
        try:
            encodings = encode(*args, **kwargs)
        finally:
            self.inside_ns += time.process_time_ns() - began
            self.batches += 1
        return [TimedEncoding(encoding, self) for encoding in encodings]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tokenizer, name)


class TimedEncoding:
    """An ``Encoding`` whose ``.ids`` and ``.offsets`` (each a new Python list, built by the
    getter) are timed for its :class:`TimedTokenizer`."""

    __slots__ = ("encoding", "owner")

    def __init__(self, encoding: Any, owner: TimedTokenizer) -> None:
        self.encoding = encoding
        self.owner = owner

    @property
    def ids(self) -> Any:
        began = time.process_time_ns()
        ids = self.encoding.ids
        self.owner.ids_ns += time.process_time_ns() - began
        return ids

    @property
    def offsets(self) -> Any:
        began = time.process_time_ns()
        offsets = self.encoding.offsets
        self.owner.offsets_ns += time.process_time_ns() - began
        return offsets

    def __len__(self) -> int:
        return len(self.encoding)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.encoding, name)


@contextlib.contextmanager
def tokenizer_timed(vocabulary: Any) -> Iterator[TimedTokenizer]:
    tokenizer = vocabulary.tokenizer
    timed = TimedTokenizer(tokenizer)
    setattr(vocabulary, "tokenizer", timed)  # noqa: B010 (the slot, put back below)
    try:
        yield timed
    finally:
        setattr(vocabulary, "tokenizer", tokenizer)  # noqa: B010


async def tokenize_costs(
    vocabulary: Any, method: str, call: dict[str, Any], cut: dict[str, Any], rounds: int
) -> dict[str, Any]:
    """The :data:`VARIANTS` on the text of ``call`` (the adapter's ``method``'s call, with
    its ``kwargs``; ``cut``: the ``segment_ids`` call on its result), ``rounds`` calls each after
    :data:`WARM_UP_ROUNDS`, interleaved (one of each per round, the order rotating), in this
    process while it is idle: :data:`SERIES` per call, by variant."""
    tokenizer = vocabulary.tokenizer
    text, kwargs = call["text"], call["kwargs"]
    encode = getattr(vocabulary, method)
    segment_ids, spans = cut["cut"], cut["spans"]

    def direct() -> dict[str, int]:
        began = time.process_time_ns()
        encoding = tokenizer.encode(text, add_special_tokens=False)
        inside = time.process_time_ns() - began
        del encoding  # freed outside the encode call, as in the others
        return {"inside": inside}

    def batch() -> dict[str, int]:
        began = time.process_time_ns()
        (encoding,) = tokenizer.encode_batch([text], add_special_tokens=False)
        inside = time.process_time_ns() - began
        del encoding
        return {"inside": inside}

    def lists() -> dict[str, int]:
        began = time.process_time_ns()
        (encoding,) = tokenizer.encode_batch([text], add_special_tokens=False)
        inside = time.process_time_ns() - began
        ids, offsets = encoding.ids, encoding.offsets
        del encoding, ids, offsets
        return {"inside": inside}

    def adapter() -> dict[str, int]:
        ids, starts = encode(text, **kwargs)
        del ids, starts
        return {}

    def adapter_cut() -> dict[str, int]:
        ids, starts = encode(text, **kwargs)
        began = time.process_time_ns()
        segments = segment_ids(ids, starts, spans)
        del segments
        spent = time.process_time_ns() - began
        del ids, starts
        return {"cut": spent}

    collecting = [0, 0]  # the thread's CPU in collections so far; when the current one began

    def collection(stage: str, info: dict[str, int]) -> None:
        del info
        if stage == "start":
            collecting[1] = time.thread_time_ns()
        else:
            collecting[0] += time.thread_time_ns() - collecting[1]

    def adapter_timed() -> dict[str, int]:
        collecting[0] = 0
        gc.callbacks.append(collection)
        try:
            with tokenizer_timed(vocabulary) as timing:
                adapter()
        finally:
            gc.callbacks.remove(collection)
        return {
            "inside": timing.inside_ns,
            "gc": collecting[0],
            "ids": timing.ids_ns,
            "offsets": timing.offsets_ns,
        }

    def timed(call: Callable[[], dict[str, int] | None]) -> dict[str, int]:
        """One call, its results freed inside the window too: the clocks around it and what the
        call reports (the parts of :data:`SERIES` it timed inside)."""
        began, cpu, thread = time.perf_counter_ns(), time.process_time_ns(), time.thread_time_ns()
        inside = call()
        thread = time.thread_time_ns() - thread
        cpu = time.process_time_ns() - cpu
        wall = time.perf_counter_ns() - began
        return {"cpu": cpu, "caller": thread, "wall": wall, **(inside or {})}

    with tokenizer_timed(vocabulary) as counting:
        ids, _ = encode(text, **kwargs)
    (whole,) = tokenizer.encode_batch([text], add_special_tokens=False)
    if list(ids) != list(whole.ids):
        raise RuntimeError("the vocabulary's ids differ from the tokenizer's on the same text")
    on_worker: dict[str, Callable[[], dict[str, int]]] = {
        "a": direct,
        "b": batch,
        "c": lists,
        "d": adapter,
        "f": adapter_cut,
        "p": adapter_timed,
    }
    keys = [key for key, _ in VARIANTS]
    samples: dict[str, dict[str, list[int]]] = {name: {key: [] for key in keys} for name in SERIES}
    loop = asyncio.get_running_loop()
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="bench-hop") as pool:
        await loop.run_in_executor(pool, int)  # its thread started, as the server's are
        # As long as (d) runs once warm (the pool's thread is new: its first calls are slower).
        runs = [(await loop.run_in_executor(pool, timed, adapter))["cpu"] for _ in range(8)]
        took = statistics.median(runs[3:])
        asleep = functools.partial(time.sleep, took / 1e9)
        hops: dict[str, Callable[[], dict[str, int] | None]] = {
            "e": adapter,
            "h": dict,
            "s": asleep,
        }
        for round_ in range(WARM_UP_ROUNDS + rounds):
            shift = round_ % len(keys)
            for key in keys[shift:] + keys[:shift]:
                if key in hops:
                    began, cpu = time.perf_counter_ns(), time.process_time_ns()
                    hopped = await loop.run_in_executor(pool, timed, hops[key])
                    cpu = time.process_time_ns() - cpu
                    wall = time.perf_counter_ns() - began
                    sample = {
                        "cpu": cpu,
                        "wall": wall,
                        "inside": hopped["cpu"],
                        "inside_wall": hopped["wall"],
                    }
                elif key == "m":
                    sample = timed(direct)
                else:
                    sample = await loop.run_in_executor(pool, timed, on_worker[key])
                if round_ >= WARM_UP_ROUNDS:
                    for name in SERIES:
                        samples[name][key].append(sample.get(name, 0))
    return {
        "chars": len(text),
        "tokens": len(ids),
        "pieces": counting.batches,
        "spans": len(spans),
        "method": method,
        "kwargs": kwargs,
        "sleep_ms": took / 1e6,
        **samples,
    }


def serve_adapter(engine_url: str, cache_dir: str) -> None:
    """The adapter, in this process: print its URL, then answer the bench's commands (one JSON
    line each on stdin, one answer each on stdout) until ``stop``. Imports only the public API."""
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
        load_qwen3_vocabulary,
        qwen3_template,
        reply_parsers,
    )
    from trajectory_tree import SessionTree

    async def serve() -> None:
        vocabulary = load_qwen3_vocabulary(QwenTokenizerConfig(Path(cache_dir)))
        # Paid once per process, by the first prompt text over 32,768 characters (the longest
        # token's length, for the lower bound of a piece): here, not in some measured turn.
        began = time.thread_time_ns()
        vocabulary.at_least("")
        once_ms = (time.thread_time_ns() - began) / 1e6
        renderer = Renderer(vocabulary, qwen3_template(), RendererConfig(check_sample_rate=0.0))
        capture = Capture(vocabulary)
        config = AdapterConfig(
            limits=SessionLimits(max_turns=100_000, context_tokens=CONTEXT_TOKENS)
        )
        loop = asyncio.get_running_loop()
        stopped = asyncio.Event()
        async with (
            SGLangEngine(SGLangConfig(base_url=engine_url)) as engine,
            AdapterServer(config, engine, renderer, vocabulary, reply_parsers()) as server,
        ):
            ready = threading.Event()
            probes: list[Probe] = []

            def control() -> None:
                probe = Probe(
                    loop_tid, threading.get_native_id(), lambda: renderer.stats.full_renders
                )
                probes.append(probe)
                ready.set()
                for line in sys.stdin:
                    command = json.loads(line)
                    answer = handle(probe, command)
                    sys.stdout.write(json.dumps(answer) + "\n")
                    sys.stdout.flush()
                    if command["cmd"] == "stop":
                        break
                loop.call_soon_threadsafe(stopped.set)

            def handle(probe: Probe, command: dict[str, Any]) -> dict[str, Any]:
                cmd = command["cmd"]
                if cmd == "open":

                    async def open_session() -> str:
                        return server.sessions.open(command["name"]).token

                    token = asyncio.run_coroutine_threadsafe(open_session(), loop).result()
                    return {"token": token}
                if cmd == "resolve":
                    # Every routed turn, hooked or not, says whether it continued the session
                    # (one new message after the previous reply); the route hook wraps this.
                    route = SessionTree.route

                    @functools.wraps(route)
                    def observed(tree: SessionTree, prompt: Any) -> Any:
                        found = route(tree, prompt)
                        continued = found.previous_generated is not None
                        probe.routes.append((len(found.new_messages), continued))
                        return found

                    setattr(SessionTree, "route", observed)  # noqa: B010 (a method, replaced)
                    probe.hooks.resolve()
                    return {"found": probe.hooks.found, "hook_ns": calibrate()}
                if cmd == "begin":
                    probe.begin(bool(command["hooks"]), bool(command.get("force_check")))
                    if command.get("cprofile"):
                        on_loop(profiler.enable)
                    return {"ok": True}
                if cmd == "end":
                    if command.get("cprofile"):
                        on_loop(profiler.disable)
                    return probe.end()
                if cmd == "cprofile":
                    out = io.StringIO()
                    stats = pstats.Stats(profiler, stream=out)
                    stats.sort_stats("tottime").print_stats(int(command["top"]))
                    return {"text": out.getvalue()}
                if cmd == "capture":  # before a turn without hooks
                    if capture.name is None:
                        return {"error": f"this adapter's Vocabulary has none of {ENCODE_CALLS}"}
                    probe.hooks.set(False)
                    capture.start()
                    return {"ok": True}
                if cmd == "tokenize":  # after it: the text it encoded, measured
                    calls, cuts = capture.stop()
                    if len(calls) != 1 or len(cuts) != 1:
                        return {
                            "error": f"{len(calls)} {capture.name} and {len(cuts)} segment_ids "
                            "calls in the turn"
                        }
                    (call,), (cut,) = calls, cuts
                    assert capture.name is not None
                    costs = tokenize_costs(
                        vocabulary, capture.name, call, cut, int(command["rounds"])
                    )
                    answer = asyncio.run_coroutine_threadsafe(costs, loop).result()
                    return {**answer, "thread": call["thread"]}
                if cmd == "stop":
                    return {"ok": True}
                raise ValueError(f"unknown command {cmd!r}")

            profiler = cProfile.Profile(time.thread_time)  # the loop thread's CPU, not wall

            def on_loop(call: Callable[[], object]) -> None:
                """Run ``call`` on the event loop thread (cProfile profiles the thread that
                enables it) and wait until it has run."""
                done = threading.Event()

                def run() -> None:
                    call()
                    done.set()

                loop.call_soon_threadsafe(run)
                done.wait()

            loop_tid = threading.get_native_id()
            threading.Thread(target=control, name="bench-control", daemon=True).start()
            await asyncio.to_thread(ready.wait)
            started = {
                "url": server.url,
                "source": str(Path(protocol_adapters.__file__).parent),
                "pid": os.getpid(),
                "once_ms": once_ms,
            }
            print(json.dumps(started), flush=True)
            await stopped.wait()

    asyncio.run(serve())


# -- the bench's side: the adapter process, the session, the table ------------------------------


class Adapter:
    """The adapter's process and its command line."""

    def __init__(self, engine_url: str, cache_dir: Path, adapter_src: Path | None) -> None:
        env = dict(os.environ)
        if adapter_src is not None:
            env["PYTHONPATH"] = os.pathsep.join(
                filter(None, [str(adapter_src), env.get("PYTHONPATH")])
            )
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--serve-adapter", engine_url, str(cache_dir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.started: dict[str, Any] = {}
        self._lock = threading.Lock()

    def wait_started(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError("the adapter exited before serving")
        self.started = json.loads(line)
        return self.started

    def ask(self, **command: Any) -> dict[str, Any]:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        with self._lock:
            self.process.stdin.write(json.dumps(command) + "\n")
            self.process.stdin.flush()
            line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the adapter exited during {command['cmd']}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def stop(self) -> None:
        if self.process.poll() is None:
            try:
                self.ask(cmd="stop")
                self.process.wait(30)
            except (RuntimeError, OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()


def source_lines() -> list[str]:
    """Lines of standard-library source, the text a coding agent's tools mostly return."""
    stdlib = Path(sysconfig.get_path("stdlib"))
    lines: list[str] = []
    for package in ("asyncio", "email", "json", "http", "unittest", "concurrent/futures"):
        for path in sorted((stdlib / package).glob("*.py")):
            lines += path.read_text(errors="replace").splitlines()
    return lines


@dataclass
class Measured:
    """One measured turn, as the adapter and the client saw it."""

    process_ns: int
    """The adapter's CPU in the window: every thread but the bench's control thread."""
    threads: dict[str, int]
    outside: dict[str, int]
    """CPU of the loop, worker and native threads outside every phase."""
    phases: dict[str, int]
    collections: list[int]
    """Garbage collections in the window, by generation."""
    calls: int
    wall_s: float
    prompt_tokens: int
    body_bytes: int
    problems: list[str]


@dataclass
class Point:
    context: int
    tool_kb: int
    adapter: str = "current"
    hooked: list[Measured] = field(default_factory=list)
    bare: list[Measured] = field(default_factory=list)
    forced: Measured | None = None
    loads_floor_ms: float = 0.0
    dumps_floor_ms: float = 0.0
    growth_turns: int = 0
    load_average: float = 0.0
    """The machine's 1-minute load average when the point's measured turns began."""
    hook_ns: float = 0.0
    """The adapter's calibrated cost of one hooked call, thread CPU ns."""


@dataclass
class Lane:
    """One adapter's side of a session: its process, its session token, its copy of the history
    (the same turns as the other lane's, but the tool-use ids and thinking signatures in the
    replies it echoes back are this adapter's own)."""

    name: str
    adapter: Adapter
    url: str
    token: str
    messages: list[dict[str, Any]]
    last_ids: Sequence[int] = ()

    @property
    def headers(self) -> dict[str, str]:
        return {"x-api-key": self.token, "anthropic-version": "2023-06-01"}


class Session:
    """One Claude-Code-like session, played to every lane (adapter) alike: grown turn by turn
    (each turn to every lane, with the same tool result); measured turns are siblings."""

    def __init__(
        self,
        http: aiohttp.ClientSession,
        lanes: list[Lane],
        double: Any,
        tool_bytes: int,
        lines: list[str],
        seed: int,
    ) -> None:
        self.http = http
        self.lanes = lanes
        self.double = double
        self.tool_bytes = tool_bytes
        self.lines = lines
        self.rng = random.Random(seed)
        self.context = 0
        """Prompt tokens of the last grown turn (the last lane's: the current adapter)."""
        self.step = tool_bytes // 4
        """Tokens one more turn adds: first a guess (code runs ~3.5 bytes a token), then the
        last turn's."""
        self.turns = 0

    def tool_result(self) -> str:
        """A file as Claude Code's Read shows it: numbered lines, ``tool_bytes`` long."""
        start = self.rng.randrange(len(self.lines) - 2000)
        out: list[str] = []
        size = 0
        for number, line in enumerate(self.lines[start:], start=1):
            row = f"{number:>6}\t{line}"
            if size + len(row) + 1 > self.tool_bytes:
                break
            out.append(row)
            size += len(row) + 1
        return "\n".join(out)

    def body(self, messages: list[dict[str, Any]]) -> bytes:
        return json.dumps(
            {
                "model": "policy",
                "max_tokens": 4096,
                "stream": True,
                "system": [{"type": "text", "text": SYSTEM}],
                "tools": TOOLS,
                "messages": messages,
            }
        ).encode()

    @staticmethod
    def with_result(lane: Lane, result: str) -> list[dict[str, Any]]:
        """The lane's history and one new tool result (``result``) for the last reply's call."""
        last = lane.messages[-1]
        messages = list(lane.messages)
        if last["role"] == "assistant":
            use = next(b for b in last["content"] if b["type"] == "tool_use")
            block = {
                "type": "tool_result",
                "tool_use_id": use["id"],
                "content": result,
                "cache_control": {"type": "ephemeral"},
            }
            messages.append({"role": "user", "content": [block]})
        return messages

    async def send(self, lane: Lane, body: bytes) -> tuple[list[dict[str, Any]], float, int]:
        """One turn: its reply's content blocks, its wall time, the prompt's tokens."""
        began = time.perf_counter()
        url = f"{lane.url}/v1/messages"
        async with self.http.post(url, data=body, headers=lane.headers) as r:
            if r.status != 200:
                raise RuntimeError(f"{lane.name}: HTTP {r.status}: {await r.text()}")
            content = await read_turn(r)
        wall = time.perf_counter() - began
        (request,) = self.double.requests
        self.double.requests.clear()
        lane.last_ids = request.input_ids
        return content, wall, len(request.input_ids)

    async def grow(self) -> None:
        """One turn of the session itself, in every lane: the next tool result, the reply
        appended."""
        result = self.tool_result()
        tokens = 0
        for lane in self.lanes:
            messages = self.with_result(lane, result)
            content, _, tokens = await self.send(lane, self.body(messages))
            lane.messages = [*messages, {"role": "assistant", "content": content}]
        if self.turns:
            self.step = tokens - self.context
        self.context = tokens
        self.turns += 1


async def read_turn(response: aiohttp.ClientResponse) -> list[dict[str, Any]]:
    """The assistant content blocks of an Anthropic SSE stream, read to its end, as Claude Code
    rebuilds them to echo back (thinking with its signature, text, tool_use with its input)."""
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
            index, delta = event["index"], event["delta"]
            if delta["type"] == "text_delta":
                blocks[index]["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                blocks[index]["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                blocks[index]["signature"] = delta["signature"]
            elif delta["type"] == "input_json_delta":
                partial[index] = partial.get(index, "") + delta["partial_json"]
        elif kind == "error":
            raise RuntimeError(f"in-stream error: {event['error']}")
    for index, text in partial.items():
        blocks[index]["input"] = json.loads(text)
    return [blocks[i] for i in sorted(blocks)]


async def measured_turn(
    session: Session,
    lane: Lane,
    result: str,
    *,
    hooks: bool,
    force_check: bool = False,
    cprofile: bool = False,
) -> tuple[Measured, bytes]:
    """A sibling turn (the lane's history and the tool result ``result``) inside one
    measurement window of the lane's adapter."""
    body = session.body(session.with_result(lane, result))
    await asyncio.to_thread(
        lane.adapter.ask, cmd="begin", hooks=hooks, force_check=force_check, cprofile=cprofile
    )
    content, wall, tokens = await session.send(lane, body)
    await asyncio.sleep(SETTLE_S)
    window = await asyncio.to_thread(lane.adapter.ask, cmd="end", cprofile=cprofile)
    problems = []
    if window["routes"] != [[1, True]]:
        problems.append(f"not a continuation of the session: routes {window['routes']}")
    if window["full_renders"]:
        problems.append(f"{window['full_renders']} full render(s) instead of the bridge")
    if not any(b["type"] == "tool_use" for b in content):
        problems.append("the reply has no tool call")
    return (
        Measured(
            window["process"],
            window["threads"],
            window["outside"],
            window["phases"],
            window["collections"],
            window["calls"],
            wall,
            tokens,
            len(body),
            problems,
        ),
        body,
    )


def loads_floor(body: bytes) -> object:
    return json.loads(body.decode("utf-8"))


def dumps_floor(ids: list[int]) -> bytes:
    return json.dumps(ids, separators=(",", ":")).encode()


def median_ns(fn: Callable[[], object], runs: int = 5) -> float:
    costs = []
    for _ in range(runs):
        began = time.thread_time_ns()
        fn()
        costs.append(time.thread_time_ns() - began)
    return statistics.median(costs)


async def measure_point(
    session: Session, context: int, turns: int, console: Console
) -> dict[str, Point]:
    """The session grown to ``context``, then its measured turns: per lane, ``turns`` with hooks
    and as many without, alternated; each new tool result goes to every lane, in an order that
    alternates from one result to the next."""
    kb = session.tool_bytes // 1024
    points = {lane.name: Point(context, kb, lane.name) for lane in session.lanes}
    grown = session.turns
    # Grow while one more turn brings the measured turns' prompt (the context plus one result)
    # nearer the target: with 32 KB results the nearest is up to ~5k tokens either side.
    while session.turns == 0 or session.context + 1.5 * session.step < context:
        await session.grow()
    console.print(
        f"  {kb} KB results, target {context:,}: session at {session.context:,} tokens after "
        f"{session.turns} turns; measuring (load average {os.getloadavg()[0]:.2f})"
    )
    for point in points.values():
        point.growth_turns = session.turns - grown
        point.load_average = os.getloadavg()[0]
    warm_up = session.tool_result()
    for lane in session.lanes:  # a warm-up: the first after growing
        await measured_turn(session, lane, warm_up, hooks=True)
    bodies: dict[str, bytes] = {}
    sent = 0
    for turn in range(turns):
        for hooks in (True, False) if turn % 2 == 0 else (False, True):
            result = session.tool_result()
            order = session.lanes if sent % 2 == 0 else session.lanes[::-1]
            sent += 1
            for lane in order:
                measured, bodies[lane.name] = await measured_turn(
                    session, lane, result, hooks=hooks
                )
                point = points[lane.name]
                (point.hooked if hooks else point.bare).append(measured)
    forced_result = session.tool_result()
    for lane in session.lanes:
        point = points[lane.name]
        point.forced, _ = await measured_turn(
            session, lane, forced_result, hooks=True, force_check=True
        )
        point.loads_floor_ms = median_ns(functools.partial(loads_floor, bodies[lane.name])) / 1e6
        point.dumps_floor_ms = median_ns(functools.partial(dumps_floor, list(lane.last_ids))) / 1e6
    return points


# -- the table ----------------------------------------------------------------------------------


def mean_ms(values: Sequence[float]) -> float:
    return statistics.fmean(values) / 1e6 if values else float("nan")


def phase_ms(turns: Sequence[Measured], key: str) -> float:
    return mean_ms([t.phases.get(key, 0) for t in turns])


def other_ms(turns: Sequence[Measured]) -> float:
    return mean_ms([t.process_ns - sum(t.phases.values()) for t in turns])


def short(tokens: int) -> str:
    return f"{tokens / 1000:.0f}k" if tokens >= 1000 else str(tokens)


def total_ms(turns: Sequence[Measured]) -> float:
    return mean_ms([t.process_ns for t in turns])


def thread_ms(turns: Sequence[Measured], category: str, outside: bool = False) -> float:
    return mean_ms([(t.outside if outside else t.threads).get(category, 0) for t in turns])


def mean_of(turns: Sequence[Measured], value: Callable[[Measured], float]) -> float:
    return statistics.fmean(value(t) for t in turns)


def spread(p: Point) -> str:
    ordered = sorted(t.process_ns / 1e6 for t in p.hooked)
    return f"{ordered[0]:.1f} / {statistics.median(ordered):.1f} / {ordered[-1]:.1f}"


def split(category: str) -> Callable[[Point], str]:
    def cell(p: Point) -> str:
        everything = thread_ms(p.hooked, category)
        return f"{everything:.2f} ({thread_ms(p.hooked, category, outside=True):.2f})"

    return cell


def slowest(p: Point) -> str:
    """How far the slowest hooked turn is over the median one, and the phase most of it is in."""
    worst = max(p.hooked, key=lambda t: t.process_ns)
    typical = statistics.median(t.process_ns for t in p.hooked)
    excess = {
        phase.key: worst.phases.get(phase.key, 0)
        - statistics.median(t.phases.get(phase.key, 0) for t in p.hooked)
        for phase in (*PHASES, GC)
    }
    where = max(excess, key=lambda key: excess[key])
    return f"+{(worst.process_ns - typical) / 1e6:.1f}, {where} +{excess[where] / 1e6:.1f}"


def forced(p: Point) -> str:
    if p.forced is None:
        return "-"
    return f"{p.forced.phases.get('check', 0) / 1e6:.2f} / {p.forced.process_ns / 1e6:.1f}"


def rows(points: Sequence[Point], hook_ns: float) -> list[tuple[str, list[str]]]:
    """The table's rows: a label and one cell per point. The phase rows, garbage collection and
    "other" come first, then the total: the growth columns cover those."""

    def overhead(p: Point) -> str:
        estimated = mean_of(p.hooked, lambda t: t.calls) * hook_ns / 1e6
        return f"{total_ms(p.hooked) - total_ms(p.bare):+.2f} / {estimated:.2f}"

    def phase(key: str) -> Callable[[Point], str]:
        return lambda p: f"{phase_ms(p.hooked, key):.3f}"

    def collected(p: Point) -> str:
        by_generation = zip(*(t.collections for t in p.hooked), strict=True)
        return " / ".join(f"{statistics.fmean(counts):.1f}" for counts in by_generation)

    table: list[tuple[str, Callable[[Point], str]]] = [
        (ph.label, phase(ph.key)) for ph in (*PHASES, GC)
    ]
    table += [
        ("other (total - phases)", lambda p: f"{other_ms(p.hooked):.3f}"),
        ("**total CPU, hooked turns (mean)**", lambda p: f"**{total_ms(p.hooked):.2f}**"),
        ("total: min / p50 / max", spread),
        ("total: slowest turn over p50 ms, most of it in", slowest),
        ("total on the event loop thread (outside phases)", split("loop")),
        ("total on worker threads (outside phases)", split("workers")),
        ("total on native threads (outside phases)", split("native")),
        ("total CPU, turns without hooks (mean)", lambda p: f"{total_ms(p.bare):.2f}"),
        ("hook overhead: hooked - without / calls x cost", overhead),
        ("collections per turn, generation 0 / 1 / 2", collected),
        ("hooked calls per turn", lambda p: f"{mean_of(p.hooked, lambda t: t.calls):.0f}"),
        (
            "bench control thread per window (not counted)",
            lambda p: f"{thread_ms(p.hooked, 'control'):.2f}",
        ),
        (
            "wall per turn, client ms (turns without hooks)",
            lambda p: f"{mean_of(p.bare, lambda t: t.wall_s) * 1000:.1f}",
        ),
        ("prompt tokens", lambda p: f"{mean_of(p.hooked, lambda t: t.prompt_tokens):,.0f}"),
        ("client body KB", lambda p: f"{mean_of(p.hooked, lambda t: t.body_bytes) / 1024:,.0f}"),
        ("floor: json.loads(body) ms", lambda p: f"{p.loads_floor_ms:.3f}"),
        ("floor: json.dumps(id list) ms", lambda p: f"{p.dumps_floor_ms:.3f}"),
        ("forced full check (1% of turns): check / total ms", forced),
    ]
    return [(label, [value(p) for p in points]) for label, value in table]


def growth(
    points: Sequence[Point], label_rows: list[tuple[str, list[str]]]
) -> dict[int, list[str]]:
    """Per tool size, the largest context's value over the smallest's, for the phase rows."""
    out: dict[int, list[str]] = {}
    for kb in sorted({p.tool_kb for p in points}):
        mine = sorted((p for p in points if p.tool_kb == kb), key=lambda p: p.context)
        if len(mine) < 2:
            continue
        low, high = mine[0], mine[-1]
        cells = []
        for phase in (*PHASES, GC):
            a, b = phase_ms(low.hooked, phase.key), phase_ms(high.hooked, phase.key)
            cells.append(f"{b / a:.1f}x" if a > 0.005 else "-")
        a, b = other_ms(low.hooked), other_ms(high.hooked)
        cells.append(f"{b / a:.1f}x" if a > 0.005 else "-")
        a = mean_ms([t.process_ns for t in low.hooked])
        b = mean_ms([t.process_ns for t in high.hooked])
        cells.append(f"{b / a:.1f}x")
        out[kb] = cells + [""] * (len(label_rows) - len(cells))
    return out


def headers(points: Sequence[Point]) -> list[str]:
    return [f"{short(p.context)} ctx, {p.tool_kb} KB" for p in points]


def render_table(points: Sequence[Point], hook_ns: float, title: str) -> Table:
    table = Table(title=title)
    table.add_column("CPU ms per turn (mean)", justify="left")
    for name in headers(points):
        table.add_column(name, justify="right")
    body = rows(points, hook_ns)
    grown = growth(points, body)
    for kb in grown:
        table.add_column(
            f"x {short(points[-1].context)}/{short(points[0].context)}, {kb} KB", justify="right"
        )
    for index, (label, cells) in enumerate(body):
        extra = [grown[kb][index] for kb in grown]
        table.add_row(label.replace("**", ""), *[c.replace("**", "") for c in cells], *extra)
    return table


def markdown_table(points: Sequence[Point], hook_ns: float) -> str:
    body = rows(points, hook_ns)
    grown = growth(points, body)
    names = ["CPU ms per turn (mean)", *headers(points)]
    names += [f"x {short(points[-1].context)}/{short(points[0].context)}, {kb} KB" for kb in grown]
    lines = ["| " + " | ".join(names) + " |", "|" + "---|" * len(names)]
    for index, (label, cells) in enumerate(body):
        extra = [grown[kb][index] for kb in grown]
        lines.append("| " + " | ".join([label, *cells, *extra]) + " |")
    return "\n".join(lines) + "\n"


# -- the before/after table (--baseline) -------------------------------------------------------

COMPARED: tuple[tuple[str, str], ...] = (
    ("decode", "JSON decode"),
    ("parse", "parse"),
    ("route", "route"),
    ("ids", "prompt ids"),
    ("build", "request build"),
    ("idcheck", "id check"),
    ("encode", "ids JSON"),
    (GC.key, "GC"),
)
"""The phases that grew with the context before the ids' JSON was reused (key, column)."""
COMPARED_HEADERS = (
    "total mean",
    "total p50",
    "tokenize",
    "total - tokenize, mean",
    "total - tokenize, p50",
    *(name for _, name in COMPARED),
    "other",
)


def p50_ms(turns: Sequence[Measured]) -> float:
    return statistics.median(t.process_ns for t in turns) / 1e6 if turns else float("nan")


def untokenized_ms(p: Point) -> list[float]:
    """Per hooked turn, ms: its total less its tokenizing phase and its hooks' calibrated cost
    (within one turn: the tokenizer's turn-to-turn noise, large with 32 KB results, cancels)."""
    return [
        (t.process_ns - t.phases.get("tokenize", 0) - t.calls * p.hook_ns) / 1e6 for t in p.hooked
    ]


def compared(p: Point) -> list[float]:
    """A point's before/after cells, ms: the total (mean, p50) of the turns without hooks, the
    tokenizing phase, the total less it (:func:`untokenized_ms`: mean, p50), the
    :data:`COMPARED` phases and "other" (hooked turns' total less every phase)."""
    total, tokenize = total_ms(p.bare), phase_ms(p.hooked, "tokenize")
    rest = untokenized_ms(p)
    rest_mean = statistics.fmean(rest) if rest else float("nan")
    rest_p50 = statistics.median(rest) if rest else float("nan")
    phases = [phase_ms(p.hooked, key) for key, _ in COMPARED]
    return [total, p50_ms(p.bare), tokenize, rest_mean, rest_p50, *phases, other_ms(p.hooked)]


def ms(value: float) -> str:
    """Three significant figures, about (a tenth of a ms above 10 ms)."""
    digits = 1 if abs(value) >= 10 else 2 if abs(value) >= 1 else 3
    return f"{value:.{digits}f}"


def ratio(current: float, baseline: float) -> str:
    if baseline < 0.005:
        return "-"
    value = current / baseline
    return f"{value:.2f}x" if value >= 0.01 else "<0.01x"


def comparison(
    pairs: Sequence[tuple[Point, Point]], names: tuple[str, str]
) -> tuple[list[str], list[list[str]]]:
    """The before/after table's header and rows: per point, the baseline, the current adapter,
    and current / baseline per column (``names``: how the two adapters are called)."""
    header = ["point", "adapter", *COMPARED_HEADERS, "floor: json.loads(body)"]
    lines: list[list[str]] = []
    for before, after in pairs:
        b, a = compared(before), compared(after)
        tokens = mean_of(after.hooked, lambda t: t.prompt_tokens)
        where = f"{short(after.context)} ctx, {after.tool_kb} KB ({tokens:,.0f} tokens)"
        lines.append([where, names[0], *map(ms, b), ms(before.loads_floor_ms)])
        lines.append(["", names[1], *map(ms, a), ms(after.loads_floor_ms)])
        lines.append(["", "current / baseline", *map(ratio, a, b), ""])
    return header, lines


def comparison_table(header: list[str], lines: list[list[str]], title: str) -> Table:
    table = Table(title=title)
    for index, name in enumerate(header):
        table.add_column(name, justify="left" if index < 2 else "right")
    for number, line in enumerate(lines):
        table.add_row(*line, end_section=number % 3 == 2)
    return table


def comparison_markdown(header: list[str], lines: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(line) + " |" for line in lines]
    return "\n".join(out) + "\n"


# -- the tokenizing table: the adapter against the Rust tokenizer -------------------------------


@dataclass
class Tokenized:
    """The :data:`VARIANTS` measured on the new text of one turn (the adapter's answer)."""

    adapter: str
    tool_kb: int
    context: int
    answer: dict[str, Any]
    load_average: float
    problems: list[str]


async def tokenize_point(
    session: Session, lane: Lane, result: str, rounds: int, console: Console
) -> Tokenized | None:
    """One more sibling turn at the session's last context (without hooks, tool result
    ``result``), the text its :data:`ENCODE_CALLS` call encoded and its spans captured in the
    adapter; then the :data:`VARIANTS` on that text, measured in the adapter's process (idle
    meanwhile: no turn in flight)."""
    started = await asyncio.to_thread(lane.adapter.ask, cmd="capture")
    if "error" in started:
        console.print(f"[yellow]  tokenizing not measured: {started['error']}[/]")
        return None
    measured, _ = await measured_turn(session, lane, result, hooks=False)
    load = os.getloadavg()[0]
    answer = await asyncio.to_thread(lane.adapter.ask, cmd="tokenize", rounds=rounds)
    problems = list(measured.problems)
    if "error" in answer:
        problems.append(f"tokenizing not measured: {answer['error']}")
    kb = session.tool_bytes // 1024
    return Tokenized(lane.name, kb, session.context, answer, load, problems)


def median_ci(values: Sequence[float]) -> tuple[float, float, float]:
    """The median and a distribution-free ~95% confidence interval of it: the order statistics
    ``n/2 -/+ 0.98 sqrt(n)``."""
    ordered = sorted(values)
    n = len(ordered)
    half = 0.98 * math.sqrt(n)
    low = ordered[max(0, math.floor(n / 2 - half))]
    high = ordered[min(n - 1, math.ceil(n / 2 + half))]
    return statistics.median(ordered), low, high


def paired_ms(answer: dict[str, Any], series: str, minuend: str, subtrahend: str) -> list[float]:
    """Per round, ``minuend``'s call less ``subtrahend``'s (the same round: the same load), ms."""
    pairs = zip(answer[series][minuend], answer[series][subtrahend], strict=True)
    return [(a - b) / 1e6 for a, b in pairs]


def with_ci(found: tuple[float, float, float], sign: str = "+") -> str:
    median, low, high = found
    return f"{median:{sign}.3f} [{low:{sign}.3f}, {high:{sign}.3f}]"


def judged(found: tuple[float, float, float]) -> str:
    """Under the limit when the confidence interval's top is, over when its bottom is."""
    _, low, high = found
    if high < OVERHEAD_LIMIT_MS:
        return "under"
    if low > OVERHEAD_LIMIT_MS:
        return "OVER"
    return "unresolved"


def outside_ms(answer: dict[str, Any], key: str) -> list[float]:
    """Per call of ``key``, its CPU outside the tokenizer's encode calls (for a hop: outside
    the hopped call), ms."""
    pairs = zip(answer["cpu"][key], answer["inside"][key], strict=True)
    return [(cpu - inside) / 1e6 for cpu, inside in pairs]


def outside_diff(answer: dict[str, Any], minuend: str, subtrahend: str) -> list[float]:
    """Per round, ``minuend``'s CPU outside the encode calls less ``subtrahend``'s, ms ("d"
    stands for its timed twin "p")."""
    first = outside_ms(answer, "p" if minuend == "d" else minuend)
    second = outside_ms(answer, subtrahend)
    return [x - y for x, y in zip(first, second, strict=True)]


def cut_ms(answer: dict[str, Any]) -> list[float]:
    """Per call of (f), its ``segment_ids`` CPU, ms."""
    return [spent / 1e6 for spent in answer["cut"]["f"]]


def own_ms(answer: dict[str, Any]) -> list[float]:
    """Per round, (d)-(a) outside the encode calls plus (f): all the adapter does around the
    Rust call to get a turn's segments, ms."""
    return [d + f for d, f in zip(outside_diff(answer, "d", "a"), cut_ms(answer), strict=True)]


def direct_overheads(answer: dict[str, Any]) -> list[tuple[str, tuple[float, float, float]]]:
    """The judged overheads, measured directly: (d)-(a) and (d)-(c) outside the tokenizer's
    encode calls, (e)-(d) as (e)'s CPU less that of the (d) inside it, and (d)-(a)+(f)."""
    found = []
    for minuend, subtrahend in OVERHEADS:
        if minuend == "d":
            values = outside_diff(answer, minuend, subtrahend)
        else:
            values = outside_ms(answer, "e")
        found.append((f"({minuend})-({subtrahend})", median_ci(values)))
    found.append(("(d)-(a)+(f)", median_ci(own_ms(answer))))
    return found


def tokenize_rows(points: Sequence[Tokenized]) -> list[tuple[str, list[str]]]:
    """The tokenizing table's rows, a cell per tool-result size: medians of each variant's calls
    (CPU ms), the overheads (medians of per-round differences, ~95% CI), the same measured
    directly, the hops for reference, and the verdict (from the direct measurements)."""
    labels = dict(VARIANTS)
    Cell = Callable[[dict[str, Any]], str]

    def median(key: str, series: str = "cpu") -> Cell:
        return lambda a: f"{statistics.median(a[series][key]) / 1e6:.3f}"

    def gc_cell(a: dict[str, Any]) -> str:
        spent = a["gc"]["p"]
        return f"{statistics.median(spent) / 1e6:.3f} / {statistics.fmean(spent) / 1e6:.3f}"

    def paired(minuend: str, subtrahend: str, series: str = "cpu") -> Cell:
        return lambda a: with_ci(median_ci(paired_ms(a, series, minuend, subtrahend)))

    def off_thread(a: dict[str, Any]) -> str:
        pairs = zip(a["cpu"]["d"], a["caller"]["d"], strict=True)
        return f"{statistics.median(process - thread for process, thread in pairs) / 1e6:.3f}"

    def direct(minuend: str, subtrahend: str) -> Cell:
        return lambda a: with_ci(median_ci(outside_diff(a, minuend, subtrahend)))

    def hop(key: str, series: str = "cpu") -> Cell:
        def cell(a: dict[str, Any]) -> str:
            inner = "inside" if series == "cpu" else "inside_wall"
            pairs = zip(a[series][key], a[inner][key], strict=True)
            return with_ci(median_ci([(outer - inside) / 1e6 for outer, inside in pairs]), "")

        return cell

    def sleeping(a: dict[str, Any]) -> str:
        return f"{hop('s')(a)}, {a['sleep_ms']:.1f} ms asleep"

    def verdict(a: dict[str, Any]) -> str:
        return ", ".join(f"{name} {judged(found)}" for name, found in direct_overheads(a))

    table: list[tuple[str, Cell]] = [
        (
            "new text: characters / tokens / pieces",
            lambda a: f"{a['chars']:,} / {a['tokens']:,} / {a['pieces']}",
        ),
        *((f"{labels[key]}: CPU", median(key)) for key in "abcde"),
        (f"{labels['e']}: loop-side wall", median("e", "wall")),
        ("(d): CPU off its thread (the tokenizer's own threads)", off_thread),
        ("(b)-(a): CPU [~95% CI]", paired("b", "a")),
        *((f"({m})-({s}): CPU [~95% CI]", paired(m, s)) for m, s in OVERHEADS),
        ("(e)-(d): wall [~95% CI]", paired("e", "d", "wall")),
        ("direct, outside the encode calls: (d)-(a), CPU", direct("d", "a")),
        ("direct, outside the encode calls: (d)-(c), CPU", direct("d", "c")),
        ("direct, outside the encode calls: (c)-(b), the lists, CPU", direct("c", "b")),
        ("direct, outside the encode calls: (b)-(a), CPU", direct("b", "a")),
        (f"{labels['f']}: CPU", lambda a: with_ci(median_ci(cut_ms(a)), "")),
        (
            "direct: (d)-(a) + (f), the adapter's own around the Rust call, CPU",
            lambda a: with_ci(median_ci(own_ms(a))),
        ),
        ("(d): in its .ids getter, CPU", median("p", "ids")),
        ("(d): in its .offsets getter (collections included), CPU", median("p", "offsets")),
        ("(d): in garbage collections, CPU, median / mean", gc_cell),
        ("direct: (e)-(d), (e) less the (d) inside it, CPU", hop("e")),
        ("direct: (e)-(d), (e) less the (d) inside it, wall", hop("e", "wall")),
        (f"{labels['h']}: CPU", hop("h")),
        (f"{labels['s']}: CPU", sleeping),
        (f"verdict (direct, CI against {OVERHEAD_LIMIT_MS} ms)", verdict),
        (f"reference: {labels['m']}, CPU", median("m")),
    ]
    answers = [p.answer for p in points if "error" not in p.answer]
    return [(label, [value(a) for a in answers]) for label, value in table]


def tokenize_headers(points: Sequence[Tokenized]) -> list[str]:
    kept = [p for p in points if "error" not in p.answer]
    lanes = {p.adapter for p in kept}
    return [
        "ms per call (median)",
        *(
            f"{p.tool_kb} KB tool result" + (f", {p.adapter}" if len(lanes) > 1 else "")
            for p in kept
        ),
    ]


def tokenize_table(points: Sequence[Tokenized]) -> Table:
    rounds = min((len(p.answer["cpu"]["a"]) for p in points if "cpu" in p.answer), default=0)
    table = Table(
        title=(
            "Tokenizing a turn's new text (the text of the bridge's encode_with_starts call, "
            "before encode_with_offsets, and its spans, "
            f"captured in the adapter): median of {rounds} calls each, interleaved, in the idle "
            "adapter process; CPU: the process's (every thread); (a)-(d) on the worker thread "
            "(e) hops to; overheads: medians of per-round differences [~95% CI]"
        )
    )
    for index, name in enumerate(tokenize_headers(points)):
        table.add_column(name, justify="left" if index == 0 else "right")
    for label, cells in tokenize_rows(points):
        table.add_row(label, *cells)
    return table


def tokenize_markdown(points: Sequence[Tokenized]) -> str:
    names = tokenize_headers(points)
    lines = ["| " + " | ".join(names) + " |", "|" + "---|" * len(names)]
    lines += ["| " + " | ".join([label, *cells]) + " |" for label, cells in tokenize_rows(points)]
    return "\n".join(lines) + "\n"


def tokenize_notes(points: Sequence[Tokenized]) -> list[str]:
    """Per tool-result size: where and how the adapter encoded the text, and the load."""
    notes = []
    for p in points:
        answer = p.answer
        if "error" in answer:
            continue
        arguments = ", ".join(f"{k}={v:,}" for k, v in answer["kwargs"].items()) or "no limit"
        notes.append(
            f"{p.tool_kb} KB results, {p.adapter} (at {short(p.context)} ctx): the turn's "
            f"{answer['method']} ran on thread {answer['thread']!r} ({arguments}), its "
            f"segment_ids cut at {answer['spans']} span ends; measured at load average "
            f"{p.load_average:.2f}"
        )
    return notes


# -- the run ------------------------------------------------------------------------------------


def report_hooks(console: Console, name: str, resolved: dict[str, Any]) -> None:
    """What the hook table found in one adapter: a phase none of whose names it has is in
    "other" (a name that is only another era's, while a sibling name is found, is expected)."""
    found: dict[str, int] = resolved["found"]
    hits = sum(1 for n in found.values() if n)
    console.print(
        f"{name}: hooks {hits} of {len(found)} names found, a hooked call costs "
        f"{resolved['hook_ns']:.0f} ns of thread CPU"
    )
    for phase in PHASES:
        if not any(found.get(spec) for spec in phase.hooks):
            console.print(f"[yellow]  {phase.key}: no hook found (its CPU is in 'other')[/]")
    absent = [spec.split(":")[1] for spec, n in found.items() if not n]
    if absent:
        console.print(f"  names not in this adapter: {', '.join(absent)}", highlight=False)


def turn_double(cache_dir: Path) -> Any:
    """The SGLang-wire engine double of every measured turn: it answers at once with
    ``TURN_REPLY``, one token per streamed chunk (SGLang's default stream interval)."""
    from protocol_adapters import QwenTokenizerConfig, load_qwen3_vocabulary
    from protocol_adapters.testing import EngineDouble
    from protocol_adapters.testing.stack import VocabularyTokenizer

    vocabulary = load_qwen3_vocabulary(QwenTokenizerConfig(cache_dir))
    return EngineDouble(
        VocabularyTokenizer(vocabulary),
        lambda _ids: TURN_REPLY,
        incremental_streaming=True,
        tokens_per_chunk=1,
        context_length=CONTEXT_TOKENS,
    )


async def bench(args: argparse.Namespace, console: Console) -> int:
    double = turn_double(args.cache_dir)
    lines = source_lines()
    reply_tokens = len(double.reply_ids(TURN_REPLY))
    console.print(
        f"the double's reply: {reply_tokens} tokens, one streamed chunk each (the engine stream, "
        "reply parsing and client SSE phases grow with it, not with the context)"
    )
    sources: dict[str, Path | None] = {"current": args.adapter_src}
    if args.baseline is not None:
        sources = {"baseline": args.baseline, **sources}  # the baseline's lane goes first
    points: list[Point] = []
    tokenized: list[Tokenized] = []
    resolved: dict[str, dict[str, Any]] = {}
    async with double:
        adapters = {name: Adapter(double.url, args.cache_dir, src) for name, src in sources.items()}
        try:
            started = dict(
                zip(
                    adapters,
                    await asyncio.gather(
                        *(asyncio.to_thread(a.wait_started) for a in adapters.values())
                    ),
                    strict=True,
                )
            )
            for name, info in started.items():
                console.print(
                    f"{name} adapter: pid {info['pid']}, protocol_adapters from {info['source']}; "
                    f"paid once before measuring: the vocabulary's longest token "
                    f"({info['once_ms']:.0f} ms, else charged to the first turn with a text over "
                    "32,768 characters)",
                    highlight=False,
                )
                src = sources[name]
                if src is not None and not Path(info["source"]).is_relative_to(src.resolve()):
                    raise RuntimeError(f"the {name} adapter did not import from {src}")
            if len({info["source"] for info in started.values()}) < len(started):
                raise RuntimeError("the baseline and the current adapter import the same source")
            timeout = aiohttp.ClientTimeout(total=600)
            async with aiohttp.ClientSession(timeout=timeout) as http:
                for seed, kb in enumerate(args.tool_kb):
                    lanes = []
                    for name, adapter in adapters.items():
                        answer = await asyncio.to_thread(
                            adapter.ask, cmd="open", name=f"profile-{kb}"
                        )
                        url = started[name]["url"]
                        first = {
                            "role": "user",
                            "content": "The tests in tests/test_parser.py fail. Find why, fix it.",
                        }
                        lanes.append(Lane(name, adapter, url, answer["token"], [first]))
                    session = Session(http, lanes, double, kb * 1024, lines, seed)
                    await session.grow()  # every module of a turn's path is loaded now
                    for lane in lanes:
                        if lane.name not in resolved:
                            answer = await asyncio.to_thread(lane.adapter.ask, cmd="resolve")
                            resolved[lane.name] = answer
                            report_hooks(console, lane.name, answer)
                    for context in args.contexts:
                        measured = await measure_point(session, context, args.turns, console)
                        for point in measured.values():
                            point.hook_ns = resolved[point.adapter]["hook_ns"]
                            points.append(point)
                    current = lanes[-1]
                    if args.tokenize_calls:
                        result = session.tool_result()
                        for lane in lanes:
                            found = await tokenize_point(
                                session, lane, result, args.tokenize_calls, console
                            )
                            if found is not None:
                                tokenized.append(found)
                    for _ in range(args.cprofile):  # at the last context, kept out of the table
                        result = session.tool_result()
                        await measured_turn(session, current, result, hooks=False, cprofile=True)
                if args.cprofile:
                    profile = await asyncio.to_thread(
                        adapters["current"].ask, cmd="cprofile", top=30
                    )
        finally:
            for adapter in adapters.values():
                await asyncio.to_thread(adapter.stop)
    points.sort(key=lambda p: (p.tool_kb, p.context))
    mine = [p for p in points if p.adapter == "current"]
    hook_ns = resolved["current"]["hook_ns"]
    title = (
        f"Adapter CPU per streamed Anthropic turn, by phase: mean of {args.turns} hooked turns "
        f"(and {args.turns} without hooks) per column"
    )
    if args.baseline is not None:
        title += " (the current adapter)"
    console.print(render_table(mine, hook_ns, title))
    markdown = markdown_table(mine, hook_ns)
    if tokenized:
        console.print(tokenize_table(tokenized))
        notes = tokenize_notes(tokenized)
        for note in notes:
            console.print(note, highlight=False)
        markdown += "\n" + tokenize_markdown(tokenized)
        markdown += "\n" + "".join(f"- {note}\n" for note in notes)
    if args.baseline is not None:
        before = [p for p in points if p.adapter == "baseline"]
        pairs = list(zip(before, mine, strict=True))
        header, table_lines = comparison(pairs, ("baseline", "current"))
        console.print(
            comparison_table(
                header,
                table_lines,
                f"Before / after: adapter CPU ms per turn, {args.turns} turns without hooks "
                f"(total) and {args.turns} with (phases) per adapter and point, alternated; "
                "'total - tokenize': a hooked turn's total less its tokenizing and its hooks' "
                "calibrated cost; 'other': what no phase holds",
            )
        )
        markdown += "\n" + comparison_markdown(header, table_lines)
        loads = ", ".join(f"{short(p.context)}/{p.tool_kb} KB {p.load_average:.2f}" for p in mine)
        console.print(f"load average as each point began: {loads}")
    if args.cprofile:
        console.print(
            f"[bold]event loop thread under cProfile[/], {args.cprofile} turns without hooks at "
            "the largest context of each session (cProfile's cost per call inflates "
            "Python-heavy functions: for locating 'other', not for its size)"
        )
        console.print(profile["text"], markup=False, highlight=False)
    if args.markdown is not None:
        args.markdown.write_text(markdown)
        console.print(f"markdown table(s) written to {args.markdown}")
    problems = [
        f"{p.adapter} {short(p.context)} / {p.tool_kb} KB: {problem}"
        for p in points
        for t in [*p.hooked, *p.bare, *([p.forced] if p.forced else [])]
        for problem in t.problems
    ]
    problems += [
        f"tokenizing, {p.tool_kb} KB: {problem}" for p in tokenized for problem in p.problems
    ]
    for problem in problems[:20]:
        console.print(f"[red]{problem}[/]")
    return 1 if problems else 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="8k and 32k, 3 turns: a smoke run")
    parser.add_argument(
        "--contexts",
        type=lambda s: [int(x) for x in s.split(",")],
        help="prompt tokens to measure at, comma-separated (default 8000,32000,128000)",
    )
    parser.add_argument(
        "--tool-kb",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[4, 32],
        help="tool result sizes in KB, comma-separated (one session each)",
    )
    parser.add_argument("--turns", type=int, help="hooked turns per point (as many without)")
    parser.add_argument("--markdown", type=Path, help="also write the table as Markdown here")
    parser.add_argument(
        "--tokenize-calls",
        type=int,
        metavar="N",
        help="calls per variant in the tokenizing table (default 100, 50 with --quick; 0: none)",
    )
    parser.add_argument(
        "--cprofile",
        type=int,
        default=0,
        metavar="TURNS",
        help="then profile the event loop thread over TURNS more turns per session (top 30)",
    )
    parser.add_argument(
        "--adapter-src",
        type=Path,
        help="another checkout's packages/protocol-adapters/src, as the current adapter",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        metavar="SRC",
        help="also run this checkout's packages/protocol-adapters/src, turn for turn with the "
        "current adapter, and print a before/after table",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "protocol-adapters-bench",
        help="where the converted Qwen3 tokenizer is cached",
    )
    parser.add_argument("--serve-adapter", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_adapter is not None:
        serve_adapter(*args.serve_adapter)
        return 0
    if args.contexts is None:
        args.contexts = [8000, 32000] if args.quick else [8000, 32000, 128000]
    if args.turns is None:
        args.turns = 3 if args.quick else 20
    if args.tokenize_calls is None:
        args.tokenize_calls = 50 if args.quick else 100
    console = Console(width=220)
    console.print(
        f"[bold]turn_profile[/] {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}, "
        f"Python {sys.version.split()[0]}; contexts {args.contexts}, tool results "
        f"{args.tool_kb} KB, {args.turns} turns with hooks and {args.turns} without per point"
    )
    began = time.perf_counter()
    status = asyncio.run(bench(args, console))
    console.print(
        f"{time.perf_counter() - began:.0f} s, load average {os.getloadavg()[0]:.2f} at the end"
    )
    return status


if __name__ == "__main__":
    sys.exit(main())
