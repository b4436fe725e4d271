"""Grade an agent's change in a fresh sandbox it never touched.

1. The change is read as a patch, linearly and off the event loop, and refused whole when it
   is over its size limit, unreadable, or when git would apply other paths than the ones it
   names (`git apply --numstat`): a patch is applied only where both agree.
2. A fresh sandbox holds a pristine checkout of the task at its base commit; the task's setup
   runs there first, then the task's test patch is applied, so nothing the agent changed
   shapes the environment or the tests.
3. The change is applied without the files it may not change (rules.py): tests, what the
   runner loads or reads, start-up and import hooks, compiled code, modules that would shadow
   the standard library or the runner, symlinks out of the repository.
4. The test run is the task's, never the repository's (runners.py): for pytest an explicit
   configuration file fixed before the change was applied, autoloading off, the wanted tests'
   files collected.
5. Our runners write their report to their own stdout, which no program the tests start
   inherits, so no file holds it that a leftover process could rewrite; a task's own command
   writes JUnit to a private path outside the repository. Every process of the sandbox is
   killed before the report is read, and a report file is read bounded, as a regular file
   only, never through a symlink.
6. The reward comes from that report alone, each wanted test matched by its exact id: 1.0 when
   every FAIL_TO_PASS and PASS_TO_PASS test passed. Exit codes and output are logged, never
   believed.

The verdict and its reason are in the result (verdict.py). What no test-based grader can stop,
code under test that lies about itself in-process, is in docs/grading.md.

Failures of the task or the infrastructure (the sandbox, the setup, the test patch) raise
GradingError: the episode has no trustworthy reward and is aborted, not scored 0. Before the
change is applied, the runner is proven to start in the task's environment (its interpreter
and test framework, or its command's program); when it cannot, that is EnvironmentFailure,
never a reward. What the agent's change causes is the agent's: it is graded, and earns
nothing.

SWE-bench-family tasks (the swebench runner) are read with the official harness's log parser
for their repository, fed only what our runners saw (swebench_log.py); a Harbor task's reward
is the number its verifier wrote to its reward file, read as a report file is.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shlex
import stat
import uuid
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from importlib import resources

from sandbox import (
    ExecResult,
    Sandbox,
    SandboxCommandError,
    SandboxError,
    SetupFailedError,
    UnsafePatchError,
    apply_diff,
    run_setup,
)
from swe_rl.grading import runners, swebench_log
from swe_rl.grading.patch_files import (
    FileSection,
    PatchError,
    display,
    git_apply_paths,
    join_sections,
    split_patch,
)
from swe_rl.grading.report import (
    ReportError,
    TestReport,
    parse_json_report,
    parse_junit_report,
    parse_log_report,
)
from swe_rl.grading.rules import ChangeRules
from swe_rl.grading.verdict import PASSING_STATUSES, GradeResult, Verdict
from swe_rl.task import PytestRunner, RewardFileRunner, Runner, SwebenchRunner, SweTask

SandboxFactory = Callable[[], Awaitable[Sandbox]]
_LOG_TAIL = 4000
_READ_REGULAR_FILE = """
import errno, os, stat, sys
path, limit = sys.argv[1], int(sys.argv[2])
flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
try:
    fd = os.open(path, flags)
except FileNotFoundError:
    sys.exit(2)
except OSError as error:
    sys.stderr.write("a symlink" if error.errno == errno.ELOOP else error.strerror or "")
    sys.exit(3)
if not stat.S_ISREG(os.fstat(fd).st_mode):
    sys.stderr.write("not a regular file")
    sys.exit(3)
left = limit + 1
while left > 0:
    chunk = os.read(fd, min(left, 1 << 20))
    if not chunk:
        break
    sys.stdout.buffer.write(chunk)
    left -= len(chunk)
"""
_LIST_BASE = """
import os, stat, subprocess, sys
root = sys.argv[1]
try:
    done = subprocess.run(
        ["git", "-c", "safe.directory=*", "ls-tree", "-r", "-z", "HEAD"],
        cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
except OSError:
    done = None
if done is not None and (done.returncode == 0 or os.path.isdir(os.path.join(root, ".git"))):
    sys.stdout.buffer.write(done.stdout)
    sys.stderr.buffer.write(done.stderr)
    sys.exit(done.returncode)
# No repository (a Harbor image's working directory): its files as git would list them.
out = []
for top, dirs, files in os.walk(root):
    dirs[:] = [d for d in dirs if d != ".git" and not os.path.islink(os.path.join(top, d))]
    for name in files + [d for d in os.listdir(top) if os.path.islink(os.path.join(top, d))]:
        path = os.path.join(top, name)
        mode = os.lstat(path).st_mode
        kind = "120000" if stat.S_ISLNK(mode) else "100755" if mode & 0o111 else "100644"
        rel = os.path.relpath(path, root).encode("utf-8", "surrogateescape")
        out.append(kind.encode() + b" blob 0" + bytes([9]) + rel)
sys.stdout.buffer.write(bytes(1).join(sorted(set(out))))
"""
_PREPARE_REWARD = """
import os, sys
path = sys.argv[1]
try:
    os.unlink(path)
except FileNotFoundError:
    pass
os.makedirs(os.path.dirname(path), exist_ok=True)
"""
_MISSING_EXIT, _NOT_REGULAR_EXIT = 2, 3


class GradingError(RuntimeError):
    """The task or the infrastructure failed: no trustworthy reward exists."""


class EnvironmentFailure(GradingError):
    """The task's environment cannot run its tests at all (no interpreter, no test framework,
    no such command), proven before the agent's change was applied: never a reward."""


@dataclass(frozen=True, slots=True)
class GradingLimits:
    """Bounds of one grading. A change over `max_patch_bytes` is refused (earning 0), never
    split or applied; a report over `max_report_bytes` counts as no report."""

    max_patch_bytes: int = 16 << 20
    max_report_bytes: int = 64 << 20

    def __post_init__(self) -> None:
        if self.max_patch_bytes <= 0 or self.max_report_bytes <= 0:
            raise ValueError("GradingLimits must be positive")


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


async def grade(
    task: SweTask,
    patch: bytes,
    new_sandbox: SandboxFactory,
    log: GradingLog,
    *,
    limits: GradingLimits | None = None,
) -> GradeResult:
    """Grade `patch` (the agent's captured diff) against `task` in a sandbox from `new_sandbox`."""
    limits = limits or GradingLimits()
    grading = _Grading(task, log, limits)
    sections = await grading.read_change(patch)
    if isinstance(sections, GradeResult):
        return sections
    try:
        box = await new_sandbox()
    except SandboxError as error:
        raise EnvironmentFailure(f"the grading sandbox failed to start: {error}") from error
    async with box:
        return await grading.run(box, sections)


def _disagreement(sections: list[FileSection], by_git: list[bytes]) -> str | None:
    """Why the patch's own headers and git disagree on what it writes, or None (linear; run it
    off the loop)."""
    ours = [section.path for section in sections]
    if ours == by_git:
        return None
    extra = sorted(set(by_git) ^ set(ours))[:3] or by_git[:3]
    return (
        "the patch does not say plainly which files it changes (git would apply "
        f"{len(by_git)} paths, its headers name {len(ours)}; e.g. "
        f"{', '.join(display(p) for p in extra)})"
    )


def _split_by_rules(
    rules: ChangeRules, sections: list[FileSection], base: Mapping[bytes, int]
) -> tuple[dict[bytes, str], set[bytes], bytes]:
    """(refused paths and why, the paths applied, the patch of what is applied): linear in the
    change; run it off the loop."""
    refused = rules.refused(sections, base)
    kept = [s for s in sections if not any(p in refused for p in s.paths)]
    applied = {path for section in kept for path in section.paths}
    return refused, applied, join_sections(kept)


class _Grading:
    """One grading: the steps of the module docstring, in order."""

    def __init__(self, task: SweTask, log: GradingLog, limits: GradingLimits) -> None:
        self.task = task
        self.log = log
        self.limits = limits
        self.wanted = task.grading.fail_to_pass + task.grading.pass_to_pass
        self.refused: dict[str, str] = {}

    async def read_change(self, patch: bytes) -> list[FileSection] | GradeResult:
        """The change's sections, or its refusal as a whole."""
        if len(patch) > self.limits.max_patch_bytes:
            return self.refuse(
                f"the change is {len(patch)} bytes, over the "
                f"{self.limits.max_patch_bytes}-byte limit"
            )
        try:
            sections = await asyncio.to_thread(split_patch, patch)
            by_git = await git_apply_paths(patch) if patch.strip() else []
        except PatchError as error:
            return self.refuse(f"the change is not a patch git can read: {error}")
        disagreement = await asyncio.to_thread(_disagreement, sections, by_git)
        if disagreement is not None:
            return self.refuse(disagreement)
        return sections

    async def run(self, box: Sandbox, sections: list[FileSection]) -> GradeResult:
        await self._setup(box)
        test_patch = self.task.grading.test_patch.encode()
        test_sections = await self._apply_test_patch(box, test_patch)
        base = await self._base(box)
        for section in test_sections:
            if section.deleted:
                base.pop(section.path, None)
            else:
                base[section.path] = section.mode or base.get(section.path, 0o100644)
        paths = runners.Paths(box.workspace, f"/tmp/grading-{uuid.uuid4().hex}")
        runner = self.task.grading.runner
        await self._preflight(box, runner)
        plugins: tuple[str, ...] = ()
        if isinstance(runner, SwebenchRunner) and runner.framework == "pytest":
            plugins = await self._environment_plugins(box, runner)
        elif isinstance(runner, PytestRunner):
            plugins = runner.plugins
        config = await self._pytest_config(box, paths) if _runs_pytest(runner) else None
        rules = ChangeRules(
            test_patch_paths=frozenset(p for s in test_sections for p in s.paths),
            plugins=frozenset(plugins),
            test_files=frozenset(p.encode() for p in runners.test_files(runner, self.wanted)),
            config_files=frozenset([config.encode()] if config and config[0] != "/" else []),
            runner_files=_runner_files(runner),
        )
        refused, applied, kept = await asyncio.to_thread(_split_by_rules, rules, sections, base)
        self.refused = {display(path): why for path, why in sorted(refused.items())}
        for path, why in self.refused.items():
            self.log.note(f"not applied: {path} ({why})")
        try:
            await apply_diff(box, kept)
        except (SandboxCommandError, UnsafePatchError) as error:
            self.log.note(f"the agent's patch does not apply: {error}")
            return self.refuse(f"the change does not apply to the base: {error}")
        config_path = await self._write_config(box, paths, config)
        run = runners.plan(runner, self.wanted, paths, config_path, plugins)
        await self._write_tools(box, paths)
        if isinstance(runner, RewardFileRunner):
            await self._place_tests(box, runner)
        result = await box.exec(run.command, env=run.env, timeout=self.task.grading.timeout_s)
        self.log.command(f"tests: {run.command}", result)
        await self._stop_everything(box)
        if run.report in ("stdout", "log"):
            report: bytes | str = result.stdout.encode("utf-8", "surrogateescape")
        elif isinstance(runner, RewardFileRunner):
            report = await self._read_report(box, runner.reward_file)
        else:
            report = await self._read_report(box, paths.report)
        if isinstance(runner, SwebenchRunner):
            return await self._swebench_verdict(runner, report, run.report, result, applied)
        if isinstance(runner, RewardFileRunner):
            return self._reward_verdict(report, result)
        return self._verdict(report, run.report, result, applied)

    def refuse(self, reason: str) -> GradeResult:
        self.log.note(f"change refused: {reason}")
        return GradeResult(
            Verdict.CHANGE_REFUSED,
            reason,
            dict.fromkeys(self.wanted, "missing"),
            self.refused,
        )

    async def _setup(self, box: Sandbox) -> None:
        task = self.task
        try:
            for result in await run_setup(box, task.setup_commands, timeout=task.grading.timeout_s):
                self.log.command("setup", result)
        except SetupFailedError as error:
            self.log.command(f"setup: {error.command}", error.result)
            raise GradingError(f"setup failed in the grading sandbox: {error.command}") from error

    async def _apply_test_patch(self, box: Sandbox, test_patch: bytes) -> list[FileSection]:
        if not test_patch.strip():
            return []
        try:
            sections = await asyncio.to_thread(split_patch, test_patch)
            await apply_diff(box, test_patch)
        except (PatchError, SandboxError) as error:
            raise GradingError(f"the task's test patch does not apply: {error}") from error
        return sections

    async def _preflight(self, box: Sandbox, runner: Runner) -> None:
        """Prove the runner can start here, before anything of the agent's is applied."""
        command = runners.preflight(runner, box.workspace)
        if command is None:
            return
        result = await box.exec(command, env={"PYTHONDONTWRITEBYTECODE": "1"}, timeout=300)
        if result.exit_code in (runners.CANNOT_START, 126):
            self.log.command("preflight", result)
            why = (result.stderr.strip() or result.stdout.strip() or "no message")[-500:]
            raise EnvironmentFailure(f"the test runner cannot start: {why}")
        if not result.ok:
            self.log.command("preflight", result)
            raise GradingError(f"checking the test runner failed (exit {result.exit_code})")

    async def _environment_plugins(self, box: Sandbox, runner: SwebenchRunner) -> tuple[str, ...]:
        """The pytest plugins the environment's installed distributions declare, listed with
        its own interpreter before the change is applied (autoloading stays off)."""
        q = shlex.quote
        command = (
            f"{runners.prelude(runner.prelude)}exec {q(runner.python)} "
            f"-c {q(runners.LIST_PYTEST_PLUGINS)}"
        )
        listed = await box.exec(command, timeout=300)
        try:
            names = json.loads(listed.stdout) if listed.ok else None
        except ValueError:
            names = None
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            self.log.command("listing pytest plugins", listed)
            raise GradingError("listing the environment's pytest plugins failed")
        self.log.note(f"pytest plugins of the environment: {', '.join(names) or '(none)'}")
        return tuple(names)

    async def _place_tests(self, box: Sandbox, runner: RewardFileRunner) -> None:
        """The task's tests directory, from the host, after the agent's change: nothing of the
        agent's workspace is among them. The reward file's directory is made empty."""
        try:
            files = await asyncio.to_thread(_read_tree, runner.tests_dir)
        except OSError as error:
            raise GradingError(f"reading the task's tests {runner.tests_dir}: {error}") from None
        try:
            for relative, data, executable in files:
                target = f"{runner.tests_path}/{relative}"
                await box.write_file(target, data)
                if executable:
                    await box.run_python("import os,sys; os.chmod(sys.argv[1], 0o755)", [target])
            made = await box.run_python(_PREPARE_REWARD, [runner.reward_file], timeout=60)
        except SandboxError as error:
            raise GradingError(f"placing the task's tests failed: {error}") from error
        if not made.ok:
            raise GradingError(f"preparing the reward file failed: {made.stderr.strip()}")
        self.log.note(f"placed {len(files)} test files at {runner.tests_path}")

    async def _base(self, box: Sandbox) -> dict[bytes, int]:
        """Each path of the base commit and its git mode."""
        listed = await box.run_python(_LIST_BASE, [box.workspace], timeout=300)
        if not listed.ok:
            raise GradingError(f"listing the base commit failed: {listed.stderr.strip()}")
        base = {}
        for entry in listed.stdout.split(b"\0"):
            info, _, path = entry.partition(b"\t")
            if path:
                base[path] = int(info.split(b" ", 1)[0], 8)
        return base

    async def _pytest_config(self, box: Sandbox, paths: runners.Paths) -> str | None:
        """The file pytest takes its configuration from: the task's own (written later, at a
        fresh name), or the one the repository has at the base (relative to the root), or a
        fresh empty one; never one the agent's change can add or alter."""
        runner = self.task.grading.runner
        if isinstance(runner, PytestRunner) and runner.config is not None:
            return f"{paths.workspace}/.agent-rl-pytest-{uuid.uuid4().hex}.ini"
        found = await box.run_python(
            runners.LOCATE_PYTEST_CONFIG, runners.locate_config_args(box.workspace), timeout=60
        )
        if not found.ok:
            raise GradingError(f"locating pytest's configuration failed: {found.stderr}")
        name = found.stdout.decode()
        self.log.note(f"pytest configuration: {name or '(none in the repository)'}")
        if not name:
            return f"{paths.workspace}/.agent-rl-pytest-{uuid.uuid4().hex}.ini"
        return name

    async def _write_config(
        self, box: Sandbox, paths: runners.Paths, config: str | None
    ) -> str | None:
        """The `-c` path for pytest, writing the task's configuration (or an empty one) where
        one is due."""
        runner = self.task.grading.runner
        if config is None or not _runs_pytest(runner):
            return None
        if config.startswith("/"):
            own = runner.config if isinstance(runner, PytestRunner) else None
            await box.write_file(config, own or "[pytest]\n")
            return config
        return f"{paths.workspace}/{config}"

    async def _write_tools(self, box: Sandbox, paths: runners.Paths) -> None:
        tools = resources.files("swe_rl.grading").joinpath("tools")
        for name in runners.TOOLS:
            await box.write_file(f"{paths.tools}/{name}", tools.joinpath(name).read_bytes())
        await box.write_file(paths.wanted, "".join(f"{test_id}\n" for test_id in self.wanted))

    async def _stop_everything(self, box: Sandbox) -> None:
        """Nothing the code under test started may touch the report once the run is over."""
        try:
            await box.kill_all()
        except SandboxError as error:
            raise GradingError(f"stopping the test run's processes failed: {error}") from error

    async def _read_report(self, box: Sandbox, path: str) -> bytes | str:
        """The report's bytes, or why there is none."""
        limit = self.limits.max_report_bytes
        read = await box.run_python(
            _READ_REGULAR_FILE, [path, str(limit)], timeout=120, max_output_bytes=limit + 1
        )
        if read.exit_code == _MISSING_EXIT:
            return "the test run wrote no report"
        if read.exit_code == _NOT_REGULAR_EXIT:
            return f"the report path holds no regular file ({read.stderr.strip()})"
        if read.truncated or len(read.stdout) > limit:
            return f"the report is larger than {limit} bytes"
        if not read.ok:
            raise GradingError(f"reading the report failed: {read.stderr.strip()}")
        return read.stdout

    def _verdict(
        self,
        report: bytes | str,
        report_format: runners.ReportFormat,
        result: ExecResult,
        applied: Collection[bytes],
    ) -> GradeResult:
        missing = dict.fromkeys(self.wanted, "missing")
        if result.timed_out:
            reason = f"the tests ran past their {self.task.grading.timeout_s:.0f} s limit"
            return self._result(Verdict.TESTS_TIMED_OUT, reason, missing, timed_out=True)
        if not report:
            report = "the test run wrote no report"
        if isinstance(report, str):
            return self._result(Verdict.NO_REPORT, report, missing)
        parse = parse_json_report if report_format == "stdout" else parse_junit_report
        try:
            parsed = parse(report)
        except ReportError as error:
            return self._result(Verdict.NO_REPORT, f"unusable report: {error}", missing)
        tests = parsed.outcomes(self.wanted)
        for test_id, file in parsed.files.items():
            if test_id in tests and file.encode() in applied:
                tests[test_id] = "error"
                self.log.note(f"{test_id}: its file {file} was changed by the agent")
        for test_id, status in tests.items():
            self.log.note(f"{status:>8}  {test_id}")
        if parsed.collection_errors:
            where, why = next(iter(parsed.collection_errors.items()))
            first = why.strip().splitlines()[-1:] or [""]
            reason = f"the tests could not be collected: {where}: {first[0][:300]}"
            return self._result(
                Verdict.COLLECTION_ERROR, reason, tests, errors=parsed.collection_errors
            )
        failing = [(test_id, s) for test_id, s in tests.items() if s not in PASSING_STATUSES]
        if not failing:
            return self._result(Verdict.RESOLVED, "every wanted test passes", tests)
        first_id, first_status = failing[0]
        reason = f"{len(failing)} of {len(tests)} tests do not pass ({first_id}: {first_status})"
        return self._result(Verdict.UNRESOLVED, reason, tests)

    async def _swebench_verdict(
        self,
        runner: SwebenchRunner,
        report: bytes | str,
        report_format: runners.ReportFormat,
        result: ExecResult,
        applied: Collection[bytes],
    ) -> GradeResult:
        """The harness's parser reads what our runner reported (never the printed log)."""
        missing = dict.fromkeys(self.wanted, "missing")
        if result.timed_out:
            reason = f"the tests ran past their {self.task.grading.timeout_s:.0f} s limit"
            return self._result(Verdict.TESTS_TIMED_OUT, reason, missing, timed_out=True)
        if isinstance(report, str) or not report:
            return self._result(
                Verdict.NO_REPORT, report or "the test run wrote no report", missing
            )
        try:
            parser = await asyncio.to_thread(swebench_log.load_parser, runner.parser)
        except swebench_log.ParserUnavailableError as error:
            raise GradingError(str(error)) from None
        errors: Mapping[str, str] = {}
        try:
            if report_format == "log":
                log = parse_log_report(report).log
            else:
                parsed: TestReport = parse_json_report(report)
                errors = parsed.collection_errors
                log = swebench_log.pytest_summary(parsed)
        except ReportError as error:
            return self._result(Verdict.NO_REPORT, f"unusable report: {error}", missing)
        self.log.note(f"--- what the parser read ---\n{log[-_LOG_TAIL:]}")
        status_map = await asyncio.to_thread(swebench_log.parse, parser, log, runner.repo)
        tests = swebench_log.outcomes(status_map, self.wanted)
        for test_id, status in tests.items():
            self.log.note(f"{status:>8}  {test_id}")
        grading = self.task.grading
        failing = swebench_log.failing(tests, grading.fail_to_pass, grading.pass_to_pass)
        if not failing:
            return self._result(Verdict.RESOLVED, "every wanted test passes", tests)
        if errors and all(tests[t] == "missing" for t, _ in failing):
            where, why = next(iter(errors.items()))
            first = why.strip().splitlines()[-1:] or [""]
            reason = f"the tests could not be collected: {where}: {first[0][:300]}"
            return self._result(Verdict.COLLECTION_ERROR, reason, tests, errors=errors)
        first_id, first_status = failing[0]
        reason = f"{len(failing)} of {len(tests)} tests do not pass ({first_id}: {first_status})"
        return self._result(Verdict.UNRESOLVED, reason, tests)

    def _reward_verdict(self, report: bytes | str, result: ExecResult) -> GradeResult:
        """A Harbor verifier's reward: one number in [0, 1] in its reward file."""
        if result.timed_out:
            reason = f"the tests ran past their {self.task.grading.timeout_s:.0f} s limit"
            return self._result(Verdict.TESTS_TIMED_OUT, reason, {}, timed_out=True)
        if isinstance(report, str):
            return self._result(Verdict.NO_REPORT, report.replace("report", "reward file"), {})
        value = _reward_value(report)
        if value is None:
            shown = report[:80].decode("utf-8", "replace")
            return self._result(
                Verdict.NO_REPORT, f"the reward file holds no reward: {shown!r}", {}
            )
        self.log.note(f"reward file: {value}")
        if value >= 1.0:
            return self._result(
                Verdict.RESOLVED, "the verifier gave the full reward", {}, score=1.0
            )
        return self._result(
            Verdict.UNRESOLVED, f"the verifier gave a reward of {value:g}", {}, score=value
        )

    def _result(
        self,
        verdict: Verdict,
        reason: str,
        tests: Mapping[str, str],
        *,
        timed_out: bool = False,
        errors: Mapping[str, str] | None = None,
        score: float | None = None,
    ) -> GradeResult:
        if self.refused and verdict is not Verdict.RESOLVED:
            reason += f"; {len(self.refused)} refused: " + ", ".join(
                f"{path} ({why})" for path, why in list(self.refused.items())[:3]
            )
        self.log.note(f"verdict: {verdict}: {reason}")
        return GradeResult(
            verdict, reason, tests, self.refused, timed_out, True, dict(errors or {}), score
        )


#: The files a repository's own test runner is made of, where they are not in a test directory.
_RUNNER_FILES = {
    "sympy": frozenset({b"bin/test", b"sympy/utilities/runtests.py"}),
    "django": frozenset({b"tests/runtests.py"}),
}


def _runner_files(runner: Runner) -> frozenset[bytes]:
    if isinstance(runner, SwebenchRunner):
        return _RUNNER_FILES.get(runner.framework, frozenset())
    return frozenset()


def _runs_pytest(runner: Runner) -> bool:
    return isinstance(runner, PytestRunner) or (
        isinstance(runner, SwebenchRunner) and runner.framework == "pytest"
    )


def _reward_value(data: bytes) -> float | None:
    """The reward a Harbor verifier wrote: a number (reward.txt), or {"reward": number}
    (reward.json); None unless it is one finite number in [0, 1]."""
    try:
        text = data.decode("utf-8").strip()
        value = json.loads(text)
    except ValueError:
        return None
    if isinstance(value, dict):
        value = value.get("reward")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) and 0.0 <= number <= 1.0 else None


def _read_tree(root: str) -> list[tuple[str, bytes, bool]]:
    """Every regular file under `root` (a task's tests directory on the host): its relative
    path, bytes and whether it is executable; links are not followed."""
    files = []
    for top, dirs, names in os.walk(root):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(top, name)
            mode = os.lstat(path).st_mode
            if stat.S_ISREG(mode):
                with open(path, "rb") as handle:
                    data = handle.read()
                files.append((os.path.relpath(path, root), data, bool(mode & 0o111)))
    if not files:
        raise FileNotFoundError(f"no test files in {root}")
    return files
