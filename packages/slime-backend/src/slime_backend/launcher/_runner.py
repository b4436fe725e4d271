"""``SlimeRunner``: a TOML file in, a slime training job out (or, dry, the exact plan)."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from slime_backend._typed_config import ConfigError, from_mapping

from ._command import custom_config_path, ray_submit_command, train_command
from ._config import RunnerConfig


@dataclass(frozen=True, slots=True)
class LaunchPlan:
    """Everything a launch does: one file to write, one command to run."""

    custom_config_path: str
    custom_config: str
    train_command: tuple[str, ...]
    """slime's command line as the Ray job runs it."""
    submit_command: tuple[str, ...]
    """``ray job submit ... -- <train_command>``, run on a machine that reaches the Ray head."""

    def render(self) -> str:
        """Shell-ready text: the custom config, then the submit command one flag per line."""
        return (
            f"# 1. write {self.custom_config_path}\n"
            f"{self.custom_config}"
            "# 2. submit the training job\n"
            f"{_one_flag_per_line(self.submit_command)}\n"
        )


class SlimeRunner:
    """A validated run: constructing one builds its plan, so every check fails here, early."""

    def __init__(self, config: RunnerConfig) -> None:
        self.config = config
        self._plan = LaunchPlan(
            custom_config_path=custom_config_path(config),
            custom_config=config.backend_settings().custom_config(),
            train_command=tuple(train_command(config)),
            submit_command=tuple(ray_submit_command(config)),
        )

    @classmethod
    def from_toml(cls, path: Path, *, generate_function: str | None = None) -> SlimeRunner:
        """Load a run; any bad value raises one :class:`ConfigError` naming file and field.

        ``generate_function`` is the app's default for ``episode.generate`` (its module
        attribute made by ``make_generate``), used when the file does not set one.
        """
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(str(path), f"not valid TOML: {exc}") from None
        episode = data.get("episode")
        if generate_function is not None and isinstance(episode, dict):
            episode.setdefault("generate", generate_function)
        try:
            return cls(from_mapping(RunnerConfig, data))
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc.path}", exc.message) from None

    def plan(self) -> LaunchPlan:
        return self._plan

    def dry_run(self, out: TextIO = sys.stdout) -> LaunchPlan:
        """Print what :meth:`submit` would do, and return it."""
        plan = self.plan()
        out.write(plan.render())
        return plan

    def submit(self, *, ray: str = "ray") -> int:
        """Write the custom config, run ``ray job submit``; returns its exit status.

        ``ray`` is the Ray CLI to use (``pip install agent-rl-slime-backend[ray]`` provides one).
        Without one, raises :class:`ConfigError` before anything is written.
        """
        executable = shutil.which(ray)
        if executable is None:
            raise ConfigError(
                "ray",
                f"no Ray CLI ({ray!r}) on this machine: the run is submitted as a Ray job with "
                "`ray job submit`; install Ray (pip install 'agent-rl-slime-backend[ray]') "
                "where the Ray head is reachable, or see the command with a dry run. "
                "Nothing was written.",
            )
        plan = self.plan()
        path = Path(plan.custom_config_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(plan.custom_config)
        return subprocess.run([executable, *plan.submit_command[1:]], check=False).returncode


def _one_flag_per_line(command: tuple[str, ...]) -> str:
    lines: list[str] = []
    for token in command:
        quoted = shlex.quote(token)
        if token.startswith("--") and lines:
            lines.append(quoted)
        elif lines:
            lines[-1] += " " + quoted
        else:
            lines.append(quoted)
    return " \\\n    ".join(lines)
