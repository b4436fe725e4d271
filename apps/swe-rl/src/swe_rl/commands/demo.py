"""`swe-rl demo` (the default command): the local demo (swe_rl/demo/)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from swe_rl.commands._arguments import agent_option, positive_int

NAME = "demo"
HELP = "the local demo (the default): a scripted policy, real CLI, real sandboxes"
DESCRIPTION = (
    "Create tiny real repositories with a bug, run K episodes per task with a "
    "real agent CLI in local sandboxes through the real adapter, with the engine double "
    "playing a SCRIPTED policy (no model runs: there is no GPU here), grade them, compute "
    "GRPO advantages and write the samples and the trajectory viewer."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    agent_option(parser)
    parser.add_argument("-k", "--episodes-per-task", type=positive_int, default=4, metavar="K")
    parser.add_argument("--concurrency", type=positive_int, default=4, metavar="N")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("runs/demo"),
        metavar="DIR",
        help="where the run's samples, episodes and viewer go (default: %(default)s)",
    )


def run(args: argparse.Namespace) -> int:
    from swe_rl.demo.run import run_demo

    return asyncio.run(run_demo(args))
