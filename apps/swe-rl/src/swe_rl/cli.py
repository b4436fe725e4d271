"""`swe-rl`: the command line. With no arguments it runs the local demo.

    swe-rl                         the demo: scripted policy, real Claude Code, real sandboxes
    swe-rl rollout ...             the same episodes against a real SGLang server and checkpoint
    swe-rl check ...               preflight: one episode of one task, step by step
    swe-rl train RUN.toml          launch slime (`--dry-run` prints the command)
    swe-rl view RUN_DIR            (re)write a run's HTML trajectory viewer
    swe-rl convert-swebench IN OUT SWE-bench-family rows -> task rows, each in its image
    swe-rl convert-harbor DIR OUT  Harbor task directories -> task rows
    swe-rl validate TASKS          every task: empty change 0, reference solution 1

Each command is a module of `swe_rl.commands` (its arguments and what it runs); this one only
assembles them. Bad arguments or inputs get one line saying what is wrong (exit 2), never a
traceback; a run interrupted with Ctrl-C stops cleanly (exit 130).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn, Protocol

from rich.console import Console
from rich.markup import escape

from swe_rl import __version__
from swe_rl.commands import (
    check,
    convert_harbor,
    convert_swebench,
    demo,
    rollout,
    train,
    validate,
    view,
)
from swe_rl.errors import UsageError

PROG = "swe-rl"


class Command(Protocol):
    """What each module of `swe_rl.commands` declares."""

    NAME: str
    HELP: str
    DESCRIPTION: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


COMMANDS: tuple[Command, ...] = (
    demo,
    rollout,
    check,
    train,
    view,
    convert_swebench,
    convert_harbor,
    validate,
)
"""Every command, in the order `swe-rl --help` lists them."""
_TOP_LEVEL_OPTIONS = ("-h", "--help", "--version")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Reinforcement learning of coding agents on SWE tasks: real agent CLIs in "
        "sandboxes, token-faithful trajectories, tamper-proof grading, slime for training. "
        "Without a command, runs the local demo.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for command in COMMANDS:
        sub = commands.add_parser(command.NAME, help=command.HELP, description=command.DESCRIPTION)
        command.add_arguments(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    console = Console(stderr=True, soft_wrap=True)
    handlers = {command.NAME: command.run for command in COMMANDS}
    words = list(sys.argv[1:] if argv is None else argv)
    if not words or (words[0] not in handlers and words[0] not in _TOP_LEVEL_OPTIONS):
        words = ["demo", *words]  # the demo is the default command, options and all
    try:
        args = build_parser().parse_args(words)
        return handlers[args.command](args)
    except UsageError as error:
        console.print(f"[bold red]{PROG}:[/] {escape(str(error))}", highlight=False)
        return 2
    except KeyboardInterrupt:
        console.print(f"[bold red]{PROG}:[/] interrupted")
        return 130
