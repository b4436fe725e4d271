"""The command line as a user meets it: help, one-line errors, each command's real work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from swe_rl.cli import main

APP = Path(__file__).resolve().parents[1]
EXAMPLE_RUN = APP.parents[1] / "packages" / "slime-backend" / "docs" / "example-run.toml"


def swe_rl(
    *args: str, cwd: Path | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`uv run apps/swe-rl ARGS`, as the README runs it (the app directory's __main__)."""
    return subprocess.run(
        [sys.executable, str(APP), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**os.environ, "COLUMNS": "100"},
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((), "Without a command, runs the local demo"),
        (("demo",), "SCRIPTED policy"),
        (("rollout",), "--engine-url URL"),
        (("rollout",), "--rollout-temperature X"),
        (("check",), "Stops at the first failing step (exit 1) and says what to do"),
        (("train",), "--dry-run"),
        (("view",), "RUN_DIR"),
        (("convert-swebench",), "never to what an episode sees"),
        (("convert-harbor",), "copied into the grading sandbox after the agent's change"),
        (("validate",), "the empty change must earn 0"),
    ],
)
def test_every_command_has_help(args: tuple[str, ...], expected: str) -> None:
    result = swe_rl(*args, "--help")
    assert result.returncode == 0, result.stderr
    assert expected in " ".join(result.stdout.split())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("rollout", "tasks.jsonl"), "the following arguments are required: --engine-url"),
        (("check", "tasks.jsonl"), "the following arguments are required: --engine-url"),
        (("demo", "-k", "0"), "argument -k/--episodes-per-task: must be at least 1, got 0"),
        (("demo", "--concurrency", "two"), "not a whole number: 'two'"),
        (("frobnicate",), "unrecognized arguments: frobnicate"),
        (("view", "/nonexistent/run"), "/nonexistent/run holds no readable run.json"),
        (("train", "/nonexistent/run.toml"), "/nonexistent/run.toml"),
        (("convert-swebench", "/nonexistent/in.jsonl", "out.jsonl"), "cannot read"),
        (("convert-harbor", "/nonexistent", "out.jsonl"), "cannot read /nonexistent"),
        (("validate", "/nonexistent/tasks.jsonl"), "cannot read /nonexistent/tasks.jsonl"),
    ],
)
def test_bad_arguments_get_one_clear_line(args: tuple[str, ...], message: str) -> None:
    result = swe_rl(*args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert message in lines[0]
    assert "Traceback" not in result.stderr


def test_convert_swebench_writes_rows_and_lists_what_it_skipped(tmp_path: Path) -> None:
    row = {
        "repo": "pallets/flask",
        "instance_id": "pallets__flask-4045",
        "base_commit": "a" * 40,
        "version": "2.0",
        "problem_statement": "It breaks.",
        "test_patch": "diff --git a/tests/test_x.py b/tests/test_x.py\n--- a/tests/test_x.py\n"
        "+++ b/tests/test_x.py\n@@ -1 +1,2 @@\n x\n+y\n",
        "FAIL_TO_PASS": '["tests/test_x.py::test_x"]',
        "PASS_TO_PASS": "[]",
        "patch": "the gold fix",
    }
    source = tmp_path / "swebench.json"
    source.write_text(json.dumps([row, {**row, "repo": "acme/unknown", "instance_id": "a-1"}]))
    out = tmp_path / "tasks.jsonl"
    mirror = "mirror.example/swebench/sweb.eval.x86_64."
    result = swe_rl("convert-swebench", str(source), str(out), "--image-prefix", mirror)
    assert result.returncode == 0, result.stderr
    assert "wrote 1 task rows" in result.stdout
    assert "skipped row 2 (a-1): version: swebench has no spec" in result.stdout
    (converted,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert converted["metadata"]["environment"] == {
        "image": f"{mirror}pallets_1776_flask-4045:latest",
        "workdir": "/testbed",
    }
    assert converted["reference"] == {"patch": "the gold fix"}
    assert "the gold fix" not in json.dumps(converted["metadata"])


def test_convert_harbor_writes_a_row_per_task(tmp_path: Path) -> None:
    task = APP / "tests" / "fixtures" / "harbor" / "calc-task"
    out = tmp_path / "tasks.jsonl"
    result = swe_rl("convert-harbor", str(task), str(out))
    assert result.returncode == 0, result.stderr
    assert "wrote 1 task rows" in result.stdout
    (converted,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert converted["metadata"]["grading"]["runner"]["type"] == "reward_file"


def test_train_dry_run_prints_the_slime_command_with_our_functions() -> None:
    result = swe_rl("train", str(EXAMPLE_RUN), "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "ray job submit" in result.stdout
    assert "--custom-generate-function-path swe_rl.rollout.generate" in result.stdout
    assert "--custom-reward-post-process-path" in result.stdout


def test_the_generate_function_slime_loads_is_a_module_attribute() -> None:
    import inspect

    from swe_rl import rollout

    signature = inspect.signature(rollout.generate.__call__)
    assert list(signature.parameters) == ["args", "sample", "sampling_params", "evaluation"]


def test_main_returns_two_for_usage_errors_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--episodes-per-task", "-3"]) == 2
    assert "must be at least 1" in capsys.readouterr().err
