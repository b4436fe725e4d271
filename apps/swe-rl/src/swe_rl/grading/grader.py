"""Grade an agent's change in a fresh sandbox it never touched.

1. A fresh sandbox holds a pristine checkout of the task at its base commit; the task's setup
   runs there first, so nothing the agent changed (a build file naming a pytest plugin, say) can
   shape the environment the tests run in.
2. The agent's patch is applied without the files it may not change (protected.py): tests, the
   test runner's configuration, interpreter start-up hooks. A patch that does not apply earns 0.
3. The task's test patch is applied on top, restoring its own view of the tests.
4. The test command runs with $GRADING_REPORT naming a fresh path outside the repository, where
   it must write a JUnit XML report; $GRADING_TOOLS holds helpers such as unittest_junit.py.
5. The reward comes from that report alone: 1.0 when every FAIL_TO_PASS and PASS_TO_PASS test
   passed, else 0.0. The command's exit code and output are logged, never believed: a change
   that prints "PASSED" or wraps the runner to exit 0 earns nothing.

What no test-based grader can stop: code under test that subverts the test runner from inside
its own process (monkeypatching the runner at import). That needs a change to the code under
test, which the reward then reflects only if the tests are fooled; docs/grading.md says more.

Failures of the task or the infrastructure (the sandbox, the setup, the test patch) raise
GradingError: the episode has no trustworthy reward and is aborted, not scored 0.
"""

from __future__ import annotations

import shlex
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources

from sandbox import (
    ExecResult,
    Sandbox,
    SandboxCommandError,
    SandboxError,
    SandboxFileNotFoundError,
    SetupFailedError,
    UnsafePatchError,
    apply_diff,
    run_setup,
)
from swe_rl.grading.junit import ReportError, outcomes, parse_report
from swe_rl.grading.patch_files import join_sections, split_patch
from swe_rl.grading.protected import ProtectedPaths
from swe_rl.task import SweTask

SandboxFactory = Callable[[], Awaitable[Sandbox]]
TOOLS = ("unittest_junit.py",)
_LOG_TAIL = 4000


class GradingError(RuntimeError):
    """The task or the infrastructure failed: no trustworthy reward exists."""


@dataclass(slots=True)
class GradingLog:
    """What grading did, step by step, for the episode's artifacts."""

    lines: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        self.lines.append(text)

    def command(self, label: str, result: ExecResult) -> None:
        self.note(
            f"$ {label}: exit {result.exit_code}"
            f"{' (timed out)' if result.timed_out else ''}, {result.duration:.2f} s"
        )
        for name, text in (("stdout", result.stdout), ("stderr", result.stderr)):
            if text.strip():
                self.note(f"--- {name} (tail) ---\n{text[-_LOG_TAIL:]}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


@dataclass(frozen=True, slots=True)
class GradeResult:
    reward: float
    resolved: bool
    tests: Mapping[str, str]
    """Each FAIL_TO_PASS and PASS_TO_PASS test: passed, failed, error, skipped or missing."""
    refused_paths: Mapping[str, str]
    """Agent changes grading did not apply, and why."""
    patch_applied: bool
    note: str
    """Why the reward is what it is, in one line."""

    def summary(self) -> dict[str, object]:
        return {
            "reward": self.reward,
            "resolved": self.resolved,
            "tests": dict(self.tests),
            "refused_paths": dict(self.refused_paths),
            "patch_applied": self.patch_applied,
            "note": self.note,
        }


async def grade(
    task: SweTask, patch: bytes, new_sandbox: SandboxFactory, log: GradingLog
) -> GradeResult:
    """Grade `patch` (the agent's captured diff) against `task` in a sandbox from `new_sandbox`."""
    sections = split_patch(patch)
    test_patch_paths = frozenset(
        path for section in split_patch(task.grading.test_patch.encode()) for path in section.paths
    )
    rules = ProtectedPaths(test_patch_paths)
    refused = rules.refused({path for section in sections for path in section.paths})
    kept = [section for section in sections if not section.paths & refused.keys()]
    for path, reason in sorted(refused.items()):
        log.note(f"not applied: {path} ({reason})")
    wanted = task.grading.fail_to_pass + task.grading.pass_to_pass
    try:
        box = await new_sandbox()
    except SandboxError as error:
        raise GradingError(f"grading sandbox failed to start: {error}") from error
    async with box:
        await _setup(box, task, log)
        try:
            await apply_diff(box, join_sections(kept))
        except (SandboxCommandError, UnsafePatchError) as error:
            log.note(f"the agent's patch does not apply: {error}")
            return _failed(wanted, refused, f"the agent's patch does not apply: {error}")
        if task.grading.test_patch.strip():
            try:
                await apply_diff(box, task.grading.test_patch.encode())
            except SandboxError as error:
                raise GradingError(f"the task's test patch does not apply: {error}") from error
        report = await _run_tests(box, task, log)
    if report is None:
        return _failed(wanted, refused, "the tests wrote no report", applied=True)
    try:
        cases = parse_report(report)
    except ReportError as error:
        log.note(f"unusable report: {error}")
        return _failed(wanted, refused, f"unusable report: {error}", applied=True)
    tests = outcomes(cases, wanted)
    for test_id, status in tests.items():
        log.note(f"{status:>8}  {test_id}")
    resolved = all(status == "passed" for status in tests.values())
    failing = sum(status != "passed" for status in tests.values())
    note = "all tests pass" if resolved else f"{failing} of {len(tests)} tests do not pass"
    return GradeResult(1.0 if resolved else 0.0, resolved, tests, refused, True, note)


async def _setup(box: Sandbox, task: SweTask, log: GradingLog) -> None:
    try:
        for result in await run_setup(box, task.setup_commands, timeout=task.grading.timeout_s):
            log.command("setup", result)
    except SetupFailedError as error:
        log.command(f"setup: {error.command}", error.result)
        raise GradingError(f"setup failed in the grading sandbox: {error.command}") from error


async def _run_tests(box: Sandbox, task: SweTask, log: GradingLog) -> bytes | None:
    """Run the test command; its report (None if it wrote none)."""
    private = f"/tmp/grading-{uuid.uuid4().hex}"
    tools = f"{private}/tools"
    report = f"{private}/report.xml"
    for name in TOOLS:
        source = resources.files("swe_rl.grading").joinpath(name).read_bytes()
        await box.write_file(f"{tools}/{name}", source)
    env = {"GRADING_REPORT": report, "GRADING_TOOLS": tools}
    result = await box.exec(task.grading.test_command, env=env, timeout=task.grading.timeout_s)
    log.command(f"tests: {task.grading.test_command}", result)
    try:
        return await box.read_file(report)
    except SandboxFileNotFoundError:
        log.note(f"no report at {report}")
        return None
    finally:
        await box.exec(f"rm -rf -- {shlex.quote(private)}")


def _failed(
    wanted: tuple[str, ...], refused: Mapping[str, str], note: str, *, applied: bool = False
) -> GradeResult:
    return GradeResult(0.0, False, dict.fromkeys(wanted, "missing"), refused, applied, note)
