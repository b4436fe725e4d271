"""Arguments and row files several commands share."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from swe_rl.errors import UsageError


def image_cache(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--image-cache",
        type=Path,
        metavar="DIR",
        help="where registry images and OCI layouts are unpacked (default: "
        "$SWE_RL_IMAGE_CACHE, else ~/.cache/agent-rl/images)",
    )
    registry_access(parser)


def registry_access(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--plain-http",
        action="append",
        default=[],
        metavar="HOST[:PORT]",
        help="a registry spoken to over plain HTTP (a loopback or private one); repeatable, "
        "also $SWE_RL_REGISTRY_PLAIN_HTTP (comma-separated)",
    )
    parser.add_argument(
        "--registry-credentials",
        type=Path,
        metavar="FILE",
        help='JSON {"host": {"username": ..., "password": ...}} (default: '
        "$SWE_RL_REGISTRY_CREDENTIALS)",
    )


def local_images(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--images-dir",
        type=Path,
        metavar="DIR",
        help="local images instead of a registry: one per image name under DIR (its / and : "
        "as _), as --image-format says",
    )
    parser.add_argument(
        "--image-format",
        choices=("oci_layout", "rootfs"),
        default="oci_layout",
        help="what --images-dir holds (default: %(default)s)",
    )


def agent_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--agent",
        choices=("claude-code", "codex"),
        default="claude-code",
        help="the agent CLI (default: %(default)s)",
    )


def sandbox_choice(parser: argparse.ArgumentParser, *, what: str) -> None:
    """`--sandbox local|e2b`: where `what` ("episodes run", "the episode runs")."""
    parser.add_argument(
        "--sandbox",
        choices=("local", "e2b"),
        default="local",
        help=f"where {what} (default: %(default)s)",
    )


def unsafe_no_sandbox(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--unsafe-no-sandbox",
        action="store_true",
        help="run the agent's commands as plain host processes (NEVER with a model you do "
        "not trust)",
    )


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def write_rows(path: Path, rows: Sequence[dict[str, object]]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", encoding="utf-8") as out:
            for row in rows:
                out.write(json.dumps(row) + "\n")
    except OSError as error:
        raise UsageError(f"cannot write {path}: {error.strerror}") from None
