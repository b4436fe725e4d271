"""How each kind of task runner is started in the grading sandbox, configured by the task.

The repository never configures the test run: that is the whole point of this module.
- pytest: our launcher (tools/pytest_runner.py) starts pytest from a script, so the
  repository is not first on the import path; it gets an explicit configuration file (`-c`:
  the task's own, or the file pytest would have chosen at the base commit, located before the
  agent's change is applied and never changeable by it), an explicit rootdir and conftest
  boundary, plugin autoloading off (entry points declared by any installed or planted package
  metadata are ignored) with the task's plugins named, and collects the wanted tests' files.
  Collection errors are reported, and fail the run.
- unittest: our runner (tools/unittest_runner.py) loads exactly the wanted ids, with the
  repository last on the import path.
- command: the task's own command, which writes JUnit XML to $GRADING_REPORT; such a task
  answers for its runner's configuration itself (docs/grading.md).
Every run gets PYTHONSAFEPATH and PYTHONDONTWRITEBYTECODE. Our runners write their report to
their own stdout, which no process they start inherits; a task's command writes JUnit to a
private path outside the repository.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Literal

from swe_rl.task import PytestRunner, Runner, UnittestRunner

ReportFormat = Literal["stdout", "junit"]
TOOLS = ("pytest_runner.py", "unittest_runner.py")
_BASE_ENV = {"PYTHONSAFEPATH": "1", "PYTHONDONTWRITEBYTECODE": "1"}
_PYTEST_ENV = {**_BASE_ENV, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}

#: Where pytest looks for its configuration in a directory, in its order, and the section a
#: file must hold to count (None: the file counts by its name alone).
PYTEST_CONFIG_FILES: tuple[tuple[str, str | None], ...] = (
    ("pytest.toml", None),
    (".pytest.toml", None),
    ("pytest.ini", None),
    (".pytest.ini", None),
    ("pyproject.toml", "[tool.pytest"),
    ("tox.ini", "[pytest]"),
    ("setup.cfg", "[tool:pytest]"),
)

#: Run with the grading sandbox's trusted interpreter in the pristine checkout (test patch
#: applied, agent's change not yet): the name of the file pytest would take its configuration
#: from at the repository root, or nothing.
LOCATE_PYTEST_CONFIG = """
import json, os, stat, sys
root, candidates = sys.argv[1], json.loads(sys.argv[2])
for name, section in candidates:
    path = os.path.join(root, name)
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            continue
        with open(path, "rb") as f:
            text = f.read(1 << 20).decode("utf-8", "replace")
    except OSError:
        continue
    if section is None or any(l.strip().startswith(section) for l in text.splitlines()):
        sys.stdout.write(name)
        break
"""


@dataclass(frozen=True, slots=True)
class Paths:
    """Where one grading run keeps its private files, inside the grading sandbox."""

    workspace: str
    private: str
    """A fresh directory outside the repository."""

    @property
    def tools(self) -> str:
        return f"{self.private}/tools"

    @property
    def report(self) -> str:
        """Where a task's own command writes its JUnit report (our runners use stdout)."""
        return f"{self.private}/report.xml"

    @property
    def wanted(self) -> str:
        return f"{self.private}/wanted.txt"


@dataclass(frozen=True, slots=True)
class TestRun:
    command: str
    env: dict[str, str]
    report: ReportFormat


def locate_config_args(workspace: str) -> list[str]:
    return [workspace, json.dumps(PYTEST_CONFIG_FILES)]


def plan(runner: Runner, wanted: tuple[str, ...], paths: Paths, config: str | None) -> TestRun:
    """The test command for `runner`, run from the repository root. `config` is the path of
    pytest's configuration file (pytest runs only)."""
    q = shlex.quote
    if isinstance(runner, PytestRunner):
        if config is None:
            raise ValueError("a pytest run needs its configuration file")
        arguments = [
            f"{paths.tools}/pytest_runner.py",
            "-c",
            config,
            f"--rootdir={paths.workspace}",
            f"--confcutdir={paths.workspace}",
            "-p",
            "no:cacheprovider",
            *(arg for plugin in runner.plugins for arg in ("-p", plugin)),
            *runner.args,
            *(runner.paths or test_files(runner, wanted)),
        ]
        command = f"unset PYTEST_ADDOPTS PYTEST_PLUGINS; exec {q(runner.python)} "
        return TestRun(command + shlex.join(arguments), dict(_PYTEST_ENV), "stdout")
    if isinstance(runner, UnittestRunner):
        tool = f"{paths.tools}/unittest_runner.py"
        command = f"exec {q(runner.python)} {shlex.join([tool, paths.wanted])}"
        return TestRun(command, dict(_BASE_ENV), "stdout")
    env = {**_BASE_ENV, "GRADING_REPORT": paths.report, "GRADING_TOOLS": paths.tools}
    return TestRun(runner.command, env, "junit")


def test_files(runner: Runner, wanted: tuple[str, ...]) -> list[str]:
    """The files that hold the wanted tests: the task's, never the agent's to change.

    A pytest node id names its file; a unittest id `pkg.module.Class.method` lives in
    `pkg/module.py` or `pkg/module/__init__.py`.
    """
    files: dict[str, None] = {}
    for test_id in wanted:
        if isinstance(runner, PytestRunner) or "::" in test_id:
            files[test_id.split("::", 1)[0]] = None
            continue
        parts = test_id.split(".")
        module = parts[:-2] if len(parts) > 2 else parts[:1]
        stem = "/".join(module)
        files[f"{stem}.py"] = None
        files[f"{stem}/__init__.py"] = None
    return list(files)
