"""The trajectory viewer on a long session: writing the page, and a real browser showing it.

    uv run tools/bench/viewer_bench.py [--turns 200] [--tool-chars 6000] [--runs 3]

A seeded session is recorded the way the adapter records one, with real Qwen3 token ids: a main
agent whose every turn adds a tool result (``--tool-chars`` characters of the Python standard
library's source, ~1,400 tokens) and a reply (a sentence and a tool call), plus a 2-turn
sub-agent every 20 turns. 200 turns make one ~300k-token main sample. The run directory holds
that episode; the page is written with `write_viewer` and opened in headless Chromium (Debian's
`chromium`).

Browser timings are measured inside the page (`performance.now()` around a click, layout forced
before the clock stops), medians of ``--runs`` fresh tabs:

- load: open a tab, load the file, parse the run index and draw the cards (wall clock);
- open episode: parse that episode's JSON block, draw its branch diagram, list its samples;
- first tokens: open the long sample, which renders its first 2,000 tokens (the lazy default);
- all tokens: then render every remaining token of it (what an eager viewer would do up front).

The last two, side by side, are the reason tokens are rendered per sample and per chunk.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

from protocol_adapters import QwenTokenizerConfig, Vocabulary, load_qwen3_vocabulary
from swe_rl.viewer import Chromium, write_viewer
from swe_rl.viewer.chromium import READY, Page
from trajectory_tree import (
    BridgedPrompt,
    Completion,
    FinishReason,
    LossReason,
    Message,
    Prompt,
    Segment,
    SessionTree,
    Text,
    ToolCall,
    TurnMeta,
    dumps,
    linearize,
)

CACHE = Path.home() / ".cache" / "agent-rl" / "bench-tokenizer"


def corpus(rng: random.Random) -> Callable[[int], str]:
    """Chunks of real source text, about `chars` long, from the standard library."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    text = "\n".join(f.read_text(encoding="utf-8", errors="replace") for f in files[:120])

    def chunk(chars: int) -> str:
        start = rng.randrange(len(text) - chars)
        return text[start : start + chars]

    return chunk


def record_session(vocab: Vocabulary, turns: int, tool_chars: int, seed: int) -> SessionTree:
    rng = random.Random(seed)
    chunk = corpus(rng)
    tree = SessionTree(f"bench-{turns}")
    encode = vocab.encode

    def scaffold(role: str) -> list[int]:
        return encode(f"<|im_start|>{role}\n")

    end = encode("<|im_end|>\n")
    generation_prompt = scaffold("assistant")

    def turn(messages: list[Message], number: int, agent: str) -> Message:
        route = tree.route(Prompt(messages))
        segments: list[Segment] = []
        if route.previous_generated is not None:
            segments.append(Segment(LossReason.TEMPLATE_SCAFFOLD, encode("\n")))
        for message in route.new_messages:
            reason = LossReason.TOOL_OUTPUT if message.role == "tool" else LossReason.CONTEXT
            segments += [
                Segment(LossReason.TEMPLATE_SCAFFOLD, scaffold(message.role)),
                Segment(reason, encode(message.plain_text)),
                Segment(LossReason.TEMPLATE_SCAFFOLD, end),
            ]
        command = chunk(60).replace("\n", " ")
        call = ToolCall(f"call-{agent}-{number}", "Bash", json.dumps({"command": command}))
        text = f"Step {number}: " + chunk(200)
        reply = Message("assistant", (Text(text), call))
        body = (
            f'{text}\n<tool_call>\n{{"name": "Bash", "arguments": {call.arguments}}}\n</tool_call>'
        )
        output = [*encode(body), vocab.token_id("<|im_end|>")]
        logprobs = [-rng.expovariate(4.0) for _ in output]
        tree.record(
            route,
            BridgedPrompt(segments, generation_prompt),
            Completion(output, logprobs, FinishReason.STOP, "w1"),
            reply,
            TurnMeta(agent_id=None if agent == "main" else agent),
        )
        return reply

    def result(reply: Message, chars: int) -> Message:
        text = chunk(chars)
        return Message("tool", (Text(text),), tool_call_id=reply.tool_calls[0].id)

    main = [Message.text("system", "You are a coding agent."), Message.text("user", chunk(900))]
    for number in range(turns):
        reply = turn(main, number, "main")
        main = [*main, reply, result(reply, tool_chars)]
        if number % 20 == 19:
            sub = [Message.text("system", "You are a sub-agent."), Message.text("user", chunk(300))]
            first = turn(sub, 0, f"sub{number}")
            turn([*sub, first, result(first, 1000)], 1, f"sub{number}")
    return tree


def write_run(directory: Path, tree: SessionTree) -> None:
    episode = directory / "episodes" / "long"
    episode.mkdir(parents=True)
    (episode / "tree.json").write_text(dumps(tree), encoding="utf-8")
    entry = {
        "episode_id": "long",
        "instance_id": "bench__long-1",
        "group": 0,
        "reward": 1.0,
        "advantage": 0.5,
        "status": "completed",
        "reason": "",
        "dir": "episodes/long",
    }
    run = {"title": "bench", "policy": "bench", "agent": "bench", "episodes": [entry], "alarms": []}
    (directory / "run.json").write_text(json.dumps(run))


def timed_click(page: Page, selector: str) -> float:
    """Milliseconds a click takes to handle and lay out, measured inside the page."""
    value = page.evaluate(
        "(() => { const t0 = performance.now();"
        f" document.querySelector({selector!r}).click();"
        " document.body.offsetHeight; return performance.now() - t0; })()"
    )
    return float(value)


def browse(browser: Chromium, viewer: Path, long_sample: int) -> dict[str, float]:
    start = time.perf_counter()
    page = browser.open(viewer)
    page.wait_for(READY)
    load = (time.perf_counter() - start) * 1000
    episode = timed_click(page, ".ep-head")
    scope = f'.sample[data-sample="{long_sample}"]'
    first = timed_click(page, f"{scope} .s-head")
    first_nodes = page.evaluate("document.getElementsByTagName('*').length")
    everything = timed_click(page, f"{scope} .s-tools .link:nth-child(2)")
    all_nodes = page.evaluate("document.getElementsByTagName('*').length")
    heap = page.evaluate("performance.memory.usedJSHeapSize") / 2**20
    page.close()
    return {
        "load": load,
        "episode": episode,
        "first": first,
        "first_nodes": float(first_nodes),
        "all": everything,
        "all_nodes": float(all_nodes),
        "heap": heap,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--tool-chars", type=int, default=6000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    console = Console()
    vocab = load_qwen3_vocabulary(QwenTokenizerConfig(CACHE))
    tree = record_session(vocab, args.turns, args.tool_chars, seed=args.turns)
    samples = linearize(tree).samples
    longest = max(samples, key=lambda s: len(s.tokens))
    tokens = sum(len(n.delta) for n in tree.nodes if n.delta is not None)
    distinct = len({t for n in tree.nodes if n.delta is not None for t in n.delta})

    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp)
        write_run(run, tree)
        writes = []
        for _ in range(args.runs):
            start = time.perf_counter()
            viewer = write_viewer(run, lambda token: vocab.decode([token]))
            writes.append(time.perf_counter() - start)
        size = viewer.stat().st_size / 2**20
        with Chromium() as browser:
            runs = [browse(browser, viewer, longest.index) for _ in range(args.runs)]

    def median(key: str) -> float:
        return statistics.median(r[key] for r in runs)

    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    console.print(f"load average {load} (2 cores shared: timings are as quiet as the machine)")
    console.print(
        f"session: {len(tree.turns)} turns, {len(samples)} samples, {tokens:,} tokens in the "
        f"tree ({distinct:,} distinct ids), longest sample {len(longest.tokens):,} tokens"
    )
    table = Table(title=f"viewer, medians of {args.runs} runs")
    for column in ("step", "time", "DOM elements", "note"):
        table.add_column(column, justify="right" if column != "note" else "left")
    table.add_row(
        "write_viewer", f"{statistics.median(writes) * 1000:.0f} ms", "", f"{size:.1f} MB page"
    )
    table.add_row("load (tab, file, cards)", f"{median('load'):.0f} ms", "", "")
    table.add_row("open episode", f"{median('episode'):.0f} ms", "", "diagram, samples list")
    table.add_row(
        "first tokens (lazy)",
        f"{median('first'):.0f} ms",
        f"{median('first_nodes'):,.0f}",
        "the long sample's first 2,000 tokens",
    )
    table.add_row(
        "all tokens (eager)",
        f"{median('all'):.0f} ms",
        f"{median('all_nodes'):,.0f}",
        f"{median('all') / median('first'):.0f}x the lazy view; JS heap {median('heap'):.0f} MB",
    )
    console.print(table)


if __name__ == "__main__":
    main()
