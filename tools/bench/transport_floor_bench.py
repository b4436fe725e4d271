"""The floor under an adapter turn: what an aiohttp server relaying a streamed Anthropic turn to
SGLang's ``/generate`` costs when it does nothing else, beside the real adapter, in one run.

    uv run tools/bench/transport_floor_bench.py            # 8k and 128k, 4 KB results (~1 min)
    uv run tools/bench/transport_floor_bench.py --contexts 8000 --tool-kb 4 32 --turns 40

The design fixes the adapter's stack (an aiohttp server, CPython); this bench measures what that
stack costs per turn before any of the adapter's own work, so each of the adapter's CPU targets
can be read against it. Three processes, as in turn_profile.py (whose session, adapter process
and stream reader this bench reuses): the real adapter (Anthropic dialect, bridge renderer, real
Qwen3 tokenizer, SGLang client), the **relay**, and this process (the raw aiohttp client and the
SGLang-wire engine double, answering at once, one token per streamed chunk, the same 46-token
reply for both).

The relay is the least any adapter in front of SGLang does for one streamed Anthropic turn, on
the same stack: read the client's body and decode its JSON (every adapter must read what it is
sent), tokenize the new tool result with the same Rust tokenizer call the adapter makes
(``encode_batch_fast``, on a worker thread, as the adapter does; timed apart, so the floor is
shown with and without it), POST ``/generate`` with the prompt's ids (the same ids the adapter
sent at that point, their JSON written once before the turns, so this costs only the copy into
the body), read the engine's SSE stream with aiohttp (``readany``, events split in one C call per
read) and decode each event's JSON, write one Anthropic ``content_block_delta`` per event (all
the events one read held in one write) and the framing events around them, and end the
response. It validates nothing, renders nothing and records nothing: it is not an adapter, it is
what an adapter cannot avoid.

The session grows against the adapter (its replies carry the adapter's tool-use ids and thinking
signatures); at each point the measured turns are siblings (the same history plus a new tool
result), sent to the adapter and to the relay alternately (the first alternates too), so both see
the same load. CPU per turn is each server process's CPU over a window around the turn (every
thread; less the control thread that answers the bench), opened before the request and closed
``SETTLE_S`` after its last byte.

Before the sessions, ``--first-turns`` new sessions' first turns (system prompt, tools, one user
message; the adapter renders the whole prompt), alternated the same way: what each episode of a
batch that starts together costs first, and so how long such a burst keeps the cores busy.

The verdicts printed at the end read the adapter's targets against the floor: CPU per turn
beyond tokenizing <= 1 ms (the relay's own, without tokenizing, is what no adapter on this stack
goes under), >= 500 turns/s per process on one core with a 4 KB result (1000 / the relay's CPU
per turn with tokenizing is the most any process on this stack reaches).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from rich.console import Console
from rich.table import Table
from turn_profile import (
    SETTLE_S,
    TURN_REPLY,
    Adapter,
    Lane,
    Session,
    measured_turn,
    source_lines,
    turn_double,
)

HERE = Path(__file__).resolve().parent
TOKENIZER_CACHE = Path(tempfile.gettempdir()) / "protocol-adapters-bench"
"""turn_profile.py's cache of the converted Qwen3 tokenizer."""
_SSE = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
_JSON = {"Content-Type": "application/json"}
HTTP = web.AppKey("http", aiohttp.ClientSession)


# -- the relay: its own process ---------------------------------------------------------------


def _event(kind: str, payload: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(payload)}\n\n".encode()


def _fields() -> bytes:
    """Everything of the ``/generate`` body but the ids, as the adapter sends it."""
    body = {
        "rid": "relay",
        "sampling_params": {
            "max_new_tokens": 4096,
            "temperature": 1.0,
            "top_p": 1.0,
            "top_k": -1,
            "min_p": 0.0,
            "skip_special_tokens": False,
            "spaces_between_special_tokens": False,
            "no_stop_trim": True,
        },
        "return_logprob": True,
        "logprob_start_len": -1,
        "stream": True,
    }
    return json.dumps(body, separators=(",", ":")).encode()


def serve_relay(engine_url: str, cache_dir: str) -> None:
    """The relay, in this process: print its URL, then answer the bench's commands on stdin
    (``ids``: the ids to send from now on; ``begin`` / ``end``: a CPU window) until ``stop``."""
    from protocol_adapters import QwenTokenizerConfig, load_qwen3_vocabulary

    tokenizer = load_qwen3_vocabulary(QwenTokenizerConfig(Path(cache_dir))).tokenizer
    fields = _fields()
    state: dict[str, Any] = {"ids": b"1", "tokenize_ns": 0}
    pool = ThreadPoolExecutor(1, thread_name_prefix="relay-worker")

    def tokenize(text: str) -> int:
        began = time.thread_time_ns()
        (encoding,) = tokenizer.encode_batch_fast([text], add_special_tokens=False)
        count = len(encoding.ids)
        state["tokenize_ns"] += time.thread_time_ns() - began
        return count

    async def turn(request: web.Request) -> web.StreamResponse:
        body = json.loads(await request.read())
        last = body["messages"][-1]["content"]
        new_text = last if isinstance(last, str) else last[-1].get("content", "")
        await asyncio.get_running_loop().run_in_executor(pool, tokenize, new_text)
        payload = b'{"input_ids":[' + state["ids"] + b"]," + fields[1:]
        response = web.StreamResponse(headers=_SSE)
        await response.prepare(request)
        message = {"id": "msg_relay", "type": "message", "role": "assistant", "content": []}
        await response.write(_event("message_start", {"type": "message_start", "message": message}))
        start = {"type": "text", "text": ""}
        await response.write(
            _event(
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": start},
            )
        )
        async with request.app[HTTP].post(
            f"{engine_url}/generate", data=payload, headers=_JSON
        ) as engine:
            pending, done = b"", False
            while not done:
                data = await engine.content.readany()
                if not data:
                    break
                *events, pending = (pending + data).split(b"\n\n")
                out = []
                for event in events:
                    if not event.startswith(b"data: "):
                        continue
                    if event[6:] == b"[DONE]":
                        done = True
                        break
                    delta = {"type": "text_delta", "text": json.loads(event[6:])["text"]}
                    out.append(
                        _event(
                            "content_block_delta",
                            {"type": "content_block_delta", "index": 0, "delta": delta},
                        )
                    )
                if out:  # what one read held, written at once
                    await response.write(b"".join(out))
        await response.write(
            _event("content_block_stop", {"type": "content_block_stop", "index": 0})
        )
        await response.write(_event("message_stop", {"type": "message_stop"}))
        await response.write_eof()
        return response

    async def serve() -> None:
        http = aiohttp.ClientSession()
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app[HTTP] = http
        app.router.add_post("/v1/messages", turn)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        loop = asyncio.get_running_loop()
        stopped = asyncio.Event()
        await loop.run_in_executor(pool, tokenize, "warm")

        def control() -> None:
            window = (0, 0)
            for line in sys.stdin:
                command = json.loads(line)
                cmd = command["cmd"]
                if cmd == "ids":
                    ids = json.dumps(command["ids"], separators=(",", ":"))[1:-1]
                    state["ids"] = ids.encode()
                    answer: dict[str, Any] = {"ok": True}
                elif cmd == "begin":
                    state["tokenize_ns"] = 0
                    window = (time.process_time_ns(), time.thread_time_ns())
                    answer = {"ok": True}
                elif cmd == "end":
                    own = time.thread_time_ns() - window[1]
                    total = time.process_time_ns() - window[0] - own
                    answer = {"process": total, "tokenize": state["tokenize_ns"]}
                else:
                    answer = {"ok": True}
                sys.stdout.write(json.dumps(answer) + "\n")
                sys.stdout.flush()
                if cmd == "stop":
                    break
            loop.call_soon_threadsafe(stopped.set)

        threading.Thread(target=control, name="bench-control", daemon=True).start()
        print(json.dumps({"url": f"http://127.0.0.1:{port}", "pid": os.getpid()}), flush=True)
        await stopped.wait()
        await http.close()
        await runner.cleanup()
        pool.shutdown()

    asyncio.run(serve())


class Relay(Adapter):
    """The relay's process: the turn_profile adapter's command line, pointed at this file."""

    def __init__(self, engine_url: str, cache_dir: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--serve-relay", engine_url, str(cache_dir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.started = {}
        self._lock = threading.Lock()


# -- the bench's side ---------------------------------------------------------------------------


@dataclass
class Point:
    tool_kb: int
    context: int
    """Prompt tokens to measure at; 0: a new session's first turn."""
    tokens: list[int] = field(default_factory=list)
    adapter_ms: list[float] = field(default_factory=list)
    relay_ms: list[float] = field(default_factory=list)
    relay_tokenize_ms: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


async def relay_turn(
    session: Session, relay: Lane, adapter: Lane, result: str
) -> tuple[float, float]:
    """One sibling turn of the adapter's history, sent to the relay; its CPU ms and the
    tokenizer's share of it."""
    body = session.body(session.with_result(adapter, result))
    await asyncio.to_thread(relay.adapter.ask, cmd="begin")
    await session.send(relay, body)
    await asyncio.sleep(SETTLE_S)
    window = await asyncio.to_thread(relay.adapter.ask, cmd="end")
    return float(window["process"]) / 1e6, float(window["tokenize"]) / 1e6


async def measure(session: Session, adapter: Lane, relay: Lane, point: Point, turns: int) -> None:
    await asyncio.to_thread(relay.adapter.ask, cmd="ids", ids=list(adapter.last_ids))
    result = session.tool_result()
    await measured_turn(session, adapter, result, hooks=False)  # warm-up, both sides
    await relay_turn(session, relay, adapter, result)
    for index in range(turns):
        result = session.tool_result()
        order = ("adapter", "relay") if index % 2 == 0 else ("relay", "adapter")
        for side in order:
            if side == "adapter":
                measured, _ = await measured_turn(session, adapter, result, hooks=False)
                point.adapter_ms.append(measured.process_ns / 1e6)
                point.tokens.append(measured.prompt_tokens)
                point.problems.extend(measured.problems)
            else:
                total, tokenize = await relay_turn(session, relay, adapter, result)
                point.relay_ms.append(total)
                point.relay_tokenize_ms.append(tokenize)


async def first_turns(
    session: Session, adapter: Lane, relay: Lane, point: Point, turns: int
) -> None:
    """A new session's first turn (system prompt, tools, one user message), ``turns`` times on
    each side, alternated: what each of a batch of episodes starting together costs first (the
    adapter renders the whole prompt)."""
    for index in range(turns + 1):  # the first pair warms up, and gives the relay its ids
        task = {"role": "user", "content": f"Task {index}: the tests fail. Find why, fix it."}
        body = session.body([task])
        opened = await asyncio.to_thread(adapter.adapter.ask, cmd="open", name=f"first-{index}")
        fresh = Lane(adapter.name, adapter.adapter, adapter.url, opened["token"], [task])
        for lane in (fresh, relay) if index % 2 == 0 else (relay, fresh):
            if lane is relay and not index:
                await asyncio.to_thread(relay.adapter.ask, cmd="ids", ids=list(fresh.last_ids))
            await asyncio.to_thread(lane.adapter.ask, cmd="begin", hooks=False)
            _, _, tokens = await session.send(lane, body)
            await asyncio.sleep(SETTLE_S)
            window = await asyncio.to_thread(lane.adapter.ask, cmd="end")
            if not index:
                continue
            if lane is relay:
                point.relay_ms.append(float(window["process"]) / 1e6)
                point.relay_tokenize_ms.append(float(window["tokenize"]) / 1e6)
            else:
                point.adapter_ms.append(float(window["process"]) / 1e6)
                point.tokens.append(tokens)


def label(p: Point) -> str:
    return f"{p.context // 1000}k ctx, {p.tool_kb} KB" if p.context else "first turn"


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def table(points: Sequence[Point]) -> tuple[Table, str]:
    header = [
        "point",
        "adapter CPU ms/turn",
        "relay CPU ms/turn",
        "relay: tokenizing",
        "relay without tokenizing (the floor)",
        "adapter / relay",
        "turns/s of one core: adapter",
        "turns/s of one core: relay",
    ]
    rows = []
    for p in points:
        adapter, relay, tok = median(p.adapter_ms), median(p.relay_ms), median(p.relay_tokenize_ms)
        rows.append(
            [
                f"{label(p)} ({median(p.tokens):,.0f} tokens)",
                f"{adapter:.2f}",
                f"{relay:.2f}",
                f"{tok:.2f}",
                f"{relay - tok:.2f}",
                f"{adapter / relay:.1f}x",
                f"{1000 / adapter:.0f}",
                f"{1000 / relay:.0f}",
            ]
        )
    rich = Table(title="CPU per streamed Anthropic turn, medians (same run, turns alternated)")
    for name in header:
        rich.add_column(name, justify="right")
    for row in rows:
        rich.add_row(*row)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return rich, "\n".join(lines)


async def bench(args: argparse.Namespace, console: Console) -> int:
    double = turn_double(args.cache_dir)
    lines = source_lines()
    points: list[Point] = []
    async with double:
        adapter_process = Adapter(double.url, args.cache_dir, None)
        relay_process = Relay(double.url, args.cache_dir)
        try:
            adapter_info, relay_info = await asyncio.gather(
                asyncio.to_thread(adapter_process.wait_started),
                asyncio.to_thread(relay_process.wait_started),
            )
            console.print(
                f"adapter pid {adapter_info['pid']}, relay pid {relay_info['pid']}; the double's "
                f"reply: {len(double.reply_ids(TURN_REPLY))} tokens, one chunk each; load "
                f"{os.getloadavg()[0]:.1f}",
                highlight=False,
            )
            timeout = aiohttp.ClientTimeout(total=600)
            async with aiohttp.ClientSession(timeout=timeout) as http:
                if args.first_turns:
                    relay = Lane("relay", relay_process, relay_info["url"], "relay", [])
                    point = Point(0, 0)
                    base = Session(http, [], double, 0, lines, 0)
                    adapter = Lane("adapter", adapter_process, adapter_info["url"], "", [])
                    await first_turns(base, adapter, relay, point, args.first_turns)
                    points.append(point)
                for seed, kb in enumerate(args.tool_kb):
                    answer = await asyncio.to_thread(
                        adapter_process.ask, cmd="open", name=f"floor-{kb}"
                    )
                    first = {"role": "user", "content": "The tests fail. Find why, fix it."}
                    adapter = Lane(
                        "adapter", adapter_process, adapter_info["url"], answer["token"], [first]
                    )
                    relay = Lane("relay", relay_process, relay_info["url"], "relay", [])
                    session = Session(http, [adapter], double, kb * 1024, lines, seed)
                    await session.grow()
                    if not seed:  # route observed once: a second wrap would count each twice
                        await asyncio.to_thread(adapter_process.ask, cmd="resolve")
                    for context in args.contexts:
                        while session.context + session.step / 2 < context:
                            await session.grow()
                        point = Point(kb, context)
                        await measure(session, adapter, relay, point, args.turns)
                        points.append(point)
                        console.print(
                            f"{context // 1000}k, {kb} KB: adapter {median(point.adapter_ms):.2f}"
                            f" ms, relay {median(point.relay_ms):.2f} ms per turn "
                            f"(load {os.getloadavg()[0]:.1f})",
                            highlight=False,
                        )
        finally:
            adapter_process.stop()
            relay_process.stop()
    rich, markdown = table(points)
    console.print(rich)
    print(markdown)
    problems = sorted({problem for p in points for problem in p.problems})
    for problem in problems:
        console.print(f"[red]adapter turn not measured as a bridged continuation:[/] {problem}")
    for p in points:
        if not p.context:
            continue
        floor = median(p.relay_ms) - median(p.relay_tokenize_ms)
        console.print(
            f"{label(p)}: no adapter on this stack goes under "
            f"{floor:.2f} ms per turn beyond tokenizing (target 1 ms: "
            f"{'reachable' if floor <= 1 else 'NOT reachable'}), nor over "
            f"{1000 / median(p.relay_ms):.0f} turns/s of one core (target 500: "
            f"{'reachable' if 1000 / median(p.relay_ms) >= 500 else 'NOT reachable'})",
            highlight=False,
        )
    return 1 if problems else 0


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--serve-relay":
        serve_relay(sys.argv[2], sys.argv[3])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[8000, 128000])
    parser.add_argument("--tool-kb", type=int, nargs="+", default=[4])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument(
        "--first-turns", type=int, default=20, help="new sessions' first turns to measure (0: none)"
    )
    parser.add_argument("--cache-dir", type=Path, default=TOKENIZER_CACHE)
    args = parser.parse_args()
    return asyncio.run(bench(args, Console()))


if __name__ == "__main__":
    sys.exit(main())
