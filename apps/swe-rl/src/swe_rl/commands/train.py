"""`swe-rl train RUN.toml`: launch slime from a run file (slime-backend's launcher)."""

from __future__ import annotations

import argparse
from pathlib import Path

from swe_rl.errors import UsageError

NAME = "train"
HELP = "launch slime from a run file"
DESCRIPTION = (
    "Build the slime command from a TOML run file (see slime-backend's "
    "docs/example-run.toml) and submit it as a Ray job."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", type=Path, help="the run file (TOML)")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the command and the files it would write, run nothing",
    )


def run(args: argparse.Namespace) -> int:
    from slime_backend import ConfigError
    from slime_backend.launcher import SlimeRunner

    try:
        runner = SlimeRunner.from_toml(args.config)
        if args.dry_run:
            runner.dry_run()
            return 0
        return runner.submit()  # without Ray: a ConfigError before anything is written
    except (OSError, ConfigError) as error:
        raise UsageError(str(error)) from None
