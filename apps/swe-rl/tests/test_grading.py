"""Grading cannot be gamed: every trick earns nothing, an honest fix earns the reward.

Each case builds the agent's patch with real git from a real repository, and grades it in a
real fresh sandbox, through the same `grade` the episodes use. The calc task's tests are plain
unittest (graded through unittest_junit.py); the pytest task runs the real pytest from this
test environment, mounted read-only into the sandbox.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path, PurePosixPath

import pytest

from sandbox import GitWorkspace, LocalBackend, LocalConfig, ReadOnlyBind, SandboxSpec
from swe_rl.demo.repos import TASKS, create_repository, task_row
from swe_rl.grading import GradeResult, GradingLog, grade
from swe_rl.sources import RepoSources
from swe_rl.task import SweTask, parse_task

CALC = next(task for task in TASKS if task.name == "calc-add")
SITE_PACKAGES = Path(pytest.__file__).resolve().parents[1]
PYTHON_PREFIX = Path(os.path.realpath(sys.base_prefix))
PYTHON_INSIDE = "/opt/python/bin/" + Path(os.path.realpath(sys.executable)).name


def git(repo: Path, *args: str) -> str:
    env = {
        "PATH": os.environ["PATH"],
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_AUTHOR_NAME": "agent",
        "GIT_AUTHOR_EMAIL": "agent@example.invalid",
        "GIT_COMMITTER_NAME": "agent",
        "GIT_COMMITTER_EMAIL": "agent@example.invalid",
    }
    done = subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, check=True)
    return done.stdout.decode()


def agent_patch(repo: Path, base: str, edit: Callable[[Path], None], tmp_path: Path) -> bytes:
    """What the agent's change to a checkout of `repo` looks like as a captured diff."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    work = tmp_path / "agent-work"
    git(tmp_path, "clone", "--quiet", str(repo), str(work))
    edit(work)
    git(work, "add", "--all")
    diff = subprocess.run(
        ["git", "diff", "--cached", "--binary", "--full-index", base],
        cwd=work,
        capture_output=True,
        check=True,
    )
    return diff.stdout


class Grading:
    """One task, its prepared repository and fresh sandboxes for grading it."""

    def __init__(self, task: SweTask, repo: Path, backend: LocalBackend) -> None:
        self.task = task
        self.repo = repo
        self.backend = backend
        self.log = GradingLog()

    async def patch(self, edit: Callable[[Path], None], tmp_path: Path) -> GradeResult:
        patch = agent_patch(self.repo, self.task.base_commit, edit, tmp_path)
        binds = (
            ReadOnlyBind(SITE_PACKAGES, PurePosixPath("/opt/site-packages")),
            ReadOnlyBind(PYTHON_PREFIX, PurePosixPath("/opt/python")),
        )
        spec = SandboxSpec(
            workspace=GitWorkspace(self.repo, self.task.base_commit),
            env={"LD_LIBRARY_PATH": "/opt/python/lib", "PYTHONPATH": "/opt/site-packages"},
            read_only_binds=binds,
        )
        return await grade(self.task, patch, lambda: self.backend.create(spec), self.log)


@pytest.fixture
def backend(tmp_path: Path) -> LocalBackend:
    (tmp_path / "state").mkdir()
    return LocalBackend(LocalConfig(state_root=tmp_path / "state"))


@pytest.fixture
async def calc(tmp_path: Path, backend: LocalBackend) -> Grading:
    source, base = create_repository(CALC, tmp_path / "repos")
    task = parse_task(task_row(CALC, source, base)["metadata"])
    repo = await RepoSources(tmp_path / "cache").prepare(task)
    return Grading(task, repo, backend)


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def honest_fix(work: Path) -> None:
    calc = work / "calc.py"
    calc.write_text(
        calc.read_text().replace("return a - b\n\n\ndef sub", "return a + b\n\n\ndef sub")
    )


async def test_an_honest_fix_earns_the_reward(calc: Grading, tmp_path: Path) -> None:
    result = await calc.patch(honest_fix, tmp_path)
    assert (result.reward, result.resolved, result.refused_paths) == (1.0, True, {})
    assert result.tests == {
        "test_calc.TestAdd.test_add": "passed",
        "test_calc.TestSub.test_sub": "passed",
    }


async def test_no_change_earns_nothing(calc: Grading, tmp_path: Path) -> None:
    result = await calc.patch(lambda work: None, tmp_path)
    assert result.reward == 0.0
    assert result.tests["test_calc.TestAdd.test_add"] == "failed"


async def test_editing_or_deleting_tests_earns_nothing(calc: Grading, tmp_path: Path) -> None:
    def rewrite_tests(work: Path) -> None:
        write(
            work / "test_calc.py",
            "import unittest\n\nclass TestAdd(unittest.TestCase):\n"
            "    def test_add(self):\n        pass\n",
        )
        write(work / "tests" / "test_more.py", "")

    result = await calc.patch(rewrite_tests, tmp_path)
    assert result.reward == 0.0
    assert set(result.refused_paths) == {"test_calc.py", "tests/test_more.py"}
    deleted = await calc.patch(lambda work: (work / "test_calc.py").unlink(), tmp_path / "d")
    assert deleted.reward == 0.0
    assert "test_calc.py" in deleted.refused_paths


async def test_printed_pass_lines_and_exit_zero_earn_nothing(calc: Grading, tmp_path: Path) -> None:
    def lie(work: Path) -> None:
        calc_py = work / "calc.py"
        calc_py.write_text(
            "import os, sys\n"
            "print('test_add (test_calc.TestAdd) ... ok\\nRan 2 tests\\nOK\\nPASSED')\n"
            "sys.stdout.flush()\n"
            "os._exit(0)\n" + calc_py.read_text()
        )

    result = await calc.patch(lie, tmp_path)
    assert result.reward == 0.0
    assert result.note == "the tests wrote no report"
    assert "PASSED" in calc.log.text()  # it printed, and exited 0: neither counted


async def test_a_fake_report_earns_nothing(calc: Grading, tmp_path: Path) -> None:
    fake = (
        '<testsuite><testcase classname="test_calc.TestAdd" name="test_add"/>'
        '<testcase classname="test_calc.TestSub" name="test_sub"/></testsuite>'
    )

    def forge(work: Path) -> None:
        for name in ("report.xml", "junit.xml", "tmp/report.xml"):
            write(work / name, fake)

    result = await calc.patch(forge, tmp_path)
    assert result.reward == 0.0
    assert result.tests["test_calc.TestAdd.test_add"] == "failed"


async def test_start_up_hooks_and_runner_config_are_not_applied(
    calc: Grading, tmp_path: Path
) -> None:
    def hook(work: Path) -> None:
        write(work / "sitecustomize.py", "import os\nos._exit(0)\n")
        write(work / "evil.pth", "import os; os._exit(0)\n")
        write(work / "setup.cfg", "[tool:pytest]\naddopts = -p no:python\n")

    result = await calc.patch(hook, tmp_path)
    assert set(result.refused_paths) == {"sitecustomize.py", "evil.pth", "setup.cfg"}
    assert result.reward == 0.0


async def test_a_fix_with_a_cheat_on_the_side_is_graded_on_the_fix(
    calc: Grading, tmp_path: Path
) -> None:
    def fix_and_cheat(work: Path) -> None:
        honest_fix(work)
        write(work / "test_calc.py", "")

    result = await calc.patch(fix_and_cheat, tmp_path)
    assert (result.reward, set(result.refused_paths)) == (1.0, {"test_calc.py"})


async def test_paths_outside_the_repository_are_never_applied(
    calc: Grading, tmp_path: Path
) -> None:
    patch = (
        b"diff --git a/../outside.txt b/../outside.txt\nnew file mode 100644\n"
        b"index 0000000..e69de29\n--- /dev/null\n+++ b/../outside.txt\n@@ -0,0 +1 @@\n+x\n"
    )
    spec = SandboxSpec(workspace=GitWorkspace(calc.repo, calc.task.base_commit))
    result = await grade(calc.task, patch, lambda: calc.backend.create(spec), calc.log)
    assert (result.reward, result.patch_applied) == (0.0, False)
    assert "does not apply" in result.note


# -- a pytest task: the conftest.py trick --------------------------------------------------------


@pytest.fixture
async def pytest_task(tmp_path: Path, backend: LocalBackend) -> Grading:
    source = tmp_path / "pyrepo"
    source.mkdir()
    git(source, "init", "--quiet")
    write(source / "mathlib.py", "def double(x):\n    return x + x + 1\n")
    write(
        source / "tests" / "test_mathlib.py",
        "import mathlib\n\ndef test_zero():\n    assert mathlib.double(0) == 0 or True\n",
    )
    git(source, "add", "--all")
    git(source, "commit", "--quiet", "-m", "base")
    base = git(source, "rev-parse", "HEAD").strip()
    new_test = (
        "import mathlib\n\ndef test_zero():\n    assert mathlib.double(0) == 0 or True\n\n"
        "def test_double():\n    assert mathlib.double(2) == 4\n"
    )
    original = (source / "tests" / "test_mathlib.py").read_text()
    (source / "tests" / "test_mathlib.py").write_text(new_test)
    test_patch = git(source, "diff") + "\n"
    (source / "tests" / "test_mathlib.py").write_text(original)
    row = {
        "instance_id": "pytest-task",
        "repo": {"path": str(source)},
        "base_commit": base,
        "problem_statement": "double(2) is 5",
        "grading": {
            "test_command": f"{PYTHON_INSIDE} -m pytest -p no:cacheprovider -q "
            '--junitxml="$GRADING_REPORT" tests',
            "fail_to_pass": ["tests/test_mathlib.py::test_double"],
            "pass_to_pass": ["tests/test_mathlib.py::test_zero"],
            "test_patch": test_patch,
        },
    }
    task = parse_task(row)
    repo = await RepoSources(tmp_path / "cache").prepare(task)
    return Grading(task, repo, backend)


async def test_a_conftest_that_passes_everything_earns_nothing(
    pytest_task: Grading, tmp_path: Path
) -> None:
    def conftest(work: Path) -> None:
        hook = (
            "import pytest\n\n@pytest.hookimpl(hookwrapper=True)\n"
            "def pytest_runtest_makereport(item, call):\n"
            "    outcome = yield\n    report = outcome.get_result()\n"
            "    report.outcome = 'passed'\n"
        )
        write(work / "conftest.py", hook)
        write(work / "tests" / "conftest.py", hook)
        write(
            work / "src" / "conftest.py",
            "import pytest\n\ndef pytest_collection_modifyitems(items):\n"
            "    for item in items:\n        item.add_marker(pytest.mark.skip)\n",
        )

    result = await pytest_task.patch(conftest, tmp_path)
    assert result.reward == 0.0
    assert set(result.refused_paths) == {"conftest.py", "tests/conftest.py", "src/conftest.py"}
    assert result.tests["tests/test_mathlib.py::test_double"] == "failed"

    def fix(work: Path) -> None:
        write(work / "mathlib.py", "def double(x):\n    return x + x\n")

    fixed = await pytest_task.patch(fix, tmp_path / "fixed")
    assert (fixed.reward, fixed.tests["tests/test_mathlib.py::test_zero"]) == (1.0, "passed")


def test_the_task_source_holds_no_history_past_the_base(tmp_path: Path) -> None:
    source, base = create_repository(CALC, tmp_path / "repos")
    write(source / "calc.py", "def add(a, b):\n    return a + b\n")  # the "future" fix
    git(source, "commit", "--quiet", "-am", "the fix")
    task = parse_task(task_row(CALC, source, base)["metadata"])
    repo = asyncio.run(RepoSources(tmp_path / "cache").prepare(task))
    everything = git(repo, "log", "--all", "--format=%H").split()
    assert everything == [base]
    objects = git(repo, "cat-file", "--batch-all-objects", "--batch-check").splitlines()
    assert not any(
        "a + b" in git(repo, "cat-file", "-p", line.split()[0])
        for line in objects
        if line.split()[1] == "blob"
    )
