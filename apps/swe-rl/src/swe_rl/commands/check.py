"""`swe-rl check`'s command line (the check itself is swe_rl/check.py, imported when it runs)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from swe_rl.engine_url import add_engine_arguments
from swe_rl.rollout_flags import add_settings_arguments

HELP = "preflight: one episode of one task against the real stack, step by step"
DESCRIPTION = (
    "Try every piece an episode needs once, in order, each step timed: the engine and its "
    "context, the checkpoint's chat template, the task's sandbox, grading (the empty change "
    "earns 0, the reference 1), one episode of the agent CLI through the adapter, token trust "
    "(every trained token is the engine's, with its logprob) and the episode's slime samples. "
    "Stops at the first failing step (exit 1) and says what to do. Takes the same options and "
    "rollout settings as `rollout`."
)


def add_check_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("tasks", type=Path, help="task file (JSONL rows {prompt, metadata})")
    add_engine_arguments(parser)
    parser.add_argument(
        "--task", metavar="INSTANCE_ID", help="the task to run (default: the file's first)"
    )
    parser.add_argument(
        "--sandbox",
        choices=("local", "e2b"),
        default="local",
        help="where the episode runs (default: %(default)s)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("runs/check"),
        metavar="DIR",
        help="the episode, its samples and check.json (default: %(default)s)",
    )
    parser.add_argument(
        "--unsafe-no-sandbox",
        action="store_true",
        help="run the agent's commands as plain host processes (NEVER with a model you do "
        "not trust)",
    )
    add_settings_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from swe_rl.check import run_check

    return asyncio.run(run_check(args))
