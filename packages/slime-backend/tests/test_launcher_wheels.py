"""Our packages on every node: `[ray] wheels` becomes the job's runtime environment, which Ray
installs on each node when the job starts. The last test has a real Ray install a wheel from
the JSON the launcher wrote, as every node of a job does."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from slime_backend import ConfigError
from slime_backend.launcher import SlimeRunner

EXAMPLE = Path(__file__).resolve().parent.parent / "docs" / "example-run.toml"
WORKSPACE = Path(__file__).resolve().parents[3]


def run_file(tmp_path: Path, wheels: str) -> Path:
    """The example run with `[ray] wheels` set (the example's TOML text, one line added)."""
    text = EXAMPLE.read_text().replace("[ray]\n", f'[ray]\nwheels = "{wheels}"\n', 1)
    assert tomllib.loads(text)["ray"]["wheels"] == wheels
    path = tmp_path / "run.toml"
    path.write_text(text)
    return path


def runtime_env(path: Path) -> dict[str, Any]:
    submit = list(SlimeRunner.from_toml(path).plan().submit_command)
    parsed: dict[str, Any] = json.loads(submit[submit.index("--runtime-env-json") + 1])
    return parsed


def test_the_wheels_are_installed_by_the_jobs_runtime_environment(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for name in (
        "agent_rl_swe_rl-0.1.0-py3-none-any.whl",
        "agent_rl_sandbox-0.1.0-py3-none-any.whl",
    ):
        (wheels / name).write_bytes(b"")
    (wheels / "README").write_text("not a wheel")
    env = runtime_env(run_file(tmp_path, str(wheels)))
    assert env["pip"] == {
        "packages": [
            str(wheels / "agent_rl_sandbox-0.1.0-py3-none-any.whl"),
            str(wheels / "agent_rl_swe_rl-0.1.0-py3-none-any.whl"),
        ],
        "pip_check": False,
    }
    assert env["env_vars"]["PYTHONPATH"] == "/opt/Megatron-LM:/opt/slime"
    assert "pip" not in runtime_env(EXAMPLE), "no wheels named, nothing installed"


@pytest.mark.parametrize(
    ("wheels", "message"),
    [
        ("relative/wheels", r"ray\.wheels: must be an absolute path"),
        ("/nonexistent/wheels", r"ray\.wheels: cannot list /nonexistent/wheels"),
        ("EMPTY", r"ray\.wheels: .* holds no wheel: build them with `uv build --all-packages"),
    ],
)
def test_wheels_that_cannot_be_installed_are_refused_by_name(
    tmp_path: Path, wheels: str, message: str
) -> None:
    if wheels == "EMPTY":
        wheels = str(tmp_path / "empty")
        Path(wheels).mkdir()
    with pytest.raises(ConfigError, match=message):
        SlimeRunner.from_toml(run_file(tmp_path, wheels))


@pytest.mark.slow
def test_ray_installs_the_wheels_the_launcher_names_on_the_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The standard-library-only trajectory-tree wheel, built by `uv build`, installed by a real
    Ray (one node on 127.0.0.1) from the launcher's runtime environment: the job's task imports
    it from the environment Ray made, not from this one. (A driver started under `uv run`, as
    the tests are, has Ray replicate uv's environment instead and refuse a `pip` one; slime's
    driver is `python3 train.py`, so that hook is switched off here, as it is off there.)"""
    ray = pytest.importorskip("ray")
    from ray._private import ray_constants

    monkeypatch.setattr(ray_constants, "RAY_ENABLE_UV_RUN_RUNTIME_ENV", False)
    uv = os.environ.get("UV") or shutil.which("uv")
    assert uv, "building the wheel needs uv (pip install uv)"
    wheels = tmp_path / "wheels"
    built = subprocess.run(
        [uv, "build", "--package", "agent-rl-trajectory-tree", "--wheel", "--out-dir", str(wheels)],
        cwd=WORKSPACE,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    env = runtime_env(run_file(tmp_path, str(wheels)))
    ray.init(
        num_cpus=1,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        logging_level=logging.WARNING,
        runtime_env={"pip": env["pip"]},
    )

    def where() -> tuple[str, str]:
        import trajectory_tree

        return trajectory_tree.__file__ or "", sys.executable

    try:
        module, python = ray.get(ray.remote(where).remote(), timeout=600)
    finally:
        ray.shutdown()
    assert python != sys.executable
    assert module.startswith(str(Path(python).parent.parent)), (module, python)
