"""`swe-rl validate TASKS`: the command around swe_rl/validate.py (table, progress, files)."""

from __future__ import annotations

import argparse
import asyncio
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from swe_rl.commands._arguments import image_cache, positive_int
from swe_rl.errors import UsageError

if TYPE_CHECKING:
    from swe_rl.validate import Validation

NAME = "validate"
HELP = "check that every task grades the empty change 0 and its reference 1"
DESCRIPTION = (
    "For every task, in its own environment: the empty change must earn 0 and "
    "the reference solution (SWE-bench's gold patch, Harbor's solution/) must earn 1. "
    "Prints a table, writes the passing rows to --out, names every failure's reason. "
    "Resumable: results go to a state file as they come, and a rerun skips the tasks "
    "already validated."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("tasks", type=Path, help="task file (JSONL rows)")
    parser.add_argument(
        "--out", type=Path, metavar="FILE", help="where the passing rows go (JSONL)"
    )
    parser.add_argument(
        "--state",
        type=Path,
        metavar="FILE",
        help="the state file (default: TASKS with .validate-state.jsonl)",
    )
    parser.add_argument("--concurrency", type=positive_int, default=4, metavar="N")
    parser.add_argument(
        "--retry-failed", action="store_true", help="validate earlier failures again"
    )
    parser.add_argument("--logs", type=Path, metavar="DIR", help="keep every grading log under DIR")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=Path.home() / ".cache" / "agent-rl",
        metavar="DIR",
        help="prepared repositories (default: %(default)s)",
    )
    image_cache(parser)


def run(args: argparse.Namespace) -> int:
    return asyncio.run(run_validate(args))


async def run_validate(args: argparse.Namespace) -> int:
    from sandbox import LocalBackend, LocalConfig
    from swe_rl.environment import image_cache_config
    from swe_rl.task_file import command_rows
    from swe_rl.validate import ValidateConfig, Validator, passing_lines, validate_rows

    console = Console()
    rows = command_rows(args.tasks, console)
    if shutil.which("bwrap") is None:
        raise UsageError("validate runs every task in a bubblewrap sandbox: install bubblewrap")
    state: Path = args.state or args.tasks.with_suffix(".validate-state.jsonl")
    try:
        images = image_cache_config(
            args.image_cache, plain_http=args.plain_http, credentials=args.registry_credentials
        )
    except ValueError as error:
        raise UsageError(str(error)) from None
    config = ValidateConfig(
        backend=LocalBackend(LocalConfig(images=images)),
        sources_cache=args.cache_dir / "sources",
        logs=args.logs,
    )
    with Progress(
        TextColumn("[bold]validating"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        bar = progress.add_task("tasks", total=len(rows))

        def done(result: Validation) -> None:
            progress.advance(bar)

        results = await validate_rows(
            rows,
            Validator(config),
            concurrency=args.concurrency,
            state=state,
            retry_failed=args.retry_failed,
            on_result=done,
        )
        progress.update(bar, completed=len(rows))
    console.print(table(results))
    passed = sum(r.ok for r in results)
    if args.out is not None:
        lines = passing_lines(rows, results)
        try:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
        except OSError as error:
            raise UsageError(f"cannot write {args.out}: {error.strerror}") from None
        console.print(f"wrote the {passed} passing tasks to {args.out}")
    console.print(f"{passed} of {len(results)} tasks pass; state: {state}")
    for result in results:
        if not result.ok:
            console.print(f"[red]FAILED[/] {result.instance_id}: {result.reason}", highlight=False)
    return 0 if passed == len(results) else 1


def table(results: list[Validation]) -> Table:
    view = Table(title="task validation")
    for column in ("task", "empty", "gold", "verdict", "time"):
        view.add_column(column, justify="right" if column == "time" else "left")
    for result in results:
        view.add_row(
            result.instance_id,
            _reward(result.empty, want=0.0),
            _reward(result.gold, want=1.0),
            "[green]ok[/]" if result.ok else f"[red]{_short(result.reason)}[/]",
            f"{result.seconds:.1f} s" + (" (earlier)" if result.earlier else ""),
        )
    return view


def _reward(value: float | None, *, want: float) -> str:
    if value is None:
        return "-"
    colour = "green" if value == want else "red"
    return f"[{colour}]{value:g}[/]"


def _short(reason: str, width: int = 90) -> str:
    return reason if len(reason) <= width else reason[: width - 3] + "..."
