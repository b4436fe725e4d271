"""The ``trajectory-tree`` command: a saved tree holds no grade, so none is invented."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

from trajectory_tree.__main__ import DEMO, main


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    path = tmp_path / "tree.json"
    path.write_text(resources.files("trajectory_tree").joinpath(DEMO).read_text("utf-8"))
    return path


def sample_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("  sample ")]


def test_show_prints_no_reward_the_tree_does_not_hold(
    saved: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["show", str(saved)]) == 0
    out = capsys.readouterr().out
    assert "1 sample (ungraded: a saved tree holds no reward; --reward R assigns one)" in out
    (line,) = sample_lines(out)
    assert "reward" not in line
    assert "reward 1.0" not in out


@pytest.mark.parametrize(
    ("policy", "reward", "shown"), [("full", "0", "0.0"), ("split", "1", "1.0")]
)
def test_show_assigns_the_reward_given_by_the_policy(
    saved: Path, capsys: pytest.CaptureFixture[str], policy: str, reward: str, shown: str
) -> None:
    assert main(["show", str(saved), "--reward", reward, "--policy", policy]) == 0
    out = capsys.readouterr().out
    assert "ungraded" not in out
    (line,) = sample_lines(out)
    assert line.endswith(f"reward {shown}")


def test_the_demo_is_ungraded_too(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo"]) == 0
    assert "ungraded" in capsys.readouterr().out


@pytest.mark.parametrize("bad", ["nan", "inf", "one"])
def test_a_reward_that_is_not_a_finite_number_is_refused(
    saved: Path, capsys: pytest.CaptureFixture[str], bad: str
) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["show", str(saved), "--reward", bad])
    assert stopped.value.code == 2
    assert "--reward" in capsys.readouterr().err
