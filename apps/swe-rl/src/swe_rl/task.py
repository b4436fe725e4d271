"""A SWE task: the payload a dataset row carries in `metadata`, as typed data.

The row's metadata travels verbatim into every training sample (slime-backend's contract); this
module only reads it. Every error names the field path (`grading.fail_to_pass[2]`), so a bad row
in a 100k-row file is found in seconds.

Payload shape (JSON):

    {
      "instance_id": "demo__calc-1",
      "repo": {"path": "/data/repos/calc"}          # local sandbox: a local repository,
           | {"git_url": "https://.../calc.git"}    #   or a URL cloned once into a cache;
           | {"template": "swe-calc"},              # E2B: a template holding the checkout
      "base_commit": "3f5c...",
      "problem_statement": "add() subtracts ...",
      "setup_commands": ["pip install -e ."],       # optional, run before the agent starts
      "grading": {
        "runner": {"type": "pytest"},               # see below
        "fail_to_pass": ["tests/test_calc.py::test_add"],
        "pass_to_pass": ["tests/test_calc.py::test_sub"],
        "test_patch": "diff --git a/tests/... (may be empty)",
        "timeout_s": 900                            # optional
      }
    }

The runner says how the task's tests run; the grader builds the command, so nothing in the
repository configures it (docs/grading.md):

    {"type": "pytest", "python": "python3",         # the interpreter that has pytest
     "config": "[pytest]\n...",                    # optional: the task's pytest config; by
                                                    #   default the repository's own, as of the
                                                    #   base commit and test patch
     "plugins": ["pytest_asyncio"],                 # optional: plugin modules to load (pytest's
                                                    #   plugin autoloading is off)
     "paths": ["tests/test_calc.py"],               # optional: what to collect; by default
                                                    #   the files of the wanted tests
     "args": ["-x"]}                                # optional: more pytest arguments
    {"type": "unittest", "python": "python3"}       # standard-library unittest, ids such as
                                                    #   "test_calc.TestAdd.test_add"
    {"type": "command", "command": "..."}           # the task's own command, which must write
                                                    #   a JUnit XML report to $GRADING_REPORT

`"test_command": "..."` in place of `runner` is the command runner (older rows).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

DEFAULT_TEST_TIMEOUT_S = 900.0


class TaskError(ValueError):
    """A payload that is not a usable SWE task; `field` is the path of the offending field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True, slots=True)
class RepoSource:
    """Where the repository comes from: exactly one of the three is set."""

    path: str | None = None
    git_url: str | None = None
    template: str | None = None


@dataclass(frozen=True, slots=True)
class PytestRunner:
    """pytest, configured by the task: `config` is the task's own pytest configuration (None:
    the repository's, as of the base commit and test patch)."""

    python: str = "python3"
    config: str | None = None
    plugins: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()
    args: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class UnittestRunner:
    """Standard-library unittest, run by the grader's own runner."""

    python: str = "python3"


@dataclass(frozen=True, slots=True)
class CommandRunner:
    """The task's own command; it configures its runner itself and writes JUnit XML."""

    command: str


Runner = PytestRunner | UnittestRunner | CommandRunner


@dataclass(frozen=True, slots=True)
class Grading:
    runner: Runner
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    test_patch: str
    timeout_s: float = DEFAULT_TEST_TIMEOUT_S


@dataclass(frozen=True, slots=True)
class SweTask:
    instance_id: str
    repo: RepoSource
    base_commit: str
    problem_statement: str
    setup_commands: tuple[str, ...]
    grading: Grading


def parse_task(payload: Mapping[str, Any]) -> SweTask:
    """Read a task payload; raises TaskError naming the first bad field."""
    if not isinstance(payload, Mapping):
        raise TaskError("metadata", f"must be an object, got {type(payload).__name__}")
    grading = _object(payload, "grading")
    return SweTask(
        instance_id=_text(payload, "instance_id"),
        repo=_repo(_object(payload, "repo")),
        base_commit=_commit(payload),
        problem_statement=_text(payload, "problem_statement"),
        setup_commands=_texts(payload, "setup_commands", required=False),
        grading=Grading(
            runner=_runner(grading),
            fail_to_pass=_texts(grading, "fail_to_pass", prefix="grading."),
            pass_to_pass=_texts(grading, "pass_to_pass", prefix="grading.", required=False),
            test_patch=_text(grading, "test_patch", "grading.", allow_empty=True),
            timeout_s=_positive(grading, "timeout_s", "grading.", DEFAULT_TEST_TIMEOUT_S),
        ),
    )


_PLUGIN_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def _runner(grading: Mapping[str, Any]) -> Runner:
    if "runner" not in grading:
        if "test_command" not in grading:
            raise TaskError("grading.runner", "is required (or grading.test_command)")
        return CommandRunner(_text(grading, "test_command", "grading."))
    if "test_command" in grading:
        raise TaskError("grading", "has both runner and test_command: keep one")
    runner = _object(grading, "runner", "grading.")
    kind = runner.get("type")
    prefix = "grading.runner."
    allowed = _RUNNER_FIELDS.get(kind) if isinstance(kind, str) else None
    if allowed is None:
        raise TaskError(f"{prefix}type", f"must be one of {sorted(_RUNNER_FIELDS)}, got {kind!r}")
    unknown = sorted(set(runner) - allowed - {"type"})
    if unknown:
        raise TaskError(f"{prefix}{unknown[0]}", f"is not a field of a {kind} runner")
    if kind == "command":
        return CommandRunner(_text(runner, "command", prefix))
    python = _text(runner, "python", prefix) if "python" in runner else "python3"
    if kind == "unittest":
        return UnittestRunner(python)
    config = _text(runner, "config", prefix) if "config" in runner else None
    plugins = _texts(runner, "plugins", prefix=prefix, required=False)
    for index, plugin in enumerate(plugins):
        if not _PLUGIN_NAME.match(plugin):
            raise TaskError(f"{prefix}plugins[{index}]", f"is not a module name: {plugin!r}")
    return PytestRunner(
        python=python,
        config=config,
        plugins=plugins,
        paths=_texts(runner, "paths", prefix=prefix, required=False),
        args=_texts(runner, "args", prefix=prefix, required=False),
    )


_RUNNER_FIELDS: dict[str, frozenset[str]] = {
    "pytest": frozenset({"python", "config", "plugins", "paths", "args"}),
    "unittest": frozenset({"python"}),
    "command": frozenset({"command"}),
}


def _object(payload: Mapping[str, Any], key: str, prefix: str = "") -> Mapping[str, Any]:
    value = payload.get(key)
    if not isinstance(value, Mapping):
        raise TaskError(prefix + key, "is required and must be an object")
    return value


def _text(
    payload: Mapping[str, Any], key: str, prefix: str = "", *, allow_empty: bool = False
) -> str:
    value = payload.get(key)
    if not isinstance(value, str):
        raise TaskError(prefix + key, "is required and must be a string")
    if not allow_empty and not value.strip():
        raise TaskError(prefix + key, "must not be empty")
    if "\0" in value:
        raise TaskError(prefix + key, "must not contain NUL characters")
    return value


def _texts(
    payload: Mapping[str, Any], key: str, *, prefix: str = "", required: bool = True
) -> tuple[str, ...]:
    value = payload.get(key)
    if value is None and not required:
        return ()
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise TaskError(prefix + key, "must be a list of strings")
    items = tuple(value)
    for index, item in enumerate(items):
        if not isinstance(item, str) or not item.strip():
            raise TaskError(f"{prefix}{key}[{index}]", "must be a non-empty string")
    if required and not items:
        raise TaskError(prefix + key, "must list at least one test")
    return items


def _positive(payload: Mapping[str, Any], key: str, prefix: str, default: float) -> float:
    value = payload.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise TaskError(prefix + key, f"must be a positive number of seconds, got {value!r}")
    return float(value)


def _commit(payload: Mapping[str, Any]) -> str:
    commit = _text(payload, "base_commit")
    if not 4 <= len(commit) <= 64 or any(c not in "0123456789abcdefABCDEF" for c in commit):
        raise TaskError("base_commit", f"must be a hexadecimal commit id, got {commit!r}")
    return commit.lower()


def _repo(repo: Mapping[str, Any]) -> RepoSource:
    given = {key: repo[key] for key in ("path", "git_url", "template") if key in repo}
    if len(given) != 1:
        raise TaskError("repo", "must have exactly one of path, git_url, template")
    ((key, value),) = given.items()
    if not isinstance(value, str) or not value.strip():
        raise TaskError(f"repo.{key}", "must be a non-empty string")
    return RepoSource(**{key: value})
