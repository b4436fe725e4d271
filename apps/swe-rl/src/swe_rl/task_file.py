"""Task files: JSONL rows `{"prompt": ..., "metadata": <task payload>}`.

A bad row never stops a run: it is reported (row number, field, message) and skipped, and the
good rows go on. The row's metadata object is kept as read, so it can travel verbatim into the
samples; `task` is the same payload, typed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from swe_rl.errors import UsageError
from swe_rl.task import SweTask, TaskError, parse_task


@dataclass(frozen=True, slots=True)
class TaskRow:
    line: int
    prompt: str
    metadata: Mapping[str, Any]
    task: SweTask
    reference: Mapping[str, Any] = field(default_factory=dict)
    """The row's reference solution, outside the metadata so no episode or sample carries it:
    `{"patch": ...}` (SWE-bench's gold patch) or `{"solution_dir": ...}` (a Harbor task's
    `solution/`); only `swe-rl validate` reads it."""


@dataclass(frozen=True, slots=True)
class RowError:
    line: int
    field: str
    message: str

    def __str__(self) -> str:
        return f"row {self.line}: {self.field}: {self.message}"


@dataclass(frozen=True, slots=True)
class TaskFile:
    rows: tuple[TaskRow, ...]
    errors: tuple[RowError, ...]


def read_task_file(path: Path) -> TaskFile:
    """Read every row; undecodable files raise OSError/UnicodeDecodeError with the path."""
    with path.open(encoding="utf-8") as lines:
        return parse_task_lines(lines)


def parse_task_lines(lines: Iterable[str]) -> TaskFile:
    rows: list[TaskRow] = []
    errors: list[RowError] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = _row(number, line)
        except TaskError as error:
            errors.append(RowError(number, error.field, error.message))
            continue
        first = seen.setdefault(row.task.instance_id, number)
        if first != number:
            errors.append(
                RowError(number, "metadata.instance_id", f"repeats the id of row {first}")
            )
            continue
        rows.append(row)
    return TaskFile(tuple(rows), tuple(errors))


def _row(number: int, line: str) -> TaskRow:
    try:
        data = json.loads(line)
    except ValueError as error:
        raise TaskError("(row)", f"not JSON: {error}") from None
    if not isinstance(data, dict):
        raise TaskError("(row)", "must be a JSON object with prompt and metadata")
    prompt = data.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise TaskError("prompt", "is required and must be a non-empty string")
    metadata = data.get("metadata")
    if not isinstance(metadata, dict):
        raise TaskError("metadata", "is required and must be an object (the task payload)")
    try:
        task = parse_task(metadata)
    except TaskError as error:
        raise TaskError(f"metadata.{error.field}", error.message) from None
    reference = data.get("reference", {})
    if not isinstance(reference, dict):
        raise TaskError("reference", "must be an object (the reference solution)")
    return TaskRow(number, prompt, metadata, task, reference)


def command_rows(path: Path, console: Console) -> list[TaskRow]:
    """A command's task rows: each unusable row printed as skipped with its reason; a file
    that cannot be read, or has no usable row, is the user's error."""
    try:
        tasks = read_task_file(path)
    except OSError as error:
        raise UsageError(f"cannot read {path}: {error.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path} is not UTF-8 text") from None
    for problem in tasks.errors:
        console.print(f"[yellow]skipped[/] {path.name} {problem}", highlight=False)
    if not tasks.rows:
        raise UsageError(f"{path} has no usable task rows")
    return list(tasks.rows)
