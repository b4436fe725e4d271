"""Tasks to attack grading with, and an "agent" that is a shell script, as a policy would act.

A policy acts on its sandbox through its agent CLI's tools: shell commands. `ScriptAgent` is a
harness whose "CLI" is such a script: an executable installed, mounted read-only and started
by the harness in the episode's sandbox exactly as Claude Code is, under the same budget, with
no model in the loop. An attack is then precisely a change a policy could make, captured and
graded by the app's own episode.

Each task exists in two shapes, both real git repositories built here:
- "base": the wanted tests are in the repository at the base commit (no test patch);
- "patch": SWE-bench's shape, the wanted test arrives with the task's test patch.
and for two runners: pytest (the test environment's real pytest, mounted read-only into the
sandbox) and unittest. In both, `double(x)` returns `x + x + 1`; the honest fix drops the
`+ 1`. The wanted test also uses `statistics`, a standard-library module nothing imports
before the test does, so a module shadowing it would really be imported.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar, Literal

import pytest

from harness import AgentEndpoint, EventTally, Harness, InstallConfig, InstalledCli, Launch
from sandbox import ReadOnlyBind

Shape = Literal["base", "patch"]
RunnerKind = Literal["pytest", "unittest"]

SITE_PACKAGES = Path(pytest.__file__).resolve().parents[1]
PYTHON_PREFIX = Path(os.path.realpath(sys.base_prefix))
PYTHON_INSIDE = "/opt/python/bin/" + Path(os.path.realpath(sys.executable)).name
#: The test environment's Python and pytest, as the task's toolchain inside every sandbox.
TOOLCHAIN_BINDS = (
    ReadOnlyBind(SITE_PACKAGES, PurePosixPath("/opt/site-packages")),
    ReadOnlyBind(PYTHON_PREFIX, PurePosixPath("/opt/python")),
)
TOOLCHAIN_ENV = {"LD_LIBRARY_PATH": "/opt/python/lib", "PYTHONPATH": "/opt/site-packages"}

BUGGY = "def double(x):\n    return x + x + 1\n"
FIXED = "def double(x):\n    return x + x\n"
HONEST_FIX = f"cat > mathlib.py <<'EOF'\n{FIXED}EOF\n"
_KEPT_TEST = "def test_type():\n    assert isinstance(mathlib.double(2), int)\n"
_WANTED_TEST = (
    "def test_double():\n    assert statistics.fmean([mathlib.double(2), mathlib.double(3)]) == 5\n"
)
_UNITTEST_KEPT = (
    "class TestType(unittest.TestCase):\n"
    "    def test_type(self):\n        self.assertIsInstance(mathlib.double(2), int)\n"
)
_UNITTEST_WANTED = (
    "class TestDouble(unittest.TestCase):\n"
    "    def test_double(self):\n"
    "        self.assertEqual(statistics.fmean([mathlib.double(2), mathlib.double(3)]), 5)\n"
)
_GIT_ENV = {
    "PATH": os.environ["PATH"],
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_AUTHOR_NAME": "task",
    "GIT_AUTHOR_EMAIL": "task@example.invalid",
    "GIT_COMMITTER_NAME": "task",
    "GIT_COMMITTER_EMAIL": "task@example.invalid",
}


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=repo, env=_GIT_ENV, capture_output=True, check=True)
    return done.stdout.decode()


def _test_module(runner: RunnerKind, wanted: bool) -> str:
    if runner == "pytest":
        return (
            "import statistics\n\nimport mathlib\n\n\n"
            + _KEPT_TEST
            + ("\n\n" + _WANTED_TEST if wanted else "")
        )
    head = "import statistics\nimport unittest\n\nimport mathlib\n\n\n"
    return head + _UNITTEST_KEPT + ("\n\n" + _UNITTEST_WANTED if wanted else "")


@dataclass(frozen=True, slots=True)
class TaskRepo:
    """A task's repository and the dataset row that describes it."""

    path: Path
    row: dict[str, Any]


def make_task(root: Path, runner: RunnerKind, shape: Shape) -> TaskRepo:
    """The mathlib task in one shape, for one runner, as a real repository under `root`."""
    repo = root / f"mathlib-{runner}-{shape}"
    repo.mkdir(parents=True)
    git(repo, "init", "--quiet", "--initial-branch", "main")
    test_file = "tests/test_mathlib.py" if runner == "pytest" else "test_mathlib.py"
    files = {
        "mathlib.py": BUGGY,
        "helpers/__init__.py": "",
        "helpers/text.py": "def shout(s):\n    return s.upper()\n",
        test_file: _test_module(runner, wanted=shape == "base"),
    }
    if runner == "pytest":
        files["pytest.ini"] = "[pytest]\npythonpath = .\n"
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo, "add", "--all")
    git(repo, "commit", "--quiet", "--message", "base")
    base = git(repo, "rev-parse", "HEAD").strip()
    test_patch = ""
    if shape == "patch":
        (repo / test_file).write_text(_test_module(runner, wanted=True))
        test_patch = git(repo, "diff", "--no-color")
        git(repo, "checkout", "--quiet", "--", test_file)
    if runner == "pytest":
        ids = ("tests/test_mathlib.py::test_double", "tests/test_mathlib.py::test_type")
        spec: dict[str, Any] = {"type": "pytest", "python": PYTHON_INSIDE}
    else:
        ids = ("test_mathlib.TestDouble.test_double", "test_mathlib.TestType.test_type")
        spec = {"type": "unittest", "python": PYTHON_INSIDE}
    metadata = {
        "instance_id": f"mathlib-{runner}-{shape}",
        "repo": {"path": str(repo)},
        "base_commit": base,
        "problem_statement": "double(2) gives 5; it must give 4.",
        "grading": {
            "runner": spec,
            "fail_to_pass": [ids[0]],
            "pass_to_pass": [ids[1]],
            "test_patch": test_patch,
            "timeout_s": 60,
        },
    }
    return TaskRepo(repo, {"prompt": metadata["problem_statement"], "metadata": metadata})


class _NoEvents(EventTally):
    def observe(self, event: Mapping[str, Any]) -> None:
        """A script writes no event stream worth counting."""


@dataclass(frozen=True)
class ScriptAgent(Harness):
    """An agent CLI that is a bash script: the commands a policy would have its tools run."""

    name: ClassVar[str] = "script-agent"
    script: str
    installs: Path
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def spec(self) -> str:
        return f"script-agent@{hashlib.sha256(self.script.encode()).hexdigest()[:16]}"

    async def install(self, config: InstallConfig) -> InstalledCli:
        prefix = self.installs / self.spec.replace("@", "-")
        command = prefix / "bin" / "agent"
        command.parent.mkdir(parents=True, exist_ok=True)
        command.write_text("#!/bin/bash\n" + self.script)
        command.chmod(0o755)
        return InstalledCli(self.spec, prefix, "bin/agent", "script")

    def launch(
        self,
        *,
        bin_path: PurePosixPath,
        endpoint: AgentEndpoint,
        task: str,
        state_dir: PurePosixPath,
    ) -> Launch:
        return Launch(argv=(str(bin_path),), env=dict(self.env))

    def new_tally(self) -> EventTally:
        return _NoEvents()
