"""`swe-rl train` on a machine without Ray: one line saying what to install (exit 2), and
nothing written (it wrote the run's config, then died with a FileNotFoundError traceback)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

APP = Path(__file__).resolve().parents[1]
EXAMPLE_RUN = APP.parents[1] / "packages" / "slime-backend" / "docs" / "example-run.toml"


def test_train_without_ray_says_what_to_install_and_writes_nothing(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "first"
    config = tmp_path / "run.toml"
    config.write_text(
        EXAMPLE_RUN.read_text().replace('dir = "/mnt/runs/swe-qwen3-8b"', f'dir = "{run_dir}"')
    )
    assert str(run_dir) in config.read_text()
    no_ray = tmp_path / "bin"  # a PATH with everything the command needs but Ray
    no_ray.mkdir()
    done = subprocess.run(
        [sys.executable, str(APP), "train", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PATH": str(no_ray), "COLUMNS": "200"},
        check=False,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert "no Ray CLI ('ray') on this machine" in done.stderr
    assert "pip install 'agent-rl-slime-backend[ray]'" in done.stderr
    assert "Nothing was written." in done.stderr
    assert not (tmp_path / "runs").exists()
