"""`swe-rl view RUN_DIR`: (re)write a run's HTML trajectory viewer (swe_rl/viewing.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

NAME = "view"
HELP = "write a run's HTML trajectory viewer"
DESCRIPTION = "(Re)write RUN_DIR/viewer.html from the run's saved session trees."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    parser.add_argument(
        "--checkpoint",
        type=Path,
        metavar="DIR",
        help="decode tokens with this checkpoint's tokenizer (default: the one the run recorded)",
    )


def run(args: argparse.Namespace) -> int:
    from swe_rl.viewing import write_run_viewer

    path = write_run_viewer(args.run_dir, args.checkpoint)
    Console().print(f"wrote {path}")
    return 0
