"""SWE-bench rows -> our task rows.

SWE-bench's public fields: `instance_id`, `repo` ("owner/name"), `base_commit`,
`problem_statement`, `test_patch`, `FAIL_TO_PASS` and `PASS_TO_PASS` (JSON-encoded lists of test
ids in the published datasets, plain lists in some copies), plus fields we keep but do not use
(`patch`, the gold fix, is deliberately NOT copied: the agent must never see it).

Each row is graded with the pytest runner on the test patch's files, as SWE-bench runs them,
configured as the repository configures pytest at the base commit; pytest's plugin
autoloading is off, so plugins a repository's tests need are named (`plugins`). That fits the
repositories whose tests are pytest's (most of SWE-bench). Repositories that run their tests
with their own runner (Django's runtests.py, SymPy's bin/test) are reported as unsupported
rather than graded from printed output. The repository comes from a
local mirror directory (`<repos_dir>/<owner>__<name>`) when given, else its GitHub URL, or an
E2B template per instance.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swe_rl.grading.patch_files import PatchError, display, split_patch
from swe_rl.task import TaskError, parse_task

OWN_RUNNERS = frozenset({"django/django", "sympy/sympy"})


@dataclass(frozen=True, slots=True)
class ConversionOptions:
    repos_dir: Path | None = None
    template_prefix: str | None = None
    setup_commands: tuple[str, ...] = ()
    timeout_s: float = 1800.0
    python: str = "python3"
    """The interpreter of the task's environment that has pytest."""
    plugins: tuple[str, ...] = ()
    """pytest plugin modules the tests need (autoloading is off)."""


@dataclass(frozen=True, slots=True)
class Converted:
    rows: tuple[dict[str, Any], ...]
    skipped: tuple[tuple[int, str, str], ...]
    """(line, instance id, reason) of each row not converted."""


def convert_rows(rows: Iterable[Mapping[str, Any]], options: ConversionOptions) -> Converted:
    converted: list[dict[str, Any]] = []
    skipped: list[tuple[int, str, str]] = []
    for line, row in enumerate(rows, start=1):
        instance = str(row.get("instance_id", "?"))
        try:
            converted.append(convert_row(row, options))
        except TaskError as error:
            skipped.append((line, instance, str(error)))
    return Converted(tuple(converted), tuple(skipped))


def convert_row(row: Mapping[str, Any], options: ConversionOptions) -> dict[str, Any]:
    """One SWE-bench row as a `{prompt, metadata}` task row; TaskError if it cannot be."""
    repo = _field(row, "repo")
    instance = _field(row, "instance_id")
    if repo in OWN_RUNNERS:
        raise TaskError("repo", f"{repo} runs its own test runner, not pytest")
    test_patch = _field(row, "test_patch")
    try:
        sections = split_patch(test_patch.encode())
    except PatchError as error:
        raise TaskError("test_patch", str(error)) from None
    files = sorted(
        {
            display(section.path)
            for section in sections
            if section.path.endswith(b".py") and not section.deleted
        }
    )
    if not files:
        raise TaskError("test_patch", "changes no Python test file")
    metadata = {
        "instance_id": instance,
        "repo": _source(repo, instance, options),
        "base_commit": _field(row, "base_commit"),
        "problem_statement": _field(row, "problem_statement"),
        "setup_commands": list(options.setup_commands),
        "grading": {
            "runner": {
                "type": "pytest",
                "python": options.python,
                "plugins": list(options.plugins),
                "paths": files,
            },
            "fail_to_pass": _tests(row, "FAIL_TO_PASS"),
            "pass_to_pass": _tests(row, "PASS_TO_PASS"),
            "test_patch": test_patch,
            "timeout_s": options.timeout_s,
        },
        "swebench": {"repo": repo, "version": str(row.get("version", ""))},
    }
    parse_task(metadata)  # the same validation every task file gets
    return {"prompt": metadata["problem_statement"], "metadata": metadata}


def _source(repo: str, instance: str, options: ConversionOptions) -> dict[str, str]:
    if options.template_prefix is not None:
        return {"template": f"{options.template_prefix}{instance}"}
    if options.repos_dir is not None:
        return {"path": str(options.repos_dir / repo.replace("/", "__"))}
    return {"git_url": f"https://github.com/{repo}.git"}


def _field(row: Mapping[str, Any], key: str) -> str:
    value = row.get(key)
    if not isinstance(value, str) or not value.strip():
        raise TaskError(key, "is required and must be a non-empty string")
    return value


def _tests(row: Mapping[str, Any], key: str) -> list[str]:
    value = row.get(key, [])
    if isinstance(value, str):  # the published datasets encode the list as JSON text
        try:
            value = json.loads(value)
        except ValueError:
            raise TaskError(key, "is not a JSON list of test ids") from None
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise TaskError(key, "must be a list of test ids")
    if not all(isinstance(test, str) and test for test in value):
        raise TaskError(key, "must hold non-empty test ids")
    return list(value)
