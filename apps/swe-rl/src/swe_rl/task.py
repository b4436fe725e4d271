"""A SWE task: the payload a dataset row carries in `metadata`, as typed data.

The row's metadata travels verbatim into every training sample (slime-backend's contract); this
module only reads it. Every error names the field path (`grading.fail_to_pass[2]`), so a bad row
in a 100k-row file is found in seconds.

Payload shape (JSON):

    {
      "instance_id": "demo__calc-1",
      "environment": {"image": "swebench/sweb.eval.x86_64.x_1776_y-1:latest",   # optional:
                      "workdir": "/testbed"},       #   the task's own root file system
      "repo": {"path": "/data/repos/calc"}          # local sandbox: a local repository,
           | {"git_url": "https://.../calc.git"}    #   or a URL cloned once into a cache;
           | {"template": "swe-calc"},              # E2B: a template holding the checkout
                                                    # (optional when the environment holds
                                                    #   the repository, see below)
      "base_commit": "3f5c...",                     # optional then too
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

    {"type": "swebench",                            # SWE-bench family (swebench.py): the
     "repo": "astropy/astropy",                     #   official harness's per-test parser for
     "framework": "pytest" | "django" | "sympy",    #   this repository reads the run; the
     "command": "pytest -rA ...",                   #   command is the harness's spec's, run
     "directives": ["astropy/io/tests/test_x.py"],  #   through our launchers (grading.md)
     "prelude": ["source /opt/miniconda3/bin/activate", "conda activate testbed"],
     "log_parser": "astropy/astropy",               # optional: another repository's parser
     "python": "python"}                            # optional: the interpreter after prelude
    {"type": "reward_file",                         # Harbor tasks (harbor.py): the task's
     "tests_dir": "/data/harbor/t1/tests",          #   tests directory (a host path), copied
     "tests_path": "/tests",                        #   here after the agent's change; the
     "command": "bash /tests/test.sh",              #   command writes the reward, a number in
     "reward_file": "/logs/verifier/reward.txt",    #   [0, 1], to reward_file
     "env": {"KEY": "value"}}                       # optional

`"test_command": "..."` in place of `runner` is the command runner (older rows). The swebench
and reward_file runners need no wanted tests for reward_file (fail_to_pass may be empty).

The environment, when given, is the root file system of the agent's sandbox and of the fresh
grading sandbox alike; exactly one of

    {"image": "registry/name:tag"}                  # an OCI registry reference
    {"oci_layout": "/data/oci/x", "ref": "tag"}     # an OCI image layout on the host
    {"rootfs": "/data/rootfs/x", "env": {...}}      # an unpacked root file system (env optional)
    {"e2b_template": "template-id"}                 # an E2B template

plus `"workdir"`: where the image keeps the repository (default: the image's own working
directory; SWE-bench's images keep it at "/testbed"). Without `repo`,
the workspace is that directory of the image itself, writable in place (SWE-bench images have
their environment installed in editable mode against it); with `repo`, the repository is
checked out as without an environment, on the image's root file system. Rows without an
environment run on the host's /usr, as before.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
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
class Environment:
    """The task's root file system: exactly one of the sources is set."""

    image: str | None = None
    """An OCI registry reference."""
    oci_layout: str | None = None
    ref: str | None = None
    """The tag of the manifest in `oci_layout` (None: its only one)."""
    rootfs: str | None = None
    rootfs_env: Mapping[str, str] = field(default_factory=dict)
    e2b_template: str | None = None
    workdir: str | None = None
    """Where the image keeps the repository (the workspace when the task names no `repo`);
    None: the image's own working directory."""

    @property
    def label(self) -> str:
        """The environment as one line, for reasons and tables."""
        for kind, value in (
            ("image", self.image),
            ("oci layout", self.oci_layout),
            ("rootfs", self.rootfs),
            ("E2B template", self.e2b_template),
        ):
            if value is not None:
                return f"{kind} {value}" + (f" ({self.ref})" if self.ref else "")
        return "no environment"


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


@dataclass(frozen=True, slots=True)
class SwebenchRunner:
    """A SWE-bench-family task: the harness's test command for its repository and version,
    run through our launchers, read with the harness's log parser (grading/swebench_log.py)."""

    repo: str
    framework: str
    """pytest, django (runtests.py, unittest's verbose lines) or sympy (bin/test)."""
    command: str
    directives: tuple[str, ...] = ()
    prelude: tuple[str, ...] = ()
    log_parser: str = ""
    """The repository whose parser reads the run (default: `repo`), or a parser's name."""
    python: str = "python"

    @property
    def parser(self) -> str:
        return self.log_parser or self.repo


@dataclass(frozen=True, slots=True)
class RewardFileRunner:
    """A Harbor task's verifier: the task's tests directory, copied in by the grader after the
    agent's change, and a command that writes the reward to `reward_file`."""

    tests_dir: str
    command: str
    tests_path: str = "/tests"
    reward_file: str = "/logs/verifier/reward.txt"
    env: Mapping[str, str] = field(default_factory=dict)


SWEBENCH_FRAMEWORKS = ("pytest", "django", "sympy")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True, slots=True)
class SwebenchCommand:
    """A swebench runner's command, taken apart: its leading variable assignments, and the
    runner's own arguments (pytest's, after `pytest`; a script's, after the script)."""

    env: Mapping[str, str]
    script: str | None
    """The repository's runner script (django, sympy), None for pytest."""
    args: tuple[str, ...]


def split_swebench_command(framework: str, command: str) -> SwebenchCommand:
    """Raises ValueError when the command is not one this framework's launcher can run."""
    words = shlex.split(command)
    env: dict[str, str] = {}
    while words and _ASSIGNMENT.match(words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    if not words:
        raise ValueError("names no program")
    if framework == "pytest":
        if words[0] in ("pytest", "py.test"):
            return SwebenchCommand(env, None, tuple(words[1:]))
        if words[:3] in (["python", "-m", "pytest"], ["python3", "-m", "pytest"]):
            return SwebenchCommand(env, None, tuple(words[3:]))
        if words[0] == "tox":  # tox runs pytest with the repository's own arguments
            return SwebenchCommand(env, None, ())
        raise ValueError(f"a pytest framework command must start with pytest, got {words[0]!r}")
    if words[0] in ("python", "python3"):
        words = words[1:]
    if not words or words[0].startswith("-"):
        raise ValueError("names no runner script")
    return SwebenchCommand(env, words[0], tuple(words[1:]))


Runner = PytestRunner | UnittestRunner | CommandRunner | SwebenchRunner | RewardFileRunner


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
    repo: RepoSource | None
    """None: the environment's image holds the repository (at `environment.workdir`)."""
    base_commit: str | None
    """None only when the image holds the repository: its content is the base."""
    problem_statement: str
    setup_commands: tuple[str, ...]
    grading: Grading
    environment: Environment | None = None

    @property
    def in_image(self) -> bool:
        """The workspace is the image's own directory (no repository to check out)."""
        return self.repo is None


def parse_task(payload: Mapping[str, Any]) -> SweTask:
    """Read a task payload; raises TaskError naming the first bad field."""
    if not isinstance(payload, Mapping):
        raise TaskError("metadata", f"must be an object, got {type(payload).__name__}")
    grading = _object(payload, "grading")
    environment = _environment(payload) if "environment" in payload else None
    if environment is None or "repo" in payload:
        repo: RepoSource | None = _repo(_object(payload, "repo"))
    else:
        repo = None
    if repo is not None or "base_commit" in payload:
        base_commit: str | None = _commit(payload)
    else:
        base_commit = None
    runner = _runner(grading)
    return SweTask(
        instance_id=_text(payload, "instance_id"),
        repo=repo,
        base_commit=base_commit,
        problem_statement=_text(payload, "problem_statement"),
        setup_commands=_texts(payload, "setup_commands", required=False),
        grading=Grading(
            runner=runner,
            fail_to_pass=_texts(
                grading,
                "fail_to_pass",
                prefix="grading.",
                required=not isinstance(runner, RewardFileRunner),
            ),
            pass_to_pass=_texts(grading, "pass_to_pass", prefix="grading.", required=False),
            test_patch=_text(grading, "test_patch", "grading.", allow_empty=True)
            if "test_patch" in grading or not isinstance(runner, RewardFileRunner)
            else "",
            timeout_s=_positive(grading, "timeout_s", "grading.", DEFAULT_TEST_TIMEOUT_S),
        ),
        environment=environment,
    )


_ENVIRONMENT_SOURCES = ("image", "oci_layout", "rootfs", "e2b_template")
_ENVIRONMENT_FIELDS = frozenset({*_ENVIRONMENT_SOURCES, "ref", "env", "workdir"})


def _environment(payload: Mapping[str, Any]) -> Environment:
    environment = _object(payload, "environment")
    prefix = "environment."
    unknown = sorted(set(environment) - _ENVIRONMENT_FIELDS)
    if unknown:
        raise TaskError(prefix + unknown[0], "is not a field of an environment")
    given = [key for key in _ENVIRONMENT_SOURCES if key in environment]
    if len(given) != 1:
        raise TaskError(
            "environment", f"must have exactly one of {', '.join(_ENVIRONMENT_SOURCES)}"
        )
    (kind,) = given
    value = _text(environment, kind, prefix)
    if kind in ("oci_layout", "rootfs") and not value.startswith("/"):
        raise TaskError(prefix + kind, f"must be an absolute host path, got {value!r}")
    if "ref" in environment and kind != "oci_layout":
        raise TaskError(prefix + "ref", "is a field of an oci_layout environment only")
    if "env" in environment and kind != "rootfs":
        raise TaskError(prefix + "env", "is a field of a rootfs environment only")
    workdir = _text(environment, "workdir", prefix) if "workdir" in environment else None
    if workdir is not None and (
        not workdir.startswith("/") or workdir.rstrip("/") == "" or "/../" in f"{workdir}/"
    ):
        raise TaskError(prefix + "workdir", f"must be an absolute directory, got {workdir!r}")
    return Environment(
        image=value if kind == "image" else None,
        oci_layout=value if kind == "oci_layout" else None,
        ref=_text(environment, "ref", prefix) if "ref" in environment else None,
        rootfs=value if kind == "rootfs" else None,
        rootfs_env=_strings(environment, "env", prefix),
        e2b_template=value if kind == "e2b_template" else None,
        workdir=workdir.rstrip("/") if workdir is not None else None,
    )


def _strings(payload: Mapping[str, Any], key: str, prefix: str) -> dict[str, str]:
    """An optional object of strings (an environment's variables)."""
    value = payload.get(key, {})
    if not isinstance(value, Mapping):
        raise TaskError(prefix + key, "must be an object of strings")
    for name, item in value.items():
        if not isinstance(item, str) or not name or "=" in name or "\0" in name + item:
            raise TaskError(f"{prefix}{key}.{name}", "must be a string (a variable's value)")
    return dict(value)


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
    if kind == "swebench":
        framework = _text(runner, "framework", prefix)
        if framework not in SWEBENCH_FRAMEWORKS:
            raise TaskError(
                f"{prefix}framework",
                f"must be one of {list(SWEBENCH_FRAMEWORKS)}, got {framework!r}",
            )
        command = _text(runner, "command", prefix)
        try:
            split_swebench_command(framework, command)
        except ValueError as error:
            raise TaskError(f"{prefix}command", str(error)) from None
        return SwebenchRunner(
            repo=_text(runner, "repo", prefix),
            framework=framework,
            command=command,
            directives=_texts(runner, "directives", prefix=prefix, required=False),
            prelude=_texts(runner, "prelude", prefix=prefix, required=False),
            log_parser=_text(runner, "log_parser", prefix) if "log_parser" in runner else "",
            python=_text(runner, "python", prefix) if "python" in runner else "python",
        )
    if kind == "reward_file":
        paths = {}
        for key, default in (
            ("tests_path", "/tests"),
            ("reward_file", "/logs/verifier/reward.txt"),
        ):
            paths[key] = _text(runner, key, prefix) if key in runner else default
            if not paths[key].startswith("/") or ".." in paths[key].split("/"):
                raise TaskError(prefix + key, f"must be an absolute path, got {paths[key]!r}")
        tests_dir = _text(runner, "tests_dir", prefix)
        if not tests_dir.startswith("/"):
            raise TaskError(
                prefix + "tests_dir", f"must be an absolute host path, got {tests_dir!r}"
            )
        return RewardFileRunner(
            tests_dir=tests_dir,
            command=_text(runner, "command", prefix),
            tests_path=paths["tests_path"],
            reward_file=paths["reward_file"],
            env=_strings(runner, "env", prefix),
        )
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
    "swebench": frozenset(
        {"repo", "framework", "command", "directives", "prelude", "log_parser", "python"}
    ),
    "reward_file": frozenset({"tests_dir", "command", "tests_path", "reward_file", "env"}),
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
