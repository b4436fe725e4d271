"""``SlimeRunner.submit`` on a machine without the Ray CLI: a clear error before anything is
written, never a raw FileNotFoundError after the custom config is."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from slime_backend import ConfigError, from_mapping
from slime_backend.launcher import RunnerConfig, SlimeRunner

EXAMPLE = Path(__file__).resolve().parent.parent / "docs" / "example-run.toml"


def runner_in(run_dir: Path) -> SlimeRunner:
    data = tomllib.loads(EXAMPLE.read_text())
    data["run"]["dir"] = str(run_dir)
    return SlimeRunner(from_mapping(RunnerConfig, data))


@pytest.mark.parametrize("ray", ["ray-not-installed-here", "/nonexistent/bin/ray"])
def test_submit_without_the_ray_cli_says_so_and_writes_nothing(tmp_path: Path, ray: str) -> None:
    runner = runner_in(tmp_path / "run")
    with pytest.raises(ConfigError) as refused:
        runner.submit(ray=ray)
    message = str(refused.value)
    assert message.startswith(f"ray: no Ray CLI ({ray!r}) on this machine")
    assert "pip install 'agent-rl-slime-backend[ray]'" in message
    assert "Nothing was written." in message
    assert not (tmp_path / "run").exists()
    assert not Path(runner.plan().custom_config_path).exists()


def test_a_ray_cli_that_is_not_executable_is_no_ray_cli(tmp_path: Path) -> None:
    plain = tmp_path / "ray"
    plain.write_text("#!/bin/sh\nexit 0\n")  # not executable
    runner = runner_in(tmp_path / "run")
    with pytest.raises(ConfigError, match="no Ray CLI"):
        runner.submit(ray=str(plain))
    assert not (tmp_path / "run").exists()
