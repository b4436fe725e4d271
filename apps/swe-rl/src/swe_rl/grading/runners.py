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
- swebench: the SWE-bench harness's command for the repository and version, after the task's
  prelude (activating the image's environment): a pytest command runs through our pytest
  launcher as above (plugins: the environment's own, listed before the change is applied);
  Django's and SymPy's runner scripts through tools/log_runner.py, which reports only what the
  runner's reporter wrote (swebench_log.py reads either with the harness's parser).
- reward_file: a Harbor verifier: the task's tests, copied in by the grader after the change,
  and its command, which writes the reward to a file outside the repository.
Every run gets PYTHONSAFEPATH and PYTHONDONTWRITEBYTECODE. Our runners write their report to
their own stdout, which no process they start inherits; a task's command writes JUnit to a
private path outside the repository.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Literal

from swe_rl.task import (
    CommandRunner,
    PytestRunner,
    RewardFileRunner,
    Runner,
    SwebenchRunner,
    UnittestRunner,
    split_swebench_command,
)

ReportFormat = Literal["stdout", "junit", "log", "reward"]
TOOLS = ("pytest_runner.py", "unittest_runner.py", "log_runner.py")
#: Exit status of a preflight whose interpreter or command cannot start in the environment.
CANNOT_START = 127
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


#: Run with the task environment's interpreter (after the prelude), before the change is
#: applied: the module names of the pytest plugins its installed distributions declare
#: (`pytest11` entry points), as JSON. Old environments: pkg_resources; Python 3.5 syntax.
LIST_PYTEST_PLUGINS = """
import json, sys
names = set()
try:
    from importlib.metadata import distributions
    for dist in distributions():
        for ep in dist.entry_points:
            if ep.group == "pytest11":
                names.add(ep.value.split(":")[0].strip())
except ImportError:
    import pkg_resources
    for ep in pkg_resources.iter_entry_points("pytest11"):
        names.add(ep.module_name)
sys.stdout.write(json.dumps(sorted(names)))
"""


def prelude(lines: tuple[str, ...]) -> str:
    """The task's prelude as a shell prefix: run in this shell (its exports stay), with its
    output on stderr (stdout is the report's)."""
    if not lines:
        return ""
    return "{\n" + "\n".join(lines) + "\n} >&2\n"


def preflight(runner: Runner, workspace: str) -> str | None:
    """A command proving the runner can start in the environment, run before the agent's
    change is applied (so nothing of the agent's decides it): exit 0, or CANNOT_START with why
    on stderr. None: nothing to check beyond the command itself."""
    q = shlex.quote
    if isinstance(runner, PytestRunner | UnittestRunner | SwebenchRunner):
        head = prelude(runner.prelude) if isinstance(runner, SwebenchRunner) else ""
        module = "unittest"
        if isinstance(runner, PytestRunner) or (
            isinstance(runner, SwebenchRunner) and runner.framework == "pytest"
        ):
            module = "pytest"
        check = f"import {module}"
        script = ""
        if isinstance(runner, SwebenchRunner) and runner.framework != "pytest":
            name = split_swebench_command(runner.framework, runner.command).script
            assert name is not None
            script = (
                f"test -f {q(name)} || {{ echo {q(f'no {name} in {workspace}')} >&2; "
                f"exit {CANNOT_START}; }}\n"
            )
        return (
            f"{head}{script}command -v {q(runner.python)} >/dev/null 2>&1 || "
            f"{{ echo {q(f'{runner.python}: command not found')} >&2; exit {CANNOT_START}; }}\n"
            f"{q(runner.python)} -c {q(check)} || exit {CANNOT_START}"
        )
    command = runner.command
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    while words and "=" in words[0] and not words[0].startswith("="):
        words.pop(0)
    if not words:
        return None
    return (
        f"command -v -- {q(words[0])} >/dev/null 2>&1 || "
        f"{{ echo {q(f'{words[0]}: command not found')} >&2; exit {CANNOT_START}; }}"
    )


def locate_config_args(workspace: str) -> list[str]:
    return [workspace, json.dumps(PYTEST_CONFIG_FILES)]


def plan(
    runner: Runner,
    wanted: tuple[str, ...],
    paths: Paths,
    config: str | None,
    plugins: tuple[str, ...] = (),
) -> TestRun:
    """The test command for `runner`, run from the repository root. `config` is the path of
    pytest's configuration file (pytest runs only); `plugins` the environment's own pytest
    plugins (a swebench pytest run)."""
    q = shlex.quote
    if isinstance(runner, SwebenchRunner):
        split = split_swebench_command(runner.framework, runner.command)
        head = prelude(runner.prelude)
        if runner.framework == "pytest":
            as_pytest = PytestRunner(
                python=runner.python,
                plugins=plugins,
                paths=runner.directives,
                args=split.args,
            )
            run = plan(as_pytest, wanted, paths, config)
            return TestRun(head + run.command, {**run.env, **split.env}, "stdout")
        assert split.script is not None
        arguments = [
            f"{paths.tools}/log_runner.py",
            runner.framework,
            split.script,
            *split.args,
            *runner.directives,
        ]
        command = f"{head}exec {q(runner.python)} {shlex.join(arguments)}"
        return TestRun(command, {**_BASE_ENV, **split.env}, "log")
    if isinstance(runner, RewardFileRunner):
        return TestRun(runner.command, {**_BASE_ENV, **runner.env}, "reward")
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
    assert isinstance(runner, CommandRunner)
    env = {**_BASE_ENV, "GRADING_REPORT": paths.report, "GRADING_TOOLS": paths.tools}
    return TestRun(runner.command, env, "junit")


def test_files(runner: Runner, wanted: tuple[str, ...]) -> list[str]:
    """The files that hold the wanted tests: the task's, never the agent's to change.

    A pytest node id names its file; a unittest id `pkg.module.Class.method` lives in
    `pkg/module.py` or `pkg/module/__init__.py`.
    """
    files: dict[str, None] = {}
    if isinstance(runner, SwebenchRunner | RewardFileRunner):
        # Dataset ids are the harness parser's keys, not paths; the test patch's files and
        # the directives are the task's tests.
        if isinstance(runner, RewardFileRunner):
            return []
        return [d for d in runner.directives if d.endswith(".py")]
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
