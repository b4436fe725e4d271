"""`swe-rl validate TASKS`: every task, in its own environment, must grade the empty change 0
and its reference solution 1, before any training run spends a GPU-hour on it.

A task that fails tells why: its image is missing or will not boot, its test runner cannot
start there, its tests error at the base (no report, a time-out), the empty change already
passes (nothing to fix), the reference solution does not pass. Tasks are validated
concurrently, each result appended to a state file as it comes, so a rerun skips what was
validated (`retry_failed` tries the failures again); the passing rows are written, as read
(reference included), to the output file.

The empty change and a SWE-bench gold patch are graded as an agent's change is, in a fresh
sandbox from the task's image. A Harbor reference solution is a script: it runs in a sandbox
built as the agent's is (without network), and its change is captured and graded.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any

from sandbox import (
    CaptureLimits,
    ChangeTooLargeError,
    ReadOnlyBind,
    ResourceLimits,
    SandboxBackend,
    SandboxError,
    SetupFailedError,
    run_setup,
)
from swe_rl.environment import (
    CaptureUnsupportedError,
    capture_change,
    environment_reason,
    sandbox_spec,
)
from swe_rl.grading import EnvironmentFailure, GradeResult, GradingError, GradingLog, grade
from swe_rl.grading.verdict import Verdict
from swe_rl.sources import RepoSources, SourceError
from swe_rl.task_file import TaskRow

SOLUTION_PATH = "/solution"


@dataclass(frozen=True, slots=True)
class Validation:
    """One task's validation: what the empty change and the reference earned, and why not."""

    instance_id: str
    key: str
    """The task row's hash: a changed row is validated again."""
    ok: bool
    empty: float | None
    """The empty change's reward (None: it could not be graded)."""
    gold: float | None
    reason: str
    seconds: float
    line: int = 0
    earlier: bool = False
    """Read from the state file, not validated in this run."""

    def state(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("earlier")
        data.pop("line")
        return data


@dataclass(slots=True)
class ValidateConfig:
    backend: SandboxBackend
    sources_cache: Path
    env: Mapping[str, str] = field(default_factory=dict)
    binds: tuple[ReadOnlyBind, ...] = ()
    limits: ResourceLimits = field(default_factory=ResourceLimits)
    capture: CaptureLimits = field(default_factory=CaptureLimits)
    solution_timeout_s: float = 1800.0
    logs: Path | None = None
    """Where each task's grading logs go (`<logs>/<instance>/{empty,gold}.log`)."""


def row_key(row: TaskRow) -> str:
    text = json.dumps([row.metadata, row.reference], sort_keys=True, ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


class _Failed(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Validator:
    def __init__(self, config: ValidateConfig) -> None:
        self.config = config
        self.sources = RepoSources(config.sources_cache)

    async def validate(self, row: TaskRow) -> Validation:
        started = time.monotonic()
        task = row.task
        empty = gold = None
        try:
            repo = None if task.in_image else await self._repository(row)
            empty_result = await self._grade(row, repo, b"", "empty")
            empty = empty_result.reward
            gold_patch = await self._reference_patch(row, repo)
            gold_result = await self._grade(row, repo, gold_patch, "gold")
            gold = gold_result.reward
            reason = _judge(empty_result, gold_result)
        except _Failed as failed:
            reason = failed.reason
        return Validation(
            task.instance_id,
            row_key(row),
            reason == "",
            empty,
            gold,
            reason or "ok",
            round(time.monotonic() - started, 3),
            row.line,
        )

    async def _repository(self, row: TaskRow) -> Path:
        try:
            return await self.sources.prepare(row.task)
        except SourceError as error:
            raise _Failed(f"repository: {error}") from None

    async def _grade(
        self, row: TaskRow, repo: Path | None, patch: bytes, label: str
    ) -> GradeResult:
        task = row.task
        spec = sandbox_spec(
            task,
            repo,
            env=self.config.env,
            binds=self.config.binds,
            limits=self.config.limits,
            grading=True,
        )
        log = GradingLog()
        try:
            return await grade(task, patch, lambda: self.config.backend.create(spec), log)
        except EnvironmentFailure as error:
            raise _Failed(environment_reason(task, f"grading the {label} change", error)) from None
        except GradingError as error:
            raise _Failed(f"grading the {label} change: {error}") from None
        finally:
            self._keep_log(row, label, log.text())

    async def _reference_patch(self, row: TaskRow, repo: Path | None) -> bytes:
        reference = row.reference
        patch = reference.get("patch")
        if isinstance(patch, str):
            return patch.encode()
        solution = reference.get("solution_dir")
        if isinstance(solution, str):
            return await self._run_solution(row, repo, Path(solution))
        raise _Failed("the row has no reference solution (reference.patch or .solution_dir)")

    async def _run_solution(self, row: TaskRow, repo: Path | None, solution: Path) -> bytes:
        """A Harbor solution: solve.sh run in the agent's kind of sandbox, its change captured."""
        task = row.task
        spec = sandbox_spec(
            task, repo, env=self.config.env, binds=self.config.binds, limits=self.config.limits
        )
        # Harbor's solutions live at /solution: an empty writable directory on the image's root.
        spec = replace(spec, scratch_dirs=(PurePosixPath(SOLUTION_PATH),))
        try:
            files = await asyncio.to_thread(_solution_files, solution)
        except OSError as error:
            raise _Failed(f"reading the solution {solution}: {error}") from None
        try:
            box = await self.config.backend.create(spec)
        except SandboxError as error:
            raise _Failed(environment_reason(task, "the sandbox cannot start", error)) from None
        try:
            async with box:
                await run_setup(box, task.setup_commands, timeout=self.config.solution_timeout_s)
                for relative, data in files:
                    await box.write_file(f"{SOLUTION_PATH}/{relative}", data)
                ran = await box.exec(
                    f"bash {SOLUTION_PATH}/solve.sh", timeout=self.config.solution_timeout_s
                )
                self._keep_log(row, "solution", f"exit {ran.exit_code}\n{ran.stdout}\n{ran.stderr}")
                if not ran.ok:
                    why = (ran.stderr.strip() or ran.stdout.strip())[-300:]
                    raise _Failed(f"the reference solution fails (exit {ran.exit_code}): {why}")
                return (await capture_change(box, task, repo, self.config.capture)).patch
        except CaptureUnsupportedError as error:
            raise _Failed(environment_reason(task, "capturing the solution", error)) from None
        except SetupFailedError as error:
            raise _Failed(f"setup failed: {error}") from None
        except (SandboxError, ChangeTooLargeError) as error:
            raise _Failed(f"running the reference solution: {error}") from None

    def _keep_log(self, row: TaskRow, label: str, text: str) -> None:
        if self.config.logs is None:
            return
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in row.task.instance_id)
        directory = self.config.logs / safe[:100]
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"{label}.log").write_text(text, encoding="utf-8")


def _judge(empty: GradeResult, gold: GradeResult) -> str:
    """Why the task is unusable, or "" when it is fine."""
    if empty.verdict in (Verdict.NO_REPORT, Verdict.TESTS_TIMED_OUT):
        return f"the tests error at the base: {empty.reason}"
    if empty.reward > 0:
        return f"the empty change earns {empty.reward:g}: {empty.reason}"
    if gold.reward < 1:
        return f"the reference solution earns {gold.reward:g}: {gold.verdict}: {gold.reason}"
    return ""


def _solution_files(root: Path) -> list[tuple[str, bytes]]:
    files = [
        (str(path.relative_to(root)), path.read_bytes())
        for path in sorted(root.rglob("*"))
        if path.is_file() and not path.is_symlink()
    ]
    if not any(name == "solve.sh" for name, _ in files):
        raise FileNotFoundError(f"no solve.sh in {root}")
    return files


# -- the state file --------------------------------------------------------------------------


def read_state(path: Path) -> dict[str, Validation]:
    """Earlier results by row key (the last one of each); a torn last line is ignored."""
    results: dict[str, Validation] = {}
    if not path.exists():
        return results
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            data = json.loads(line)
            result = Validation(**data, earlier=True)
        except (ValueError, TypeError):
            continue
        results[result.key] = result
    return results


def append_state(path: Path, result: Validation) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as out:
        out.write(json.dumps(result.state()) + "\n")


async def validate_rows(
    rows: Sequence[TaskRow],
    validator: Validator,
    *,
    concurrency: int,
    state: Path,
    retry_failed: bool = False,
    on_result: Callable[[Validation], None] | None = None,
) -> list[Validation]:
    """Validate every row not already in `state`; results in row order, earlier ones included."""
    earlier = read_state(state)
    results: dict[int, Validation] = {}
    todo: list[TaskRow] = []
    for row in rows:
        known = earlier.get(row_key(row))
        if known is not None and (known.ok or not retry_failed):
            results[row.line] = Validation(**{**known.state(), "line": row.line, "earlier": True})
        else:
            todo.append(row)
    gate = asyncio.Semaphore(concurrency)

    async def one(row: TaskRow) -> None:
        async with gate:
            result = await validator.validate(row)
        results[row.line] = result
        await asyncio.to_thread(append_state, state, result)
        if on_result is not None:
            on_result(result)

    await asyncio.gather(*(one(row) for row in todo))
    return [results[row.line] for row in rows]


def passing_lines(rows: Iterable[TaskRow], results: Iterable[Validation]) -> list[str]:
    """The passing rows as JSON lines, as read (metadata and reference)."""
    ok = {r.line for r in results if r.ok}
    return [
        json.dumps({"prompt": row.prompt, "metadata": row.metadata, "reference": row.reference})
        for row in rows
        if row.line in ok
    ]
