"""SWE-bench-family rows -> our task rows, each in its own image.

SWE-bench's public fields: `instance_id`, `repo` ("owner/name"), `base_commit`, `patch` (the
gold fix), `test_patch`, `problem_statement`, `version`, and `FAIL_TO_PASS` / `PASS_TO_PASS`
(JSON-encoded lists of test ids in the published datasets, plain lists in some copies).

Each row runs in the instance's own image, whose /testbed holds the repository at the base
commit with its environment installed against it (the workspace is that directory). The image
is named by the dataset's convention (SWE-bench's official images:
`swebench/sweb.eval.x86_64.<instance id, lower case, "__" as "_1776_">:latest`), with another
prefix for a mirror, or taken from a column of the row (SWE-smith's `image_name`, R2E-Gym's
`docker_image`, ...); an E2B template per instance, or a local OCI layout or root file system
per image, are the other sources.

How the tests run comes from the official harness (the `swebench` package, 4.x): the test
command of the repository and version (`MAP_REPO_VERSION_TO_SPECS`), the test files it is given
(`get_test_directives`), the commands that activate the image's environment, and the log
parser of the repository (`MAP_REPO_TO_PARSER`), which reads our runs so our verdicts agree
with the harness's (grading/swebench_log.py). pytest repositories, Django (`runtests.py`) and
SymPy (`bin/test`) are supported; other runners (the JavaScript, Go, Java, ... specs) are
reported as unsupported. A dataset whose repositories the harness does not know gives the
command and parser itself (`test_command`, `log_parser`).

The gold `patch` is never in the task's metadata (what episodes and samples see): it goes to
the row's `reference`, which only `swe-rl validate` reads.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from swe_rl.task import TaskError, parse_task, split_swebench_command

DEFAULT_IMAGE_PREFIX = "swebench/sweb.eval.x86_64."
#: What activates a SWE-bench image's environment (conda, env "testbed"), before the spec's own
#: evaluation commands.
ACTIVATE = ("source /opt/miniconda3/bin/activate", "conda activate testbed")
WORKDIR = "/testbed"


@dataclass(frozen=True, slots=True)
class ConversionOptions:
    image_prefix: str = DEFAULT_IMAGE_PREFIX
    """Registry and repository prefix of the convention's image names."""
    image_tag: str = "latest"
    image_column: str | None = None
    """A row column holding the image reference (it wins over the convention)."""
    images_dir: Path | None = None
    """Local images, one per image name (its `/` and `:` as `_`): OCI layouts or root file
    systems, as `image_format` says."""
    image_format: Literal["oci_layout", "rootfs"] = "oci_layout"
    template_prefix: str | None = None
    """An E2B template per instance: this prefix + instance id."""
    test_command: str | None = None
    """The test command for every row (a dataset whose repositories the harness does not know)."""
    log_parser: str | None = None
    """The harness's parser for every row: a repository ("owner/name") or a parser's name."""
    activate: tuple[str, ...] | None = None
    """What activates the image's environment before the tests (None: SWE-bench's conda
    environment `testbed`; () for images whose interpreter is on the PATH as it is)."""
    timeout_s: float = 1800.0


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


def image_name(instance_id: str, options: ConversionOptions) -> str:
    """The convention's image for an instance (SWE-bench's: lower case, `__` as `_1776_`)."""
    key = instance_id.lower().replace("__", "_1776_")
    return f"{options.image_prefix}{key}:{options.image_tag}"


def convert_row(row: Mapping[str, Any], options: ConversionOptions) -> dict[str, Any]:
    """One SWE-bench-family row as a `{prompt, metadata, reference}` task row; TaskError if it
    cannot be."""
    repo = _field(row, "repo")
    instance = _field(row, "instance_id")
    version = str(row.get("version", "")).strip()
    test_patch = _field(row, "test_patch")
    spec = _spec(repo, version, options)
    command = options.test_command or _text_command(spec.get("test_cmd"), repo, version)
    framework = _framework(command)
    try:
        split_swebench_command(framework, command)
    except ValueError as error:
        raise TaskError("test_cmd", f"{command!r}: {error}") from None
    parser = options.log_parser or repo
    _check_parser(parser)
    directives = _directives(row, repo, test_patch)
    if not directives:
        raise TaskError("test_patch", "names no test file to run")
    activate = ACTIVATE if options.activate is None else options.activate
    prelude = [*activate, *(str(c) for c in spec.get("eval_commands", []))]
    runner: dict[str, Any] = {
        "type": "swebench",
        "repo": repo,
        "framework": framework,
        "command": command,
        "directives": directives,
        "prelude": prelude,
    }
    if parser != repo:
        runner["log_parser"] = parser
    metadata = {
        "instance_id": instance,
        "environment": {**_environment(row, instance, options), "workdir": WORKDIR},
        "base_commit": _field(row, "base_commit"),
        "problem_statement": _field(row, "problem_statement"),
        "grading": {
            "runner": runner,
            "fail_to_pass": _tests(row, "FAIL_TO_PASS"),
            "pass_to_pass": _tests(row, "PASS_TO_PASS"),
            "test_patch": test_patch,
            "timeout_s": options.timeout_s,
        },
        "swebench": {"repo": repo, "version": version},
    }
    try:
        parse_task(metadata)  # the same validation every task file gets
    except TaskError as error:
        raise TaskError(f"(converted) {error.field}", error.message) from None
    reference = {"patch": row["patch"]} if isinstance(row.get("patch"), str) else {}
    return {"prompt": metadata["problem_statement"], "metadata": metadata, "reference": reference}


def _environment(
    row: Mapping[str, Any], instance: str, options: ConversionOptions
) -> dict[str, str]:
    if options.template_prefix is not None:
        return {"e2b_template": f"{options.template_prefix}{instance}"}
    if options.image_column is not None:
        name = _field(row, options.image_column)
    else:
        name = image_name(instance, options)
    if options.images_dir is None:
        return {"image": name}
    local = str(options.images_dir.resolve() / name.replace("/", "_").replace(":", "_"))
    if options.image_format == "rootfs":
        return {"rootfs": local}
    return {"oci_layout": local, "ref": name.rpartition(":")[2] if ":" in name else "latest"}


def _spec(repo: str, version: str, options: ConversionOptions) -> Mapping[str, Any]:
    """The harness's spec of the repository and version ({} when a command is given)."""
    specs = _swebench("constants").MAP_REPO_VERSION_TO_SPECS
    spec = specs.get(repo, {}).get(version)
    if spec is None:
        if options.test_command is not None:
            return {}
        known = "no spec for the repository" if repo not in specs else f"no version {version!r}"
        raise TaskError("version", f"swebench has {known} of {repo} (give test_command)")
    return dict(spec)


def _text_command(test_cmd: object, repo: str, version: str) -> str:
    if isinstance(test_cmd, str) and test_cmd.strip():
        return test_cmd
    raise TaskError("test_cmd", f"the harness's command for {repo} {version} is not one command")


def _framework(command: str) -> str:
    """Which of our launchers runs the command: pytest, django or sympy."""
    if "runtests.py" in command:
        return "django"
    if "bin/test" in command:
        return "sympy"
    return "pytest"


def _check_parser(name: str) -> None:
    parsers = _swebench("log_parsers")
    if name in parsers.MAP_REPO_TO_PARSER or (
        name.startswith("parse_log_") and hasattr(_swebench("log_parsers.python"), name)
    ):
        return
    raise TaskError("repo", f"swebench has no log parser for {name} (give log_parser)")


def _directives(row: Mapping[str, Any], repo: str, test_patch: str) -> list[str]:
    """What the harness gives the test command: the test patch's files (Django: modules)."""
    get_test_directives = _swebench("test_spec.python").get_test_directives
    return [str(d) for d in get_test_directives({"repo": repo, "test_patch": test_patch})]


def _swebench(module: str) -> Any:
    try:
        return importlib.import_module(f"swebench.harness.{module}")
    except ImportError as error:
        raise TaskError(
            "(conversion)", f"needs the swebench package (agent-rl-swe-rl[swebench]): {error}"
        ) from None


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
