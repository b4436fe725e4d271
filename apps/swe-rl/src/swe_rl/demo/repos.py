"""The demo's tasks: tiny real git repositories, each with a bug, tests and a task row.

Each repository is created at run time with one commit (the base): a module with a bug and a
test file that passes at the base. The task's test patch adds the test that exposes the bug
(FAIL_TO_PASS) and the existing test must keep passing (PASS_TO_PASS). Tests are standard-
library unittest, so any machine with python3 grades them, through the grader's own unittest
runner.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class Fix:
    """The one edit that resolves a demo task: `old` replaced by `new` in `path`."""

    path: str
    old: str
    new: str
    wrong: str
    """What a wrong attempt writes instead of `new`."""


@dataclass(frozen=True, slots=True)
class DemoTask:
    name: str
    issue: str
    files: dict[str, str]
    test_module: str
    new_test: tuple[str, str]
    """(test file, its content with the test that exposes the bug)."""
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    fix: Fix


_STACK_TESTS = (
    "import unittest\n\nfrom stack import Stack\n\n\n"
    "class TestStack(unittest.TestCase):\n"
    "    def test_pop(self):\n        s = Stack()\n        s.push(1)\n        s.push(2)\n"
    "        self.assertEqual(s.pop(), 2)\n"
)

TASKS = (
    DemoTask(
        name="calc-add",
        issue="calc.add() returns the difference of its arguments: add(2, 3) gives -1, not 5.",
        files={
            "calc.py": "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n",
            "test_calc.py": (
                "import unittest\n\nimport calc\n\n\nclass TestSub(unittest.TestCase):\n"
                "    def test_sub(self):\n        self.assertEqual(calc.sub(5, 3), 2)\n"
            ),
        },
        test_module="test_calc",
        new_test=(
            "test_calc.py",
            "import unittest\n\nimport calc\n\n\nclass TestSub(unittest.TestCase):\n"
            "    def test_sub(self):\n        self.assertEqual(calc.sub(5, 3), 2)\n\n\n"
            "class TestAdd(unittest.TestCase):\n"
            "    def test_add(self):\n        self.assertEqual(calc.add(2, 3), 5)\n",
        ),
        fail_to_pass=("test_calc.TestAdd.test_add",),
        pass_to_pass=("test_calc.TestSub.test_sub",),
        fix=Fix(
            "calc.py",
            "def add(a, b):\n    return a - b",
            "def add(a, b):\n    return a + b",
            "def add(a, b):\n    return a * b",
        ),
    ),
    DemoTask(
        name="slugify-case",
        issue="text.slugify() keeps upper case: slugify('Hello World') gives 'Hello-World', "
        "but slugs must be lower case ('hello-world').",
        files={
            "text.py": "def slugify(title):\n    return title.strip().replace(' ', '-')\n",
            "test_text.py": (
                "import unittest\n\nimport text\n\n\nclass TestSlug(unittest.TestCase):\n"
                "    def test_spaces(self):\n"
                "        self.assertEqual(text.slugify('a b'), 'a-b')\n"
            ),
        },
        test_module="test_text",
        new_test=(
            "test_text.py",
            "import unittest\n\nimport text\n\n\nclass TestSlug(unittest.TestCase):\n"
            "    def test_spaces(self):\n        self.assertEqual(text.slugify('a b'), 'a-b')\n\n"
            "    def test_lower_case(self):\n"
            "        self.assertEqual(text.slugify('Hello World'), 'hello-world')\n",
        ),
        fail_to_pass=("test_text.TestSlug.test_lower_case",),
        pass_to_pass=("test_text.TestSlug.test_spaces",),
        fix=Fix(
            "text.py",
            "title.strip().replace(' ', '-')",
            "title.strip().lower().replace(' ', '-')",
            "title.strip().upper().replace(' ', '-')",
        ),
    ),
    DemoTask(
        name="stack-peek",
        issue="Stack.peek() returns the bottom of the stack instead of the top: after push(1) "
        "and push(2), peek() gives 1.",
        files={
            "stack.py": (
                "class Stack:\n    def __init__(self):\n        self.items = []\n\n"
                "    def push(self, item):\n        self.items.append(item)\n\n"
                "    def pop(self):\n        return self.items.pop()\n\n"
                "    def peek(self):\n        return self.items[0]\n"
            ),
            "test_stack.py": _STACK_TESTS,
        },
        test_module="test_stack",
        new_test=(
            "test_stack.py",
            _STACK_TESTS
            + "\n    def test_peek(self):\n        s = Stack()\n"
            + "        s.push(1)\n        s.push(2)\n        self.assertEqual(s.peek(), 2)\n",
        ),
        fail_to_pass=("test_stack.TestStack.test_peek",),
        pass_to_pass=("test_stack.TestStack.test_pop",),
        fix=Fix(
            "stack.py",
            "return self.items[0]",
            "return self.items[-1]",
            "return self.items[-2]",
        ),
    ),
)

_GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_AUTHOR_NAME": "demo",
    "GIT_AUTHOR_EMAIL": "demo@example.invalid",
    "GIT_COMMITTER_NAME": "demo",
    "GIT_COMMITTER_EMAIL": "demo@example.invalid",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
}


def _git(repo: Path, *args: str) -> str:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **_GIT_ENV}
    done = subprocess.run(
        ["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def create_repository(task: DemoTask, root: Path) -> tuple[Path, str]:
    """The task's repository under `root`; returns (path, base commit)."""
    repo = root / task.name
    repo.mkdir(parents=True)
    _git(repo, "init", "--quiet", "--initial-branch", "main")
    for name, content in task.files.items():
        (repo / name).write_text(content)
    _git(repo, "add", "--all")
    _git(repo, "commit", "--quiet", "--message", "base")
    return repo, _git(repo, "rev-parse", "HEAD")


def test_patch(task: DemoTask, repo: Path) -> str:
    """The task's test patch: the diff that adds its new test to the base."""
    path, content = task.new_test
    original = (repo / path).read_text()
    (repo / path).write_text(content)
    try:
        return _git(repo, "diff", "--no-color", "--", path) + "\n"
    finally:
        (repo / path).write_text(original)


def task_row(task: DemoTask, repo: Path, base: str) -> dict[str, Any]:
    """The dataset row ({prompt, metadata}) of a demo task."""
    metadata = {
        "instance_id": f"demo__{task.name}",
        "repo": {"path": str(repo)},
        "base_commit": base,
        "problem_statement": task.issue,
        "setup_commands": [],
        "grading": {
            "runner": {"type": "unittest", "python": "python3"},
            "fail_to_pass": list(task.fail_to_pass),
            "pass_to_pass": list(task.pass_to_pass),
            "test_patch": test_patch(task, repo),
            "timeout_s": 120,
        },
    }
    return {"prompt": task.issue, "metadata": metadata}


def create_demo_tasks(root: Path) -> list[dict[str, Any]]:
    """Create every demo repository under `root`; returns their task rows."""
    rows = []
    for task in TASKS:
        repo, base = create_repository(task, root)
        rows.append(task_row(task, repo, base))
    return rows
