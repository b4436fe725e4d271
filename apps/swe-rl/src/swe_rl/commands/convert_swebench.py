"""`swe-rl convert-swebench IN OUT`: SWE-bench-family rows -> task rows (swe_rl/swebench.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console

from swe_rl.commands._arguments import local_images, write_rows
from swe_rl.errors import UsageError

NAME = "convert-swebench"
HELP = "SWE-bench-family rows -> task rows, each in its own image"
DESCRIPTION = (
    "Convert SWE-bench-family rows (JSONL, or a JSON list) to task rows that "
    "run in each instance's image, with the official harness's test command and log "
    "parser (the swebench package). The gold patch goes to the row's reference (read by "
    "`validate` only), never to what an episode sees. Rows that cannot be graded are "
    "skipped and listed with the reason."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("input", type=Path)
    parser.add_argument("output", type=Path)
    parser.add_argument(
        "--image-prefix",
        default="swebench/sweb.eval.x86_64.",
        metavar="PREFIX",
        help="registry and repository prefix of the images (default: %(default)s; a mirror: "
        "registry.example/swebench/sweb.eval.x86_64.)",
    )
    parser.add_argument("--image-tag", default="latest", metavar="TAG")
    parser.add_argument(
        "--image-column",
        metavar="NAME",
        help="take each row's image from this column (SWE-smith: image_name, R2E-Gym: "
        "docker_image)",
    )
    local_images(parser)
    parser.add_argument(
        "--template-prefix",
        metavar="PREFIX",
        help="E2B: a template per instance, PREFIX + instance_id",
    )
    parser.add_argument(
        "--test-command",
        metavar="CMD",
        help="the test command of every row (repositories the harness has no spec for)",
    )
    parser.add_argument(
        "--log-parser",
        metavar="NAME",
        help="the harness's log parser of every row: a repository (owner/name) or a parser "
        "function (parse_log_pytest)",
    )


def run(args: argparse.Namespace) -> int:
    from swe_rl.swebench import ConversionOptions, convert_rows

    rows = _read_rows(args.input)
    options = ConversionOptions(
        image_prefix=args.image_prefix,
        image_tag=args.image_tag,
        image_column=args.image_column,
        images_dir=args.images_dir,
        image_format=args.image_format,
        template_prefix=args.template_prefix,
        test_command=args.test_command,
        log_parser=args.log_parser,
    )
    converted = convert_rows(rows, options)
    write_rows(args.output, converted.rows)
    console = Console()
    console.print(f"wrote {len(converted.rows)} task rows to {args.output}")
    for line, instance, reason in converted.skipped:
        console.print(f"  skipped row {line} ({instance}): {reason}", highlight=False)
    return 0


def _read_rows(path: Path) -> list[dict[str, object]]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise UsageError(f"cannot read {path}: {error.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path} is not UTF-8 text") from None
    stripped = text.lstrip()
    try:
        if stripped.startswith("["):
            rows = json.loads(text)
        else:
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    except ValueError as error:
        raise UsageError(f"{path} is neither JSONL nor a JSON list: {error}") from None
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        raise UsageError(f"{path} must hold JSON objects, one per row")
    return rows
