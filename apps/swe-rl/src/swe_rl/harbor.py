"""Harbor task directories -> our task rows.

A Harbor task is a directory:

    task.toml          metadata and settings: [environment] (docker_image, workdir),
                       [verifier] (timeout_sec, env), [agent], optionally steps
    instruction.md     what the agent is asked to do (the prompt)
    environment/       a Dockerfile (or the image named in task.toml)
    tests/test.sh      the verifier: run after the agent, it writes the reward (a number in
                       [0, 1]) to /logs/verifier/reward.txt (or {"reward": x} to reward.json)
    solution/solve.sh  a reference solution

The format is read here rather than with the `harbor` package's own task model: that package
needs Python 3.12 or newer (this workspace supports 3.11) and brings an LLM client, a web
server and sandbox-provider SDKs with it; task.toml is plain TOML (the standard library reads
it) and the rest are files.

Each task becomes a row whose environment is its image and whose workspace is the image's
working directory (`[environment].workdir`, else the Dockerfile's last WORKDIR, else the
converter's default, else the image's own working directory). Its grading is the
reward_file runner: the grader copies the task's `tests/` (from this host, never from the
agent's workspace) into the fresh grading sandbox after the agent's change, runs
`bash /tests/test.sh` and reads the reward file. The reference solution goes to the row's
`reference` (`swe-rl validate` runs it), never to its metadata.

An environment given only as a Dockerfile that builds something (RUN, COPY, ENV, ...) is
built by the options' `builder` (`image_build.BuildahBuilder`: buildah, no daemon) into an OCI
image layout, the row's environment; without a builder such a task is skipped with that
reason, and so is one whose build fails. A Dockerfile that only names its base image (`FROM`,
`WORKDIR`, `LABEL`, `ARG`) is that image. Converting stays free of processes unless a builder
is given.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from swe_rl.image_build import BuildError, BuiltImage
from swe_rl.task import TaskError, parse_task

TESTS_PATH = "/tests"
REWARD_FILE = "/logs/verifier/reward.txt"
#: Dockerfile instructions that leave the base image as it is (anything else builds one; ENV,
#: USER and SHELL change its configuration, which the base image's lacks).
_SIMPLE_DOCKERFILE = frozenset({"FROM", "WORKDIR", "LABEL", "ARG"})


class ImageBuilder(Protocol):
    def build(self, name: str, context: Path) -> BuiltImage:
        """Task `name`'s image, built from `context` (its environment/ directory, holding the
        Dockerfile) into an OCI layout; BuildError says why not."""
        ...


@dataclass(frozen=True, slots=True)
class HarborOptions:
    workdir: str | None = None
    """The workspace when neither task.toml nor the Dockerfile names one (None: the image's
    own working directory)."""
    images_dir: Path | None = None
    """Local images, one per image name (its `/` and `:` as `_`), as `image_format` says."""
    image_format: Literal["oci_layout", "rootfs"] = "oci_layout"
    timeout_s: float | None = None
    """The tests' time limit (default: the task's [verifier].timeout_sec)."""
    builder: ImageBuilder | None = None
    """Builds the image of a task whose Dockerfile builds one (None: such a task is skipped).
    `images_dir` is not applied to a built image: the builder says where it is."""


@dataclass(frozen=True, slots=True)
class HarborConverted:
    rows: tuple[dict[str, Any], ...]
    skipped: tuple[tuple[str, str], ...]
    """(task directory, reason) of each task not converted."""


def task_directories(root: Path) -> list[Path]:
    """`root` itself when it is a task, else its sub-directories that are (a dataset)."""
    if (root / "task.toml").is_file():
        return [root]
    return sorted(p for p in root.iterdir() if (p / "task.toml").is_file())


def convert_tasks(directories: list[Path], options: HarborOptions) -> HarborConverted:
    rows: list[dict[str, Any]] = []
    skipped: list[tuple[str, str]] = []
    for directory in directories:
        try:
            rows.append(convert_task(directory, options))
        except TaskError as error:
            skipped.append((str(directory), str(error)))
    return HarborConverted(tuple(rows), tuple(skipped))


def convert_task(directory: Path, options: HarborOptions) -> dict[str, Any]:
    """One Harbor task directory as a `{prompt, metadata, reference}` task row."""
    directory = directory.resolve()
    config = _config(directory)
    if config.get("steps"):
        raise TaskError("steps", "multi-step tasks are not supported")
    environment = _table(config, "environment")
    if str(environment.get("os", "linux")).lower() != "linux":
        raise TaskError("environment.os", f"only linux tasks run here, not {environment['os']}")
    instruction = _read(directory / "instruction.md", "instruction.md")
    tests = directory / "tests"
    if not (tests / "test.sh").is_file():
        raise TaskError("tests/test.sh", "is missing (the verifier)")
    image, workdir, builds = _image(directory, environment)
    if builds and options.builder is None:
        raise TaskError(
            "environment/Dockerfile",
            f"builds an image ({builds}): `--build-images` builds it (buildah, no daemon); "
            "or give [environment].docker_image",
        )
    verifier = _table(config, "verifier")
    env = verifier.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise TaskError("verifier.env", "must be a table of strings")
    templated = [key for key, value in env.items() if "${" in value]
    if templated:
        raise TaskError(f"verifier.env.{templated[0]}", "takes a value from the host: unsupported")
    timeout = options.timeout_s or float(verifier.get("timeout_sec", 600.0))
    name = _name(directory, config)
    located = _built(directory, name, options) if builds else _local(image, options)
    chosen = environment.get("workdir") or workdir or options.workdir
    metadata = {
        "instance_id": name,
        "environment": {**located, **({"workdir": str(chosen)} if chosen else {})},
        "problem_statement": instruction,
        "grading": {
            "runner": {
                "type": "reward_file",
                "tests_dir": str(tests),
                "tests_path": TESTS_PATH,
                "command": f"bash {TESTS_PATH}/test.sh",
                "reward_file": REWARD_FILE,
                "env": dict(env),
            },
            "fail_to_pass": [],
            "timeout_s": timeout,
        },
        "harbor": {"task_dir": str(directory)},
    }
    try:
        parse_task(metadata)
    except TaskError as error:
        raise TaskError(f"(converted) {error.field}", error.message) from None
    solution = directory / "solution"
    reference = {"solution_dir": str(solution)} if (solution / "solve.sh").is_file() else {}
    return {"prompt": instruction, "metadata": metadata, "reference": reference}


def _config(directory: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(_read(directory / "task.toml", "task.toml"))
    except tomllib.TOMLDecodeError as error:
        raise TaskError("task.toml", f"is not TOML: {error}") from None


def _table(config: dict[str, Any], key: str) -> dict[str, Any]:
    value = config.get(key, {})
    if not isinstance(value, dict):
        raise TaskError(key, "must be a table")
    return value


def _read(path: Path, field: str) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TaskError(field, "is missing") from None
    except (OSError, UnicodeDecodeError) as error:
        raise TaskError(field, f"cannot be read: {error}") from None
    if not text.strip():
        raise TaskError(field, "is empty")
    return text


def _name(directory: Path, config: dict[str, Any]) -> str:
    task = config.get("task")
    name = task.get("name") if isinstance(task, dict) else None
    return str(name) if isinstance(name, str) and name.strip() else directory.name


def _image(directory: Path, environment: dict[str, Any]) -> tuple[str, str | None, str]:
    """The task's image reference (its base, when built), the working directory its
    Dockerfile sets (if any) and the first instruction that builds its image ("": none)."""
    dockerfile = directory / "environment" / "Dockerfile"
    named = environment.get("docker_image")
    workdir = None
    base = None
    builds = ""
    if dockerfile.is_file():
        base, workdir, builds = _read_dockerfile(dockerfile.read_text(encoding="utf-8"))
    image = named or base
    if not isinstance(image, str) or not image.strip():
        raise TaskError("environment", "names no image (docker_image or a Dockerfile's FROM)")
    return image, workdir, "" if named is not None else builds


def _built(directory: Path, name: str, options: HarborOptions) -> dict[str, str]:
    """The task's image, built from its environment/ directory by the options' builder."""
    assert options.builder is not None
    try:
        built = options.builder.build(name, directory / "environment")
    except BuildError as error:
        raise TaskError("environment/Dockerfile", f"the image build failed: {error}") from None
    return {"oci_layout": str(built.layout.resolve()), "ref": built.tag}


_INSTRUCTION = re.compile(r"^\s*([A-Za-z]+)\s+(.*)$")


def _read_dockerfile(text: str) -> tuple[str | None, str | None, str]:
    """(last FROM image, its stage's last WORKDIR, the first instruction that builds
    something or "")."""
    joined = re.sub(r"\\\n", " ", text)
    base = workdir = None
    builds = ""
    for line in joined.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = _INSTRUCTION.match(line)
        if match is None:
            continue
        keyword, rest = match.group(1).upper(), match.group(2).strip()
        if keyword == "FROM":
            words = [w for w in rest.split() if not w.startswith("--")]
            base = words[0] if words else None
            workdir = None  # a new stage: the image's own, unless it sets one
        elif keyword == "WORKDIR":
            workdir = rest if rest.startswith("/") else workdir
        elif keyword not in _SIMPLE_DOCKERFILE:
            builds = builds or f"{keyword} {rest}"[:80]
    return base, workdir, builds


def _local(image: str, options: HarborOptions) -> dict[str, str]:
    if options.images_dir is None:
        return {"image": image}
    local = str(options.images_dir.resolve() / image.replace("/", "_").replace(":", "_"))
    if options.image_format == "rootfs":
        return {"rootfs": local}
    return {"oci_layout": local, "ref": image.rpartition(":")[2] if ":" in image else "latest"}
