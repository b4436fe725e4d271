"""tools/record_demo_session.py, as its docstring runs it: `--help` answers, and a recording
(the real Claude Code through the real adapter) writes a tree the `trajectory-tree` command
shows."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness import InstalledCli
from trajectory_tree import linearize, loads
from trajectory_tree.__main__ import main as trajectory_tree

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "record_demo_session.py"
BUNDLED = ROOT / "packages/trajectory-tree/src/trajectory_tree/demo_session.json"


def test_help_says_what_it_records_and_changes_nothing() -> None:
    before = BUNDLED.read_bytes()
    done = subprocess.run(
        [sys.executable, str(TOOL), "--help"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: record_demo_session.py")
    assert "--out FILE" in done.stdout
    assert "the real Claude Code CLI" in done.stdout
    assert BUNDLED.read_bytes() == before


@pytest.mark.slow
def test_a_recording_writes_the_session_the_demo_shows(
    tmp_path: Path, claude_code_cli: InstalledCli, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "session.json"
    done = subprocess.run(
        [sys.executable, str(TOOL), "--out", str(out)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"1 sample(s); wrote {out}" in done.stdout
    tree = loads(out.read_text())
    assert tree.session_id == "claude-code-demo"
    assert len(tree.turns) == 3  # a shell call, a parallel pair, the final answer
    assert linearize(tree).samples[0].trained_tokens > 0
    assert trajectory_tree(["show", str(out)]) == 0
    assert "All three marker files are written." in capsys.readouterr().out
