"""`grade()` on patches no capture would produce, runners that no repository configures, report
channels no leftover process can reach, and a patch of megabytes that never holds the loop.

The episode-level tricks are in test_grading_attacks.py; here `grade()` is driven directly with
patches built by real git (or crafted byte by byte where the point is a malformed patch), in
real fresh sandboxes, with the test environment's real pytest mounted read-only.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from machine_load import run_delay, slowdown

from sandbox import GitWorkspace, LocalBackend, LocalConfig, SandboxSpec
from swe_rl.grading import GradeResult, GradingLimits, GradingLog, Verdict, grade
from swe_rl.grading.report import parse_json_report
from swe_rl.grading.runners import TOOLS, Paths, plan
from swe_rl.sources import RepoSources
from swe_rl.task import PytestRunner, SweTask, parse_task

from .attack_tasks import (
    FIXED,
    PYTHON_INSIDE,
    TOOLCHAIN_BINDS,
    TOOLCHAIN_ENV,
    TaskRepo,
    git,
    make_task,
)

WANTED = "tests/test_mathlib.py::test_double"


class Grader:
    """One task, its prepared repository and fresh sandboxes to grade patches in."""

    def __init__(self, task: SweTask, repo: Path, source: Path, backend: LocalBackend) -> None:
        self.task = task
        self.repo = repo
        self.source = source
        self.backend = backend
        self.log = GradingLog()
        assert task.base_commit is not None
        self.base = task.base_commit
        self.spec = SandboxSpec(
            workspace=GitWorkspace(repo, self.base),
            env=TOOLCHAIN_ENV,
            read_only_binds=TOOLCHAIN_BINDS,
        )

    def patch(self, edit: Callable[[Path], None], tmp_path: Path) -> bytes:
        """The agent's change as a patch, made with real git in a clone of the task."""
        work = tmp_path / f"work-{time.monotonic_ns()}"
        git(tmp_path, "clone", "--quiet", str(self.source), str(work))
        edit(work)
        git(work, "add", "--all")
        done = subprocess.run(
            ["git", "diff", "--cached", "--binary", "--full-index", self.base],
            cwd=work,
            capture_output=True,
            check=True,
        )
        return done.stdout

    async def grade(self, patch: bytes, limits: GradingLimits | None = None) -> GradeResult:
        self.log = GradingLog()
        return await grade(
            self.task, patch, lambda: self.backend.create(self.spec), self.log, limits=limits
        )


async def grader_for(task: TaskRepo, tmp_path: Path, **grading: Any) -> Grader:
    (tmp_path / "state").mkdir(exist_ok=True)
    metadata = {**task.row["metadata"], "grading": {**task.row["metadata"]["grading"], **grading}}
    parsed = parse_task(metadata)
    repo = await RepoSources(tmp_path / "sources").prepare(parsed)
    backend = LocalBackend(LocalConfig(state_root=tmp_path / "state"))
    return Grader(parsed, repo, task.path, backend)


@pytest.fixture
async def mathlib(tmp_path: Path) -> Grader:
    return await grader_for(make_task(tmp_path / "repos", "pytest", "patch"), tmp_path)


def fix(work: Path) -> None:
    (work / "mathlib.py").write_text(FIXED)


async def test_a_fix_is_resolved_and_nothing_is_unresolved(mathlib: Grader, tmp_path: Path) -> None:
    fixed = await mathlib.grade(mathlib.patch(fix, tmp_path))
    assert (fixed.reward, fixed.verdict, fixed.refused_paths) == (1.0, Verdict.RESOLVED, {})
    assert fixed.tests == {WANTED: "passed", "tests/test_mathlib.py::test_type": "passed"}
    nothing = await mathlib.grade(b"")
    assert (nothing.reward, nothing.verdict) == (0.0, Verdict.UNRESOLVED)
    assert nothing.reason == f"1 of 2 tests do not pass ({WANTED}: failed)"


async def test_a_patch_hiding_a_second_file_after_its_hunk_is_refused_whole(
    mathlib: Grader, tmp_path: Path
) -> None:
    honest = mathlib.patch(fix, tmp_path)
    hidden = b"--- a/conftest.py\n+++ b/conftest.py\n@@ -0,0 +1,2 @@\n+import os\n+os._exit(0)\n"
    result = await mathlib.grade(honest + hidden)
    assert (result.reward, result.verdict, result.patch_applied) == (
        0.0,
        Verdict.CHANGE_REFUSED,
        False,
    )
    assert "does not say plainly which files it changes" in result.reason
    assert "conftest.py" in result.reason


async def test_paths_outside_the_repository_or_in_git_are_refused_beside_a_fix(
    mathlib: Grader, tmp_path: Path
) -> None:
    honest = mathlib.patch(fix, tmp_path)
    outside = (
        b"diff --git a/../outside.txt b/../outside.txt\nnew file mode 100644\n"
        b"index 0000000..e69de29\n--- /dev/null\n+++ b/../outside.txt\n@@ -0,0 +1 @@\n+x\n"
    )
    result = await mathlib.grade(honest + outside)
    assert (result.reward, result.refused_paths) == (
        1.0,
        {"../outside.txt": "outside the repository"},
    )
    in_git = (
        b"diff --git a/.git/hooks/post-checkout b/.git/hooks/post-checkout\n"
        b"new file mode 100755\nindex 0000000..e69de29\n--- /dev/null\n"
        b"+++ b/.git/hooks/post-checkout\n@@ -0,0 +1 @@\n+x\n"
    )
    result = await mathlib.grade(honest + in_git)
    assert (result.reward, result.refused_paths) == (
        1.0,
        {".git/hooks/post-checkout": "inside .git"},
    )


async def test_symlinks_out_of_the_repository_are_refused(mathlib: Grader, tmp_path: Path) -> None:
    def links(work: Path) -> None:
        fix(work)
        (work / "etc").symlink_to("/etc")
        (work / "up").symlink_to("../../x")
        (work / "hooks").symlink_to(".git/hooks")
        (work / "text.py").symlink_to("helpers/text.py")  # inside: fine

    result = await mathlib.grade(mathlib.patch(links, tmp_path))
    assert result.reward == 1.0
    assert result.refused_paths == {
        "etc": "a symlink pointing outside the repository",
        "hooks": "a symlink pointing into .git",
        "up": "a symlink pointing outside the repository",
    }


@contextlib.contextmanager
def loop_callbacks() -> Iterator[list[tuple[float, float]]]:
    """(wall s less the wait for a CPU, this thread's CPU s) of every event-loop callback run
    meanwhile. The CPU leaves out the cyclic garbage collector's passes: a full pass walks the
    whole test process's heap and lands in whichever callback allocates at the time; it is not
    that callback's work. Over 50 ms, it is divided by how much the host stretches CPU time
    right then (an idle machine's CPU time: see `machine_load`)."""
    original = asyncio.events.Handle._run
    seen: list[tuple[float, float]] = []
    collecting = [0.0, 0.0]  # thread CPU when the current pass started, total CPU in passes

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        if phase == "start":
            collecting[0] = time.thread_time()
        else:
            collecting[1] += time.thread_time() - collecting[0]

    def timed(handle: asyncio.events.Handle) -> None:
        wall, cpu, in_gc = time.perf_counter(), time.thread_time(), collecting[1]
        queued = run_delay()
        try:
            original(handle)
        finally:
            own = time.thread_time() - cpu - (collecting[1] - in_gc)
            held = time.perf_counter() - wall - (run_delay() - queued)
            seen.append((held, own / slowdown(time.thread_time) if own > 0.05 else own))

    asyncio.events.Handle._run = timed  # type: ignore[method-assign,assignment]
    gc.callbacks.append(on_gc)
    try:
        yield seen
    finally:
        gc.callbacks.remove(on_gc)
        asyncio.events.Handle._run = original  # type: ignore[method-assign]


@pytest.mark.parametrize(
    ("megabytes", "verdict"), [(4, Verdict.RESOLVED), (20, Verdict.CHANGE_REFUSED)]
)
async def test_a_patch_of_megabytes_is_graded_or_refused_without_holding_the_loop(
    mathlib: Grader, tmp_path: Path, megabytes: int, verdict: Verdict
) -> None:
    def big(work: Path) -> None:
        fix(work)
        lines = "".join(f"line {n} of a large data file the fix does not need\n" for n in range(10))
        data = work / "data"
        data.mkdir()
        for index in range(megabytes * 2):  # many sections, each about half a megabyte
            (data / f"part{index}.txt").write_text(lines * (512 * 1024 // len(lines)))

    patch = mathlib.patch(big, tmp_path)
    assert len(patch) >= megabytes << 20
    busy = slowdown()
    with loop_callbacks() as callbacks:  # a task: its first step is timed too
        result = await asyncio.ensure_future(mathlib.grade(patch))
    assert result.verdict is verdict, result.reason
    # A callback of ours never uses 50 ms of CPU; no callback at all is held half a second (on an
    # idle machine: on a busy one as much longer as work timed before and after takes).
    slowest = sorted(callbacks, key=lambda c: c[1])[-3:]
    assert max((cpu for _, cpu in callbacks), default=0.0) < 0.05, slowest
    held = max(callbacks, default=(0.0, 0.0))
    assert held[0] < 0.5 * max(busy, slowdown()), held
    if verdict is Verdict.CHANGE_REFUSED:
        assert f"over the {GradingLimits().max_patch_bytes}-byte limit" in result.reason


async def test_the_size_limit_is_configurable(mathlib: Grader, tmp_path: Path) -> None:
    patch = mathlib.patch(fix, tmp_path)
    small = await mathlib.grade(patch, GradingLimits(max_patch_bytes=len(patch) - 1))
    assert small.verdict is Verdict.CHANGE_REFUSED
    assert (await mathlib.grade(patch, GradingLimits(max_patch_bytes=len(patch)))).resolved


# -- the pytest runner is configured by the task, by design -------------------------------------

EVIL_PLUGIN = (
    "import pytest\n\n@pytest.hookimpl(hookwrapper=True)\n"
    "def pytest_runtest_makereport(item, call):\n"
    "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n"
)
PLANTED = {
    "a pytest.toml loading a plugin": {
        "evilplugin.py": EVIL_PLUGIN,
        "pytest.toml": '[pytest]\naddopts = ["-p", "evilplugin"]\npythonpath = ["."]\n',
    },
    "package metadata declaring a pytest11 entry point": {
        "evilplugin.py": EVIL_PLUGIN,
        "evil-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: evil\nVersion: 1.0\n",
        "evil-1.0.dist-info/entry_points.txt": "[pytest11]\nevil = evilplugin\n",
    },
    "a root pytest.py": {"pytest.py": "print('2 passed')\nraise SystemExit(0)\n"},
}


@pytest.mark.parametrize("planted", list(PLANTED), ids=list(PLANTED))
async def test_the_runner_ignores_what_a_repository_plants_even_with_no_rule_applied(
    tmp_path: Path, planted: str
) -> None:
    """No rule refuses these files here: they are written straight into the workspace. The
    naive `python -m pytest` obeys them (the control: the attack is real); our runner, given
    the base's configuration explicitly, autoloading off and started as a script, reports
    the real failure."""
    task = make_task(tmp_path / "repos", "pytest", "base")
    grader = await grader_for(task, tmp_path)
    async with await grader.backend.create(grader.spec) as box:
        for name, text in PLANTED[planted].items():
            await box.write_file(name, text)
        naive = await box.exec(
            f"{PYTHON_INSIDE} -m pytest -q -p no:cacheprovider tests", env=TOOLCHAIN_ENV
        )
        assert naive.ok, naive.stdout + naive.stderr
        assert "2 passed" in naive.stdout, naive.stdout
        paths = Paths(box.workspace, "/tmp/grading-test")
        for tool in TOOLS:
            source = Path(__file__).parents[1] / "src/swe_rl/grading/tools" / tool
            await box.write_file(f"{paths.tools}/{tool}", source.read_bytes())
        runner = PytestRunner(python=PYTHON_INSIDE)
        run = plan(runner, (WANTED,), paths, f"{box.workspace}/pytest.ini")
        result = await box.exec(run.command, env={**TOOLCHAIN_ENV, **run.env})
    report = parse_json_report(result.stdout.encode())
    assert report.tests[WANTED] == "failed", result.stderr


# -- a task's own command and its report file -----------------------------------------------------


def command_runner(after: str) -> str:
    """pytest writing JUnit (xunit1, so cases name their files), then `after`."""
    pytest_run = (
        f"{PYTHON_INSIDE} -m pytest -q -p no:cacheprovider -o junit_family=xunit1 "
        '--junitxml="$GRADING_REPORT" tests'
    )
    return f"{pytest_run}; {after}"


@pytest.mark.parametrize(
    ("after", "verdict", "reason"),
    [
        ("true", Verdict.RESOLVED, "every wanted test passes"),
        (
            'rm "$GRADING_REPORT" && ln -s /dev/zero "$GRADING_REPORT"',
            Verdict.NO_REPORT,
            "the report path holds no regular file (a symlink)",
        ),
        (
            'rm "$GRADING_REPORT" && mkfifo "$GRADING_REPORT"',
            Verdict.NO_REPORT,
            "the report path holds no regular file (not a regular file)",
        ),
        (
            "setsid bash -c 'sleep 1; echo forged > \"$GRADING_REPORT\"' "
            "</dev/null >/dev/null 2>&1 &",
            Verdict.RESOLVED,
            "every wanted test passes",
        ),
    ],
    ids=["plain", "symlink to /dev/zero", "fifo", "daemon rewriting it later"],
)
async def test_a_command_runners_report_is_read_bounded_once_nothing_runs(
    tmp_path: Path, after: str, verdict: Verdict, reason: str
) -> None:
    task = make_task(tmp_path / "repos", "pytest", "patch")
    grader = await grader_for(
        task, tmp_path, runner={"type": "command", "command": command_runner(after)}
    )
    started = time.monotonic()
    result = await grader.grade(grader.patch(fix, tmp_path))
    assert (result.verdict, result.reason) == (verdict, reason), grader.log.text()
    assert time.monotonic() - started < 60  # never waits on a FIFO or reads /dev/zero


async def test_a_timed_out_run_says_so(tmp_path: Path) -> None:
    task = make_task(tmp_path / "repos", "unittest", "patch")
    grader = await grader_for(task, tmp_path, timeout_s=3)

    def hang(work: Path) -> None:
        (work / "mathlib.py").write_text("import time\ntime.sleep(3600)\n" + FIXED)

    result = await grader.grade(grader.patch(hang, tmp_path))
    assert (result.verdict, result.timed_out, result.reward) == (
        Verdict.TESTS_TIMED_OUT,
        True,
        0.0,
    )
    assert result.summary()["timed_out"] is True
    assert "ran past their 3 s limit" in result.reason


async def test_the_summary_is_json_with_non_utf8_names_escaped(
    mathlib: Grader, tmp_path: Path
) -> None:
    def odd(work: Path) -> None:
        fix(work)
        (work / "tests" / b"stray\xff.py".decode("utf-8", "surrogateescape")).write_text("")
        (work / b"data\xfe.txt".decode("utf-8", "surrogateescape")).write_text("")

    result = await mathlib.grade(mathlib.patch(odd, tmp_path))
    summary = result.summary()
    assert result.reward == 1.0
    assert summary["refused_paths"] == {"tests/stray\\xff.py": "inside a test directory"}
    assert json.loads(json.dumps(summary)) == summary
