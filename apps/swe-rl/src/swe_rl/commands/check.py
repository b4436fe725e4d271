"""`swe-rl check`'s command line (the check itself is swe_rl/check.py, imported when it runs)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from swe_rl.commands._arguments import (
    agent_option,
    image_cache,
    sandbox_choice,
    unsafe_no_sandbox,
)
from swe_rl.engine_url import add_engine_arguments
from swe_rl.rollout_flags import add_settings_arguments

NAME = "check"
HELP = "preflight: one episode of one task against the real stack, step by step"
DESCRIPTION = (
    "Try every piece an episode needs once, in order, each step timed: the engine and its "
    "context, the checkpoint's chat template, the task's sandbox, grading (the empty change "
    "earns 0, the reference 1), one episode of the agent CLI through the adapter, token trust "
    "(every trained token is the engine's, with its logprob) and the episode's slime samples. "
    "Stops at the first failing step (exit 1) and says what to do. Takes the same options and "
    "rollout settings as `rollout`."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("tasks", type=Path, help="task file (JSONL rows {prompt, metadata})")
    add_engine_arguments(parser)
    parser.add_argument(
        "--task", metavar="INSTANCE_ID", help="the task to run (default: the file's first)"
    )
    sandbox_choice(parser, what="the episode runs")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("runs/check"),
        metavar="DIR",
        help="the episode, its samples and check.json (default: %(default)s)",
    )
    unsafe_no_sandbox(parser)
    add_settings_arguments(parser)
    agent_option(parser)
    image_cache(parser)


def run(args: argparse.Namespace) -> int:
    from swe_rl.check import run_check

    return asyncio.run(run_check(args))
