"""The task's `grading.runner`, read with every error naming its field, and the test command
runners.plan builds from it (checked as argv, and run for real against the grader's tools)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from swe_rl.grading import runners
from swe_rl.grading.report import parse_json_report
from swe_rl.task import (
    CommandRunner,
    PytestRunner,
    Runner,
    TaskError,
    UnittestRunner,
    parse_task,
)

WORKSPACE = "/work space/repo"
PATHS = runners.Paths(WORKSPACE, "/tmp/grading-0123")


def payload(**grading: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "fail_to_pass": ["tests/test_calc.py::test_add"],
        "test_patch": "",
        **grading,
    }
    return {
        "instance_id": "demo__calc-1",
        "repo": {"path": "/data/repos/calc"},
        "base_commit": "3f5c0a9e",
        "problem_statement": "add() subtracts",
        "grading": {key: value for key, value in fields.items() if value is not None},
    }


def runner_of(**grading: Any) -> Runner:
    return parse_task(payload(**grading)).grading.runner


# -- parse_task --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("runner", "expected"),
    [
        ({"type": "pytest"}, PytestRunner()),
        (
            {
                "type": "pytest",
                "python": "/opt/python/bin/python3",
                "config": "[pytest]\nasyncio_mode = auto\n",
                "plugins": ["pytest_asyncio", "xdist.plugin"],
                "paths": ["tests/test_calc.py", "tests/test_more.py"],
                "args": ["-x", "-k", "add"],
            },
            PytestRunner(
                python="/opt/python/bin/python3",
                config="[pytest]\nasyncio_mode = auto\n",
                plugins=("pytest_asyncio", "xdist.plugin"),
                paths=("tests/test_calc.py", "tests/test_more.py"),
                args=("-x", "-k", "add"),
            ),
        ),
        ({"type": "pytest", "plugins": [], "paths": [], "args": []}, PytestRunner()),
        ({"type": "unittest"}, UnittestRunner()),
        ({"type": "unittest", "python": "python3.8"}, UnittestRunner("python3.8")),
        ({"type": "command", "command": "make test"}, CommandRunner("make test")),
    ],
    ids=[
        "pytest",
        "pytest, every field",
        "pytest, empty lists",
        "unittest",
        "unittest, python",
        "command",
    ],
)
def test_each_runner_kind_is_read(runner: dict[str, Any], expected: Runner) -> None:
    assert runner_of(runner=runner) == expected


def test_the_defaults_of_the_runners() -> None:
    assert PytestRunner() == PytestRunner("python3", None, (), (), ())
    assert UnittestRunner() == UnittestRunner("python3")


def test_an_older_row_with_test_command_is_the_command_runner() -> None:
    assert runner_of(test_command="pytest -q tests") == CommandRunner("pytest -q tests")


def test_the_rest_of_grading_is_read_alongside_the_runner() -> None:
    task = parse_task(
        payload(
            runner={"type": "unittest"},
            fail_to_pass=["test_calc.TestAdd.test_add"],
            pass_to_pass=["test_calc.TestSub.test_sub"],
            timeout_s=60,
        )
    )
    assert task.grading.fail_to_pass == ("test_calc.TestAdd.test_add",)
    assert task.grading.pass_to_pass == ("test_calc.TestSub.test_sub",)
    assert task.grading.timeout_s == 60.0


KINDS = ["command", "pytest", "reward_file", "swebench", "unittest"]


@pytest.mark.parametrize(
    ("grading", "field", "message"),
    [
        (
            {"runner": {"type": "nose"}},
            "grading.runner.type",
            f"must be one of {KINDS}, got 'nose'",
        ),
        ({"runner": {"type": "Pytest"}}, "grading.runner.type", "got 'Pytest'"),
        ({"runner": {"python": "python3"}}, "grading.runner.type", "got None"),
        ({"runner": {"type": 1}}, "grading.runner.type", "got 1"),
        (
            {"runner": {"type": "pytest", "foo": 1}},
            "grading.runner.foo",
            "is not a field of a pytest runner",
        ),
        (
            {"runner": {"type": "unittest", "config": "[pytest]"}},
            "grading.runner.config",
            "is not a field of a unittest runner",
        ),
        (
            {"runner": {"type": "command", "command": "make", "python": "python3"}},
            "grading.runner.python",
            "is not a field of a command runner",
        ),
        (
            {"runner": {"type": "pytest"}, "test_command": "pytest"},
            "grading",
            "has both runner and test_command: keep one",
        ),
        ({}, "grading.runner", "is required (or grading.test_command)"),
        ({"runner": "pytest"}, "grading.runner", "is required and must be an object"),
        ({"runner": None, "test_command": None}, "grading.runner", "is required"),
        (
            {"runner": {"type": "pytest", "plugins": ["pytest-asyncio"]}},
            "grading.runner.plugins[0]",
            "is not a module name: 'pytest-asyncio'",
        ),
        (
            {"runner": {"type": "pytest", "plugins": ["ok", "a..b"]}},
            "grading.runner.plugins[1]",
            "is not a module name: 'a..b'",
        ),
        (
            {"runner": {"type": "pytest", "plugins": ["no:cacheprovider"]}},
            "grading.runner.plugins[0]",
            "is not a module name",
        ),
        (
            {"runner": {"type": "pytest", "plugins": ["1st"]}},
            "grading.runner.plugins[0]",
            "is not a module name",
        ),
        (
            {"runner": {"type": "pytest", "plugins": [""]}},
            "grading.runner.plugins[0]",
            "must be a non-empty string",
        ),
        (
            {"runner": {"type": "pytest", "plugins": "pytest_asyncio"}},
            "grading.runner.plugins",
            "must be a list of strings",
        ),
        (
            {"runner": {"type": "pytest", "python": ""}},
            "grading.runner.python",
            "must not be empty",
        ),
        (
            {"runner": {"type": "unittest", "python": "  "}},
            "grading.runner.python",
            "must not be empty",
        ),
        (
            {"runner": {"type": "pytest", "python": None}},
            "grading.runner.python",
            "is required and must be a string",
        ),
        (
            {"runner": {"type": "pytest", "config": ""}},
            "grading.runner.config",
            "must not be empty",
        ),
        (
            {"runner": {"type": "pytest", "args": ["-x", " "]}},
            "grading.runner.args[1]",
            "must be a non-empty string",
        ),
        (
            {"runner": {"type": "pytest", "paths": "tests"}},
            "grading.runner.paths",
            "must be a list of strings",
        ),
        ({"runner": {"type": "command"}}, "grading.runner.command", "is required"),
        (
            {"runner": {"type": "command", "command": ""}},
            "grading.runner.command",
            "must not be empty",
        ),
        (
            {"runner": {"type": "command", "command": "make\0test"}},
            "grading.runner.command",
            "must not contain NUL",
        ),
        ({"test_command": ""}, "grading.test_command", "must not be empty"),
        ({"test_command": ["pytest"]}, "grading.test_command", "must be a string"),
    ],
)
def test_a_bad_runner_names_its_field(grading: dict[str, Any], field: str, message: str) -> None:
    with pytest.raises(TaskError) as raised:
        parse_task(payload(**grading))
    assert raised.value.field == field
    assert message in raised.value.message
    assert str(raised.value).startswith(f"{field}: ")


# -- runners.plan --------------------------------------------------------------------------------


def pytest_argv(command: str) -> list[str]:
    """The argv a planned pytest command execs, after its `unset`."""
    prefix = "unset PYTEST_ADDOPTS PYTEST_PLUGINS; exec "
    assert command.startswith(prefix)
    return shlex.split(command[len(prefix) :])


def pairs(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == flag]


WANTED = (
    "tests/test_b.py::test_one",
    "tests/test_a.py::TestC::test_two",
    "tests/test_b.py::test_three[x::y]",
    "tests/test_a.py::test_four",
    "test_root.py::test_five",
)


def test_the_pytest_command_is_configured_by_the_task_alone() -> None:
    runner = PytestRunner(
        python="/opt/py thon/bin/python3",
        plugins=("pytest_asyncio", "xdist.plugin"),
        args=("-x", "-k", "add or sub"),
    )
    config = f"{WORKSPACE}/.agent-rl-pytest-1.ini"
    run = runners.plan(runner, WANTED, PATHS, config)
    argv = pytest_argv(run.command)
    assert argv[:2] == ["/opt/py thon/bin/python3", "/tmp/grading-0123/tools/pytest_runner.py"]
    assert pairs(argv, "-c") == [config]
    assert f"--rootdir={WORKSPACE}" in argv
    assert f"--confcutdir={WORKSPACE}" in argv
    assert pairs(argv, "-p") == ["no:cacheprovider", "pytest_asyncio", "xdist.plugin"]
    files = ["tests/test_b.py", "tests/test_a.py", "test_root.py"]
    assert argv[-6:] == ["-x", "-k", "add or sub", *files]
    assert all(argv.count(file) == 1 for file in files)
    assert run.env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] == "1"
    assert run.env["PYTHONSAFEPATH"] == "1"
    assert run.env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert run.report == "stdout"


def test_the_pytest_command_collects_the_task_paths_when_it_names_them() -> None:
    runner = PytestRunner(paths=("tests", "other/test_x.py"))
    run = runners.plan(runner, WANTED, PATHS, "setup.cfg")
    argv = pytest_argv(run.command)
    assert argv[-2:] == ["tests", "other/test_x.py"]
    assert "tests/test_a.py" not in argv
    assert pairs(argv, "-c") == ["setup.cfg"]
    assert pairs(argv, "-p") == ["no:cacheprovider"]


def test_a_pytest_plan_needs_its_configuration_file() -> None:
    with pytest.raises(ValueError, match="configuration file"):
        runners.plan(PytestRunner(), WANTED, PATHS, None)


def test_the_planned_environment_is_a_fresh_copy_each_time() -> None:
    first = runners.plan(PytestRunner(), WANTED, PATHS, "pytest.ini")
    first.env["PYTHONSAFEPATH"] = ""
    assert runners.plan(PytestRunner(), WANTED, PATHS, "pytest.ini").env["PYTHONSAFEPATH"] == "1"


def test_the_unittest_command_runs_our_runner_on_the_wanted_ids() -> None:
    run = runners.plan(UnittestRunner("python3.8"), ("test_calc.TestAdd.test_add",), PATHS, None)
    assert shlex.split(run.command) == [
        "exec",
        "python3.8",
        "/tmp/grading-0123/tools/unittest_runner.py",
        "/tmp/grading-0123/wanted.txt",
    ]
    assert run.env["PYTHONSAFEPATH"] == "1"
    assert "PYTEST_DISABLE_PLUGIN_AUTOLOAD" not in run.env
    assert run.report == "stdout"


def test_the_command_runner_runs_the_task_command_with_a_private_report_path() -> None:
    run = runners.plan(CommandRunner("make test"), WANTED, PATHS, None)
    assert run.command == "make test"
    assert run.env["GRADING_REPORT"] == "/tmp/grading-0123/report.xml"
    assert not run.env["GRADING_REPORT"].startswith(WORKSPACE)
    assert run.env["GRADING_TOOLS"] == "/tmp/grading-0123/tools"
    assert run.env["PYTHONSAFEPATH"] == "1"
    assert run.report == "junit"


@pytest.mark.parametrize(
    ("runner", "wanted", "files"),
    [
        (PytestRunner(), WANTED, ["tests/test_b.py", "tests/test_a.py", "test_root.py"]),
        (
            UnittestRunner(),
            (
                "pkg.mod.Class.test",
                "pkg.mod.Class.test_other",
                "test_calc.TestAdd.test_add",
                "pkg.sub.test_deep.TestX.test_y",
            ),
            [
                "pkg/mod.py",
                "pkg/mod/__init__.py",
                "test_calc.py",
                "test_calc/__init__.py",
                "pkg/sub/test_deep.py",
                "pkg/sub/test_deep/__init__.py",
            ],
        ),
        (UnittestRunner(), ("tests/test_x.py::test_y",), ["tests/test_x.py"]),
        (
            CommandRunner("make test"),
            ("tests/test_x.py::test_y", "test_calc.TestAdd.test_add"),
            ["tests/test_x.py", "test_calc.py", "test_calc/__init__.py"],
        ),
        (PytestRunner(), (), []),
    ],
    ids=["pytest ids", "unittest ids", "a node id under unittest", "command", "nothing wanted"],
)
def test_test_files(runner: Runner, wanted: tuple[str, ...], files: list[str]) -> None:
    assert runners.test_files(runner, wanted) == files


# -- the planned commands, run for real (no sandbox: the grader's tools in a temporary tree) -----


def install_tools(private: Path) -> None:
    tools = resources.files("swe_rl.grading").joinpath("tools")
    (private / "tools").mkdir(parents=True)
    for name in runners.TOOLS:
        (private / "tools" / name).write_bytes(tools.joinpath(name).read_bytes())


def run_planned(run: runners.TestRun, workspace: Path, **env: str) -> bytes:
    done = subprocess.run(
        ["bash", "-c", run.command],
        cwd=workspace,
        env={**os.environ, **run.env, **env},
        capture_output=True,
        check=False,
        timeout=120,
    )
    return done.stdout


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "tests").mkdir(parents=True)
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (repo / "tests" / "test_calc.py").write_text(
        "import calc\n\n\ndef test_add():\n    assert calc.add(2, 2) == 4\n\n\n"
        "def test_zero():\n    assert calc.add(0, 0) == 0\n"
    )
    (repo / "tests" / "test_other.py").write_text("def test_never_collected():\n    pass\n")
    (repo / "test_calc_unit.py").write_text(
        "import unittest\n\nimport calc\n\n\nclass TestAdd(unittest.TestCase):\n"
        "    def test_add(self):\n        self.assertEqual(calc.add(2, 2), 4)\n\n"
        "    def test_zero(self):\n        self.assertEqual(calc.add(0, 0), 0)\n"
    )
    # A repository configuration that would fail the run if pytest read it.
    (repo / "pytest.ini").write_text("[pytest]\naddopts = --this-option-does-not-exist\n")
    return repo


def test_the_planned_pytest_command_runs_the_wanted_files(workspace: Path, tmp_path: Path) -> None:
    private = tmp_path / "private"
    install_tools(private)
    # Where the grader writes a task's own configuration: in the workspace, so that what it
    # says relative to its directory is relative to the repository.
    config = workspace / ".agent-rl-pytest-0123.ini"
    config.write_text("[pytest]\npythonpath = .\n")
    wanted = ("tests/test_calc.py::test_add", "tests/test_calc.py::test_zero")
    paths = runners.Paths(str(workspace), str(private))
    run = runners.plan(PytestRunner(python=sys.executable), wanted, paths, str(config))
    stdout = run_planned(run, workspace, PYTEST_ADDOPTS="--this-option-does-not-exist")
    parsed = parse_json_report(stdout)
    assert parsed.outcomes(wanted) == {wanted[0]: "failed", wanted[1]: "passed"}
    assert set(parsed.tests) == set(wanted)  # only the wanted tests' file was collected
    assert parsed.files == dict.fromkeys(wanted, "tests/test_calc.py")


def test_the_planned_unittest_command_runs_the_wanted_ids(workspace: Path, tmp_path: Path) -> None:
    private = tmp_path / "private"
    install_tools(private)
    wanted = ("test_calc_unit.TestAdd.test_add", "test_calc_unit.TestAdd.test_zero")
    paths = runners.Paths(str(workspace), str(private))
    (private / "wanted.txt").write_text("".join(f"{test_id}\n" for test_id in wanted))
    run = runners.plan(UnittestRunner(python=sys.executable), wanted, paths, None)
    parsed = parse_json_report(run_planned(run, workspace))
    assert parsed.tests == {wanted[0]: "failed", wanted[1]: "passed"}
    assert parsed.files == dict.fromkeys(wanted, "test_calc_unit.py")


def test_the_tools_are_the_ones_the_plan_names() -> None:
    tools = resources.files("swe_rl.grading").joinpath("tools")
    assert runners.TOOLS == ("pytest_runner.py", "unittest_runner.py", "log_runner.py")
    assert all(tools.joinpath(name).is_file() for name in runners.TOOLS)
