"""Harbor task directories: read as the format says (task.toml, instruction.md, environment/,
tests/, solution/), converted to rows whose verifier's reward file is the reward; the tests
come from the task, copied in after the agent's change; a task whose image would have to be
built is built by the options' builder (a stand-in here; test_image_build.py builds for real),
else skipped with the reason."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from sandbox import GitWorkspace, LocalBackend, LocalConfig, SandboxSpec
from swe_rl.grading import GradeResult, GradingLog, Verdict, grade
from swe_rl.harbor import HarborOptions, convert_task, convert_tasks, task_directories
from swe_rl.image_build import BuildError, BuiltImage
from swe_rl.sources import RepoSources
from swe_rl.task import Environment, RewardFileRunner, parse_task

from .attack_tasks import FIXED, PYTHON_INSIDE, TOOLCHAIN_BINDS, TOOLCHAIN_ENV, git, make_task

TASK = Path(__file__).resolve().parent / "fixtures" / "harbor" / "calc-task"


def test_a_task_directory_becomes_a_row_in_its_image() -> None:
    row = convert_task(TASK, HarborOptions())
    task = parse_task(row["metadata"])
    assert row["prompt"] == (TASK / "instruction.md").read_text()
    assert task.instance_id == "fixture/harbor-calc"
    assert task.environment == Environment(
        image="agent-rl-fixtures/harbor-calc:latest", workdir="/app"
    )
    assert task.in_image
    assert task.grading.runner == RewardFileRunner(
        tests_dir=str(TASK / "tests"),
        command="bash /tests/test.sh",
        tests_path="/tests",
        reward_file="/logs/verifier/reward.txt",
    )
    assert task.grading.timeout_s == 120.0  # [verifier].timeout_sec
    assert row["reference"] == {"solution_dir": str(TASK / "solution")}
    assert "solve.sh" not in repr(row["metadata"])


def test_a_dataset_directory_converts_each_task_and_skips_what_it_cannot(tmp_path: Path) -> None:
    good = tmp_path / "good"
    shutil.copytree(TASK, good)
    built = tmp_path / "built"
    shutil.copytree(TASK, built)
    (built / "task.toml").write_text('[environment]\nworkdir = "/app"\n')
    (built / "environment" / "Dockerfile").write_text(
        "FROM python:3.11-slim\nWORKDIR /app\nRUN pip install numpy\n"
    )
    plain = tmp_path / "plain"
    shutil.copytree(TASK, plain)
    (plain / "task.toml").write_text("[verifier]\ntimeout_sec = 30\n")
    (plain / "environment" / "Dockerfile").write_text("FROM python:3.11-slim\nWORKDIR /srv\n")
    steps = tmp_path / "steps"
    shutil.copytree(TASK, steps)
    (steps / "task.toml").write_text('[[steps]]\nname = "one"\n')
    no_tests = tmp_path / "no-tests"
    shutil.copytree(TASK, no_tests)
    (no_tests / "tests" / "test.sh").unlink()
    (tmp_path / "not-a-task").mkdir()

    converted = convert_tasks(task_directories(tmp_path), HarborOptions())
    assert [row["metadata"]["environment"] for row in converted.rows] == [
        {"image": "agent-rl-fixtures/harbor-calc:latest", "workdir": "/app"},
        # A Dockerfile that only names its base and working directory is that image.
        {"image": "python:3.11-slim", "workdir": "/srv"},
    ]
    reasons = {Path(directory).name: reason for directory, reason in converted.skipped}
    assert reasons == {
        "built": "environment/Dockerfile: builds an image (RUN pip install numpy): "
        "`--build-images` builds it (buildah, no daemon); or give [environment].docker_image",
        "no-tests": "tests/test.sh: is missing (the verifier)",
        "steps": "steps: multi-step tasks are not supported",
    }


class FakeBuilder:
    """Stands in for buildah: records what it is asked to build, fails when told to."""

    def __init__(self, fail: str | None = None) -> None:
        self.fail = fail
        self.asked: list[tuple[str, Path]] = []

    def build(self, name: str, context: Path) -> BuiltImage:
        self.asked.append((name, context))
        if self.fail is not None:
            raise BuildError(self.fail)
        return BuiltImage(Path("/images") / name.replace("/", "_"), "c0ffee", True, 1.0)


def test_a_dockerfile_that_builds_is_built_by_the_builder(tmp_path: Path) -> None:
    built = tmp_path / "built"
    shutil.copytree(TASK, built)
    (built / "task.toml").write_text('[task]\nname = "org/built"\n')
    (built / "environment" / "Dockerfile").write_text(
        "FROM python:3.11-slim AS deps\nWORKDIR /deps\nRUN pip install numpy\n"
        "FROM python:3.11-slim\nWORKDIR /srv\nCOPY . /srv\nWORKDIR /srv/app\nENV A=1\n"
    )
    named = tmp_path / "named"
    shutil.copytree(TASK, named)
    builder = FakeBuilder()
    converted = convert_tasks([built, named], HarborOptions(builder=builder))
    assert [row["metadata"]["environment"] for row in converted.rows] == [
        # The final stage's last WORKDIR, after the steps that build.
        {"oci_layout": "/images/org_built", "ref": "c0ffee", "workdir": "/srv/app"},
        # A task that names its image keeps it: nothing to build.
        {"image": "agent-rl-fixtures/harbor-calc:latest", "workdir": "/app"},
    ]
    assert builder.asked == [("org/built", built.resolve() / "environment")]

    failing = FakeBuilder("buildah build failed (exit 1): E: Unable to locate package numpy")
    assert convert_tasks([built], HarborOptions(builder=failing)).skipped == (
        (
            str(built),
            "environment/Dockerfile: the image build failed: buildah build failed (exit 1): "
            "E: Unable to locate package numpy",
        ),
    )


def test_local_images_by_name(tmp_path: Path) -> None:
    rootfs = convert_task(TASK, HarborOptions(images_dir=tmp_path, image_format="rootfs"))
    assert rootfs["metadata"]["environment"] == {
        "rootfs": str(tmp_path / "agent-rl-fixtures_harbor-calc_latest"),
        "workdir": "/app",
    }


# -- the reward_file runner, on the host's root (the tests' own Python) ------------------------

VERIFIER = f"""#!/bin/bash
mkdir -p /tmp/logs/verifier
if {PYTHON_INSIDE} -c 'import mathlib; assert mathlib.double(2) == 4'; then
    echo 1 > /tmp/logs/verifier/reward.txt
elif [ -e half ]; then
    echo 0.5 > /tmp/logs/verifier/reward.txt
else
    echo 0 > /tmp/logs/verifier/reward.txt
fi
"""


class Verifier:
    def __init__(self, root: Path) -> None:
        made = make_task(root / "repos", "pytest", "base")
        self.source = made.path
        tests = root / "harbor-tests"
        tests.mkdir()
        (tests / "test.sh").write_text(VERIFIER)
        metadata: dict[str, Any] = {
            **made.row["metadata"],
            "grading": {
                "runner": {
                    "type": "reward_file",
                    "tests_dir": str(tests),
                    "tests_path": "/tmp/tests",
                    "command": "bash /tmp/tests/test.sh",
                    "reward_file": "/tmp/logs/verifier/reward.txt",
                },
                "timeout_s": 60,
            },
        }
        self.task = parse_task(metadata)
        (root / "state").mkdir()
        self.backend = LocalBackend(LocalConfig(state_root=root / "state"))
        self.root = root
        self.log = GradingLog()

    async def grade(self, files: dict[str, str]) -> GradeResult:
        work = self.root / f"work-{len(files)}-{sorted(files)}"
        git(self.root, "clone", "--quiet", str(self.source), str(work))
        for name, text in files.items():
            (work / name).write_text(text)
        git(work, "add", "--all")
        patch = git(work, "diff", "--cached", "--binary").encode()
        repo = await RepoSources(self.root / "sources").prepare(self.task)
        assert self.task.base_commit is not None
        spec = SandboxSpec(
            workspace=GitWorkspace(repo, self.task.base_commit),
            env={**TOOLCHAIN_ENV, "PYTHONPATH": f"{TOOLCHAIN_ENV['PYTHONPATH']}:."},
            read_only_binds=TOOLCHAIN_BINDS,
        )
        self.log = GradingLog()
        return await grade(self.task, patch, lambda: self.backend.create(spec), self.log)


@pytest.fixture
def verifier(tmp_path: Path) -> Verifier:
    return Verifier(tmp_path)


async def test_the_reward_file_is_the_reward(verifier: Verifier) -> None:
    fixed = await verifier.grade({"mathlib.py": FIXED})
    assert (fixed.verdict, fixed.reward) == (Verdict.RESOLVED, 1.0), verifier.log.text()
    assert "placed 1 test files at /tmp/tests" in verifier.log.text()
    half = await verifier.grade({"half": ""})
    assert (half.verdict, half.reward, half.score) == (Verdict.UNRESOLVED, 0.5, 0.5)
    empty = await verifier.grade({})
    assert (empty.verdict, empty.reward) == (Verdict.UNRESOLVED, 0.0)


async def test_a_reward_the_change_writes_itself_is_overwritten_or_refused(
    verifier: Verifier,
) -> None:
    """The tests come from the task (the agent's `tests/test.sh` is another file), and the
    reward file is made empty before the verifier runs."""
    forged = await verifier.grade({"tests/test.sh": "echo 1 > /tmp/logs/verifier/reward.txt\n"})
    assert (forged.verdict, forged.reward) == (Verdict.UNRESOLVED, 0.0)
    assert forged.refused_paths == {"tests/test.sh": "inside a test directory"}
