"""Tasks in their own images, end to end: the fixture tasks (a SWE-bench row, a Harbor task)
converted as their datasets would be and run in images the tests build (tests/images.py).

- `swe-rl validate` on both prints gold 1 and empty 0 for each: the SWE-bench row's tests pass
  only on the image's own interpreter, so a run on the host's would fail it;
- a converted row whose image is missing is ABORTED with a reason naming the environment,
  never a completed episode with reward 0;
- an environment that cannot run the tests (no interpreter) is ABORTED too, and so is an image
  that cannot be had (an OCI layout that is not there, a registry nobody listens on);
- an episode in the SWE-bench image captures the agent's change in /testbed against the
  image's repository and grades it in a fresh sandbox from the image: the fix earns 1, no
  change 0.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness import InstallConfig
from sandbox import LocalBackend, LocalConfig
from slime_backend import AdapterSession, Budgets, EpisodeOutcome, EpisodeStatus
from swe_rl.cli import main
from swe_rl.environment import image_cache_config
from swe_rl.episode import EpisodeConfig, SweEpisode
from swe_rl.harbor import HarborOptions, convert_task
from swe_rl.swebench import ConversionOptions, convert_row

from .attack_tasks import TOOLCHAIN_BINDS, TOOLCHAIN_ENV, ScriptAgent, make_task
from .images import (
    FIXTURES,
    harbor_image,
    harbor_image_without_repository,
    images_dir,
    swebench_image,
    swebench_row,
)

FIXTURE_OPTIONS = ConversionOptions(
    image_format="rootfs",
    test_command="pytest -rA",  # the harness has no spec for the fixture's repository
    log_parser="parse_log_pytest",
    activate=(),  # Debian's python3 is on the PATH as it is
)


async def run_episode(
    metadata: dict[str, Any], tmp_path: Path, script: str = "exit 0\n"
) -> EpisodeOutcome:
    """One episode of the script agent; a task in an image gets no host toolchain (its own)."""
    on_host = "environment" not in metadata
    (tmp_path / "state").mkdir(exist_ok=True)
    episode = SweEpisode(
        EpisodeConfig(
            artifacts_root=tmp_path / "artifacts",
            install=InstallConfig(cache_dir=tmp_path / "npm"),
            sources_cache=tmp_path / "sources",
            binds=TOOLCHAIN_BINDS if on_host else (),
            env=TOOLCHAIN_ENV if on_host else {},
        ),
        ScriptAgent(script, tmp_path / "installs"),
        LocalBackend(
            LocalConfig(
                state_root=tmp_path / "state",
                images=image_cache_config(tmp_path / "images", plain_http=["127.0.0.1:9"]),
            )
        ),
    )
    session = AdapterSession("http://127.0.0.1:9", "unused-token", f"images-{tmp_path.name}")
    return await episode(metadata, session, Budgets(60, 10, 4096, 256), evaluation=False)


async def test_a_row_whose_image_is_missing_is_aborted_never_graded(tmp_path: Path) -> None:
    options = ConversionOptions(**{**vars_of(FIXTURE_OPTIONS), "images_dir": tmp_path / "none"})
    row = convert_row(swebench_row(), options)
    outcome = await run_episode(row["metadata"], tmp_path)
    assert outcome.status is EpisodeStatus.ABORTED
    assert outcome.reward == 0.0
    missing = tmp_path / "none" / "swebench_sweb.eval.x86_64.fixture_1776_calc-1_latest"
    assert outcome.reason.startswith(
        f"environment: the sandbox cannot start (rootfs {missing}): "
    ), outcome.reason
    summary = json.loads((Path(str(outcome.artifacts["dir"])) / "summary.json").read_text())
    assert summary["status"] == "aborted"
    assert "grading" not in summary


async def test_an_environment_without_the_tests_interpreter_is_aborted(tmp_path: Path) -> None:
    """What converting SWE-bench rows onto the host's /usr used to do: `python: command not
    found`, reported as a completed episode with reward 0."""
    made = make_task(tmp_path / "repos", "pytest", "patch")
    metadata = json.loads(json.dumps(made.row["metadata"]))
    metadata["grading"]["runner"] = {
        "type": "swebench",
        "repo": "fixture/calc",
        "log_parser": "parse_log_pytest",
        "framework": "pytest",
        "command": "pytest -rA",
        "directives": ["tests/test_mathlib.py"],
    }
    outcome = await run_episode(metadata, tmp_path)
    assert outcome.status is EpisodeStatus.ABORTED
    assert outcome.reason.startswith("environment: grading (the host's /usr): ")
    assert outcome.reason.endswith("the test runner cannot start: python: command not found")


@pytest.mark.parametrize(
    ("environment", "named"),
    [
        (
            {"oci_layout": "/nonexistent/layout", "ref": "latest"},
            "oci layout /nonexistent/layout (latest)",
        ),
        ({"image": "127.0.0.1:9/fixture/calc:latest"}, "image 127.0.0.1:9/fixture/calc"),
    ],
    ids=["missing-oci-layout", "closed-registry-port"],
)
async def test_an_image_that_cannot_be_had_aborts_the_episode(
    tmp_path: Path, environment: dict[str, str], named: str
) -> None:
    metadata = convert_row(swebench_row(), FIXTURE_OPTIONS)["metadata"]
    metadata["environment"] = {**environment, "workdir": "/testbed"}
    outcome = await run_episode(metadata, tmp_path)
    assert outcome.status is EpisodeStatus.ABORTED
    assert outcome.reason.startswith(f"environment: the sandbox cannot start ({named}"), (
        outcome.reason
    )
    assert "cannot get image" in outcome.reason
    summary = json.loads((Path(str(outcome.artifacts["dir"])) / "summary.json").read_text())
    assert "grading" not in summary


FIX = "sed -i '0,/return a - b/s//return a + b/' calc.py\n"  # add() only


@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "reward", "verdict"),
    [(FIX, 1.0, "resolved"), ("exit 0\n", 0.0, "unresolved")],
    ids=["fix", "no-change"],
)
async def test_an_episode_in_its_image_grades_the_agents_change(
    tmp_path: Path, script: str, reward: float, verdict: str
) -> None:
    swebench_image()
    options = ConversionOptions(**{**vars_of(FIXTURE_OPTIONS), "images_dir": images_dir()})
    outcome = await run_episode(convert_row(swebench_row(), options)["metadata"], tmp_path, script)
    assert outcome.status is EpisodeStatus.COMPLETED, outcome.reason
    assert outcome.artifacts["verdict"] == verdict, outcome.reason
    assert outcome.reward == reward
    patch = (Path(str(outcome.artifacts["dir"])) / "diff.patch").read_bytes()
    assert (b"+    return a + b" in patch) is (reward == 1.0)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "reward"),
    [("sed -i 's/a - b/a + b/' adder.py\n", 1.0), ("exit 0\n", 0.0)],
    ids=["fix", "no-change"],
)
async def test_an_image_whose_workdir_is_plain_files_grades_the_change_against_them(
    tmp_path: Path, script: str, reward: float
) -> None:
    """Most Harbor images keep their task's files in a plain directory: the change is
    captured against those files as the image has them, and graded from them."""
    root = harbor_image_without_repository()
    metadata = convert_task(FIXTURES / "harbor" / "calc-task", HarborOptions())["metadata"]
    metadata["environment"] = {"rootfs": str(root), "workdir": "/app"}
    outcome = await run_episode(metadata, tmp_path, script)
    assert outcome.status is EpisodeStatus.COMPLETED, outcome.reason
    assert outcome.reward == reward
    patch = (Path(str(outcome.artifacts["dir"])) / "diff.patch").read_bytes()
    assert (b"+    return a + b" in patch) is (reward == 1.0)
    assert b"a/adder.py" in patch or reward == 0.0


async def test_an_image_at_another_commit_than_the_tasks_base_aborts_before_the_agent_runs(
    tmp_path: Path,
) -> None:
    """A SWE-bench image whose repository is checked out elsewhere is not the task's
    environment: graded there, the gold patch may fail and the empty change pass."""
    swebench_image()
    options = ConversionOptions(**{**vars_of(FIXTURE_OPTIONS), "images_dir": images_dir()})
    metadata = convert_row({**swebench_row(), "base_commit": "0" * 40}, options)["metadata"]
    outcome = await run_episode(metadata, tmp_path, "touch /tmp/ran; exit 0\n")
    assert outcome.status is EpisodeStatus.ABORTED
    assert outcome.reason.startswith("environment: capturing the change (rootfs "), outcome.reason
    base = swebench_row()["base_commit"]
    assert outcome.reason.endswith(
        f"has {base[:12]} checked out, not the task's base commit 000000000000"
    ), outcome.reason
    summary = json.loads((Path(str(outcome.artifacts["dir"])) / "summary.json").read_text())
    assert "agent" not in summary


def vars_of(options: ConversionOptions) -> dict[str, Any]:
    return {name: getattr(options, name) for name in options.__slots__}


def validate(rows: list[dict[str, Any]], tmp_path: Path, capsys: Any) -> tuple[int, str, Path]:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "valid.jsonl"
    arguments = ["validate", str(tasks), "--out", str(out), "--cache-dir", str(tmp_path)]
    code = main([*arguments, "--logs", str(tmp_path / "logs")])
    return code, capsys.readouterr().out, out


def cells(printed: str, instance: str) -> list[str]:
    """The table row of `instance`: empty, gold, verdict."""
    line = next(line for line in printed.splitlines() if instance in line)
    return [cell.strip() for cell in line.split("\u2502")][2:5]


@pytest.mark.slow
def test_validate_grades_the_swebench_fixture_gold_1_and_empty_0_in_its_image(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    swebench_image()
    options = ConversionOptions(**{**vars_of(FIXTURE_OPTIONS), "images_dir": images_dir()})
    row = convert_row(swebench_row(), options)
    code, printed, out = validate([row], tmp_path, capsys)
    assert code == 0, printed
    assert cells(printed, "fixture__calc-1") == ["0", "1", "ok"]
    assert "1 of 1 tasks pass" in printed
    assert [json.loads(line)["reference"] for line in out.open()] == [row["reference"]]
    # Resumable: a rerun validates nothing again, and says so.
    code, printed, _ = validate([row], tmp_path, capsys)
    assert code == 0
    assert "(earlier)" in printed


@pytest.mark.slow
@pytest.mark.parametrize("repository", [True, False], ids=["workdir-a-repository", "plain-files"])
def test_validate_grades_the_harbor_fixture_gold_1_and_empty_0_in_its_image(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], repository: bool
) -> None:
    root = harbor_image() if repository else harbor_image_without_repository()
    options = HarborOptions(images_dir=images_dir(), image_format="rootfs")
    row = convert_task(FIXTURES / "harbor" / "calc-task", options)
    row["metadata"]["environment"]["rootfs"] = str(root)
    code, printed, _ = validate([row], tmp_path, capsys)
    assert cells(printed, "fixture/harbor-calc") == ["0", "1", "ok"], printed
    assert code == 0
