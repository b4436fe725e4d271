"""What turning an episode into slime samples costs, next to linearizing it.

    uv run tools/bench/slime_conversion_bench.py [--turns 20,200,1000] [--runs 3]

slime-backend's generate function (part 2) will run ``episode_samples`` inside slime's rollout
process, on the event loop that drives every concurrent episode; these numbers say how long one
episode blocks it. A seeded session is recorded the way the adapters record one: a main agent
whose every turn adds a ~5k-token tool result and a 200-token reply, plus a 2-turn sub-agent every
10 turns (so a 200-turn session is 1M tokens and 21 samples). Both columns are medians of
``--runs``: ``linearize`` is trajectory-tree's linearization + reward assignment (the floor: the
samples' tokens, masks and logprobs), ``episode_samples`` the full conversion on top of it (token
lists, masked logprobs, provenance, slime ``Sample`` objects). The GRPO hook is timed on a batch
of 256 episodes x 1-8 samples.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable, Sequence
from functools import partial
from types import SimpleNamespace

from rich.console import Console
from rich.table import Table

from slime_backend import ConversionOptions, EpisodeOutcome, episode_samples
from slime_backend.reward_hook import post_process_rewards
from slime_backend.testing import StandInSample
from trajectory_tree import (
    BridgedPrompt,
    Completion,
    FinishReason,
    LossReason,
    Message,
    Prompt,
    Segment,
    SessionTree,
    assign_reward,
    linearize,
)

VOCAB = 151_000
TOOL_TOKENS = 5_000
REPLY_TOKENS = 200


def record_session(turns: int, seed: int) -> SessionTree:
    rng = random.Random(seed)
    tree = SessionTree(f"bench-{turns}")

    def ids(n: int) -> list[int]:
        return [rng.randrange(VOCAB) for _ in range(n)]

    def turn(messages: list[Message], number: int) -> Message:
        route = tree.route(Prompt(messages))
        segments = [
            Segment(
                LossReason.TOOL_OUTPUT if m.role == "user" and number else LossReason.CONTEXT,
                ids(TOOL_TOKENS if number else 300),
            )
            for m in route.new_messages
        ]
        reply = Message.text("assistant", f"reply {number} {rng.random()}")
        output = ids(REPLY_TOKENS)
        logprobs = [-rng.expovariate(3.0) for _ in output]
        tree.record(
            route,
            BridgedPrompt(segments, [1, 2, 3]),
            Completion(output, logprobs, FinishReason.STOP, "w1"),
            reply,
        )
        return reply

    main = [Message.text("system", "main"), Message.text("user", "task")]
    for number in range(turns):
        reply = turn(main, number)
        main = [*main, reply, Message.text("user", f"tool result {number}")]
        if number % 10 == 9:
            sub = [Message.text("system", "sub-agent"), Message.text("user", f"sub {number}")]
            sub_reply = turn(sub, 0)
            turn([*sub, sub_reply, Message.text("user", "more")], 1)
    return tree


def linearize_with_reward(tree: SessionTree) -> object:
    """trajectory-tree's own share of the conversion: the floor."""
    return assign_reward(linearize(tree), 1.0, rollout_id="1")


def median_ms(function: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def conversion_table(turn_counts: Sequence[int], runs: int) -> Table:
    table = Table(title="one episode -> slime samples (median ms)")
    for column in (
        "turns",
        "tokens",
        "samples",
        "linearize",
        "episode_samples",
        "ratio",
        "ns/token",
    ):
        table.add_column(column, justify="right")
    base = StandInSample(index=1, group_index=0, prompt="task", metadata={"repo": "x"})
    for turns in turn_counts:
        tree = record_session(turns, seed=turns)
        samples = episode_samples(
            tree, base, EpisodeOutcome(1.0), ConversionOptions(), sample_class=StandInSample
        )
        tokens = sum(len(s.tokens) for s in samples)
        floor = median_ms(partial(linearize_with_reward, tree), runs)
        full = median_ms(
            partial(
                episode_samples,
                tree,
                base,
                EpisodeOutcome(1.0),
                ConversionOptions(),
                sample_class=StandInSample,
            ),
            runs,
        )
        table.add_row(
            str(turns),
            f"{tokens:,}",
            str(len(samples)),
            f"{floor:.1f}",
            f"{full:.1f}",
            f"{full / floor:.2f}x",
            f"{full * 1e6 / tokens:.0f}",
        )
    return table


def hook_table(runs: int) -> Table:
    rng = random.Random(0)
    rewards = [float(rng.random() < 0.4) for _ in range(256)]
    batch = [
        StandInSample(
            index=episode,
            rollout_id=episode,
            group_index=episode // 8,
            reward=reward,
            status=StandInSample.Status.COMPLETED,
        )
        for episode, reward in enumerate(rewards)
        for _ in range(rng.randint(1, 8))
    ]
    args = SimpleNamespace(
        advantage_estimator="grpo",
        rewards_normalization=True,
        grpo_std_normalization=True,
        reward_key=None,
    )
    table = Table(title="GRPO reward hook, one rollout batch (median ms)")
    for column in ("episodes", "samples", "post_process_rewards"):
        table.add_column(column, justify="right")
    elapsed = median_ms(lambda: post_process_rewards(args, batch), runs)
    table.add_row("256", str(len(batch)), f"{elapsed:.2f}")
    return table


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", default="20,200,1000", help="session lengths, comma-separated")
    parser.add_argument("--runs", type=int, default=3, help="timed runs per shape")
    args = parser.parse_args(argv)
    console = Console()
    console.print(conversion_table([int(t) for t in args.turns.split(",")], args.runs))
    console.print(hook_table(args.runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
