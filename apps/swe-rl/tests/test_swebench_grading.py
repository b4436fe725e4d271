"""SWE-bench-family grading: the official harness's parsers read what our runners saw, never the
printed log; a forged PASSED line the harness's own way of reading would believe earns nothing.

Real repositories, real sandboxes, the test environment's real Python, pytest and unittest, the
real `swebench` package's parsers. Each attack first proves itself against the printed log (the
harness's parser over the run's output says the wanted test passed), then earns 0 here.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest

from sandbox import GitWorkspace, LocalBackend, LocalConfig, SandboxSpec, apply_diff
from swe_rl.grading import EnvironmentFailure, GradeResult, GradingLog, Verdict, grade
from swe_rl.grading.swebench_log import load_parser, parse
from swe_rl.sources import RepoSources
from swe_rl.task import SweTask, parse_task

from .attack_tasks import (
    FIXED,
    PYTHON_INSIDE,
    TOOLCHAIN_BINDS,
    TOOLCHAIN_ENV,
    git,
    make_task,
)

PYTEST_F2P = "tests/test_mathlib.py::test_double"
PYTEST_P2P = "tests/test_mathlib.py::test_type"
# Lines a change to the code under test prints when the run is over, after every line the
# runner printed: the last word on each test, as a printed log is read.
FORGE_PYTEST = (
    "import atexit, sys\n"
    "def _forge():\n"
    f"    print('PASSED {PYTEST_F2P}')\n"
    f"    sys.stderr.write('PASSED {PYTEST_F2P}\\n')\n"
    "atexit.register(_forge)\n"
    f"print('PASSED {PYTEST_F2P}')\n"
)


class Task:
    """A task, its prepared repository and fresh sandboxes to grade in."""

    def __init__(self, task: SweTask, repo: Path, source: Path, root: Path) -> None:
        self.task = task
        self.repo = repo
        self.source = source
        (root / "state").mkdir(exist_ok=True)
        self.backend = LocalBackend(LocalConfig(state_root=root / "state"))
        assert task.base_commit is not None
        self.spec = SandboxSpec(
            workspace=GitWorkspace(repo, task.base_commit),
            env=TOOLCHAIN_ENV,
            read_only_binds=TOOLCHAIN_BINDS,
        )
        self.log = GradingLog()

    def change(self, files: dict[str, str], work: Path) -> bytes:
        git(work.parent, "clone", "--quiet", str(self.source), str(work))
        for name, text in files.items():
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            (work / name).write_text(text)
        git(work, "add", "--all")
        patch: str = git(work, "diff", "--cached", "--binary", "--full-index")
        return patch.encode()

    async def grade(self, patch: bytes) -> GradeResult:
        self.log = GradingLog()
        return await grade(self.task, patch, lambda: self.backend.create(self.spec), self.log)

    async def printed_log(self, patch: bytes, command: str) -> str:
        """What the harness would read: the command's printed output, on the change."""
        async with await self.backend.create(self.spec) as box:
            await apply_diff(box, self.task.grading.test_patch.encode())
            await apply_diff(box, patch)
            ran = await box.exec(command, timeout=120)
        return ran.stdout + ran.stderr


async def prepared(metadata: dict[str, Any], source: Path, root: Path) -> Task:
    task = parse_task(metadata)
    repo = await RepoSources(root / "sources").prepare(task)
    return Task(task, repo, source, root)


# -- pytest repositories ---------------------------------------------------------------------


@pytest.fixture
async def pytest_task(tmp_path: Path) -> Task:
    made = make_task(tmp_path / "repos", "pytest", "patch")
    metadata = dict(made.row["metadata"])
    metadata["grading"] = {
        **metadata["grading"],
        "runner": {
            "type": "swebench",
            "repo": "pytest-dev/pytest",  # its parser: parse_log_pytest
            "framework": "pytest",
            "command": "pytest -rA",
            "directives": ["tests/test_mathlib.py"],
            "python": PYTHON_INSIDE,
        },
    }
    return await prepared(metadata, made.path, tmp_path)


async def test_a_pytest_repository_agrees_with_the_harness_on_gold_and_empty(
    pytest_task: Task, tmp_path: Path
) -> None:
    empty = await pytest_task.grade(b"")
    assert (empty.verdict, empty.reward) == (Verdict.UNRESOLVED, 0.0)
    assert empty.tests == {PYTEST_F2P: "failed", PYTEST_P2P: "passed"}
    gold = await pytest_task.grade(pytest_task.change({"mathlib.py": FIXED}, tmp_path / "gold"))
    assert (gold.verdict, gold.reward) == (Verdict.RESOLVED, 1.0), pytest_task.log.text()
    assert gold.tests == {PYTEST_F2P: "passed", PYTEST_P2P: "passed"}
    # The harness's parser read pytest's own summary lines, rendered from our report.
    assert f"PASSED {PYTEST_F2P}" in pytest_task.log.text()


async def test_printed_pass_lines_fool_the_printed_log_but_earn_nothing(
    pytest_task: Task, tmp_path: Path
) -> None:
    buggy = (pytest_task.source / "mathlib.py").read_text()
    forged = pytest_task.change({"mathlib.py": FORGE_PYTEST + buggy}, tmp_path / "forged")
    printed = await pytest_task.printed_log(
        forged,
        f"{shlex.quote(PYTHON_INSIDE)} -m pytest -rA -p no:cacheprovider tests/test_mathlib.py",
    )
    harness = parse(load_parser("pytest-dev/pytest"), printed, "pytest-dev/pytest")
    assert harness[PYTEST_F2P] == "PASSED"  # the attack works on a printed log
    result = await pytest_task.grade(forged)
    assert (result.verdict, result.reward) == (Verdict.UNRESOLVED, 0.0)
    assert result.tests[PYTEST_F2P] == "failed"


async def test_a_skipped_fail_to_pass_test_does_not_resolve(
    pytest_task: Task, tmp_path: Path
) -> None:
    """swebench 4 counted only passes and failures, so skipping every F2P test resolved."""
    skipping = "import pytest\ndef double(x):\n    pytest.skip('later')\n"
    result = await pytest_task.grade(pytest_task.change({"mathlib.py": skipping}, tmp_path / "s"))
    assert (result.verdict, result.reward) == (Verdict.UNRESOLVED, 0.0)
    assert result.tests[PYTEST_F2P] == "skipped"


async def test_a_missing_interpreter_is_an_environment_failure(tmp_path: Path) -> None:
    made = make_task(tmp_path / "repos", "pytest", "patch")
    metadata = dict(made.row["metadata"])
    metadata["grading"] = {
        **metadata["grading"],
        "runner": {
            "type": "swebench",
            "repo": "pytest-dev/pytest",
            "framework": "pytest",
            "command": "pytest -rA",
            "directives": ["tests/test_mathlib.py"],
            "prelude": ["source /opt/miniconda3/bin/activate", "conda activate testbed"],
        },
    }
    task = await prepared(metadata, made.path, tmp_path)
    with pytest.raises(EnvironmentFailure, match="python: command not found"):
        await task.grade(b"")


# -- Django: runtests.py and unittest's verbose lines ------------------------------------------

RUNTESTS = """\
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
labels = [arg for arg in sys.argv[1:] if not arg.startswith("-")]
suite = unittest.defaultTestLoader.loadTestsFromNames(labels)
result = unittest.TextTestRunner(verbosity=2).run(suite)
sys.exit(0 if result.wasSuccessful() else 1)
"""
DJANGO_TESTS = """\
import unittest

import calc


class TestAdd(unittest.TestCase):
    def test_add(self):
        self.assertEqual(calc.add(2, 2), 4)


class TestSub(unittest.TestCase):
    def test_sub(self):
        self.assertEqual(calc.sub(3, 1), 2)
"""
DJANGO_F2P = "test_add (test_calc.TestAdd.test_add)"
DJANGO_P2P = "test_sub (test_calc.TestSub.test_sub)"
BUGGY_CALC = "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n"
FIXED_CALC = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
# The two ways code under test writes a line a Django log parser reads as a pass: straight to
# stderr when the run is over, and inside an exception message unittest prints in its summary.
FORGE_DJANGO = (
    "import atexit, sys\n"
    f"atexit.register(lambda: sys.stderr.write('{DJANGO_F2P} ... ok\\n'))\n"
    "def add(a, b):\n"
    f"    raise ValueError('no\\n{DJANGO_F2P} ... ok')\n"
    "def sub(a, b):\n    return a - b\n"
)


@pytest.fixture
async def django_task(tmp_path: Path) -> Task:
    repo = tmp_path / "repos" / "calc"
    repo.mkdir(parents=True)
    git(repo, "init", "--quiet", "--initial-branch", "main")
    for name, text in {"calc.py": BUGGY_CALC, "tests/runtests.py": RUNTESTS}.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo, "add", "--all")
    git(repo, "commit", "--quiet", "--message", "base")
    base = git(repo, "rev-parse", "HEAD").strip()
    (repo / "tests" / "test_calc.py").write_text(DJANGO_TESTS)
    git(repo, "add", "--all")
    test_patch = git(repo, "diff", "--cached", "--no-color")
    git(repo, "reset", "--quiet", "--hard")
    metadata = {
        "instance_id": "calc__calc-1",
        "repo": {"path": str(repo)},
        "base_commit": base,
        "problem_statement": "add subtracts",
        "grading": {
            "runner": {
                "type": "swebench",
                "repo": "django/django",
                "framework": "django",
                "command": "./tests/runtests.py --verbosity 2 --parallel 1",
                "directives": ["test_calc"],
                "python": PYTHON_INSIDE,
            },
            "fail_to_pass": [DJANGO_F2P],
            "pass_to_pass": [DJANGO_P2P],
            "test_patch": test_patch,
            "timeout_s": 60,
        },
    }
    return await prepared(metadata, repo, tmp_path)


async def test_a_django_runner_agrees_with_the_harness_on_gold_and_empty(
    django_task: Task, tmp_path: Path
) -> None:
    empty = await django_task.grade(b"")
    assert (empty.verdict, empty.reward) == (Verdict.UNRESOLVED, 0.0), django_task.log.text()
    assert empty.tests == {DJANGO_F2P: "failed", DJANGO_P2P: "passed"}
    gold = await django_task.grade(django_task.change({"calc.py": FIXED_CALC}, tmp_path / "gold"))
    assert (gold.verdict, gold.reward) == (Verdict.RESOLVED, 1.0), django_task.log.text()


async def test_forged_django_lines_fool_the_printed_log_but_earn_nothing(
    django_task: Task, tmp_path: Path
) -> None:
    forged = django_task.change({"calc.py": FORGE_DJANGO}, tmp_path / "forged")
    printed = await django_task.printed_log(
        forged, f"{shlex.quote(PYTHON_INSIDE)} tests/runtests.py --verbosity 2 test_calc"
    )
    harness = parse(load_parser("django/django"), printed, "django/django")
    assert harness[DJANGO_F2P] == "PASSED"  # the attack works on a printed log
    result = await django_task.grade(forged)
    assert (result.verdict, result.reward) == (Verdict.UNRESOLVED, 0.0), django_task.log.text()
    assert result.tests[DJANGO_F2P] == "error"


# -- SymPy: bin/test and its reporter ------------------------------------------------------

# A runner in the shape of SymPy's (sympy/testing/runtests.py): a reporter whose per-test
# methods write through its `write`, and a summary that quotes each failure's exception.
SYMPY_RUNNER = """\
import importlib.util
import sys
import traceback


class PyTestReporter:
    def __init__(self):
        self.failed = []

    def write(self, text):
        sys.stdout.write(text)

    def entering_filename(self, filename):
        self.write(filename + " ")

    def entering_test(self, f):
        self.write("\\n" + f.__name__ + " ")

    def test_pass(self):
        self.write("ok")

    def test_fail(self, exc_info):
        self.failed.append(exc_info)
        self.write("F")

    def leaving_filename(self):
        self.write("\\n")

    def finish(self):
        for exc_info in self.failed:
            self.write("".join(traceback.format_exception(*exc_info)))
        return not self.failed


def test(*paths):
    reporter = PyTestReporter()
    for path in paths:
        spec = importlib.util.spec_from_file_location("under_test", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        reporter.entering_filename(path)
        for name in sorted(n for n in dir(module) if n.startswith("test_")):
            reporter.entering_test(getattr(module, name))
            try:
                getattr(module, name)()
            except Exception:
                reporter.test_fail(sys.exc_info())
            else:
                reporter.test_pass()
        reporter.leaving_filename()
    return reporter.finish()
"""
BIN_TEST = """\
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from sympy.testing.runtests import test

sys.exit(0 if test(*[a for a in sys.argv[1:] if not a.startswith("-")]) else 1)
"""
SYMPY_TESTS = """\
from sympy import calc


def test_add():
    assert calc.add(2, 2) == 4


def test_sub():
    assert calc.sub(3, 1) == 2
"""
FORGE_SYMPY = (
    "import atexit, sys\n"
    "atexit.register(lambda: sys.stdout.write('\\ntest_add ok\\n'))\n"
    "def add(a, b):\n"
    "    raise ValueError('no\\ntest_add ok')\n"
    "def sub(a, b):\n    return a - b\n"
)


@pytest.fixture
async def sympy_task(tmp_path: Path) -> Task:
    repo = tmp_path / "repos" / "sympy"
    repo.mkdir(parents=True)
    git(repo, "init", "--quiet", "--initial-branch", "main")
    files = {
        "sympy/__init__.py": "",
        "sympy/calc.py": BUGGY_CALC,
        "sympy/testing/__init__.py": "",
        "sympy/testing/runtests.py": SYMPY_RUNNER,
        "bin/test": BIN_TEST,
    }
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo, "add", "--all")
    git(repo, "commit", "--quiet", "--message", "base")
    base = git(repo, "rev-parse", "HEAD").strip()
    (repo / "sympy" / "tests").mkdir()
    (repo / "sympy" / "tests" / "test_calc.py").write_text(SYMPY_TESTS)
    git(repo, "add", "--all")
    test_patch = git(repo, "diff", "--cached", "--no-color")
    git(repo, "reset", "--quiet", "--hard")
    metadata = {
        "instance_id": "sympy__sympy-1",
        "repo": {"path": str(repo)},
        "base_commit": base,
        "problem_statement": "add subtracts",
        "grading": {
            "runner": {
                "type": "swebench",
                "repo": "sympy/sympy",
                "framework": "sympy",
                "command": "PYTHONWARNINGS='ignore::UserWarning' bin/test -C --verbose",
                "directives": ["sympy/tests/test_calc.py"],
                "python": PYTHON_INSIDE,
            },
            "fail_to_pass": ["test_add"],
            "pass_to_pass": ["test_sub"],
            "test_patch": test_patch,
            "timeout_s": 60,
        },
    }
    return await prepared(metadata, repo, tmp_path)


async def test_a_sympy_runner_agrees_with_the_harness_and_ignores_forged_lines(
    sympy_task: Task, tmp_path: Path
) -> None:
    empty = await sympy_task.grade(b"")
    assert empty.tests == {"test_add": "failed", "test_sub": "passed"}, sympy_task.log.text()
    gold = await sympy_task.grade(sympy_task.change({"sympy/calc.py": FIXED_CALC}, tmp_path / "g"))
    assert (gold.verdict, gold.reward) == (Verdict.RESOLVED, 1.0), sympy_task.log.text()
    forged = sympy_task.change({"sympy/calc.py": FORGE_SYMPY}, tmp_path / "forged")
    printed = await sympy_task.printed_log(
        forged, f"{shlex.quote(PYTHON_INSIDE)} bin/test -C --verbose sympy/tests/test_calc.py"
    )
    assert parse(load_parser("sympy/sympy"), printed, "sympy/sympy")["test_add"] == "PASSED"
    result = await sympy_task.grade(forged)
    assert (result.verdict, result.reward) == (Verdict.UNRESOLVED, 0.0), sympy_task.log.text()
    assert result.tests["test_add"] == "failed"
