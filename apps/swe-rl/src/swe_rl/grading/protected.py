"""Which of the agent's changes grading refuses to apply, and why.

Grading runs the task's tests against the agent's change. A change to the tests themselves, to
what configures or starts the test runner, or to what the interpreter runs at start-up could
make failing code pass; none of it is ever applied. The rules are deliberately broad: an honest
fix to a SWE task changes the code under test, not the tests or their configuration.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import PurePosixPath

TEST_DIRECTORIES = frozenset({"test", "tests", "testing"})
RUNNER_CONFIG = frozenset(
    {
        "conftest.py",
        "pytest.ini",
        "tox.ini",
        "setup.cfg",
        "pyproject.toml",
        "noxfile.py",
        ".coveragerc",
        "Makefile",
    }
)
STARTUP_HOOKS = frozenset({"sitecustomize.py", "usercustomize.py"})


@dataclass(frozen=True, slots=True)
class ProtectedPaths:
    """The rules, with the task's own test patch: every file it touches is the task's."""

    test_patch_paths: frozenset[str] = frozenset()

    def reason(self, path: str) -> str | None:
        """Why `path` may not be changed by the agent, or None if it may."""
        parts = PurePosixPath(path).parts
        name = parts[-1] if parts else path
        if path in self.test_patch_paths:
            return "a file of the task's test patch"
        if name in RUNNER_CONFIG:
            return "test runner configuration"
        if name in STARTUP_HOOKS or name.endswith(".pth"):
            return "an interpreter start-up hook"
        if any(part in TEST_DIRECTORIES for part in parts[:-1]):
            return "inside a test directory"
        if name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py")):
            return "a test module"
        return None

    def refused(self, paths: Collection[str]) -> dict[str, str]:
        return {path: reason for path in paths if (reason := self.reason(path)) is not None}
