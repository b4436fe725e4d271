"""Real agent CLIs (Claude Code, Codex): pinned npm installs, configured for the adapter,
run in a sandbox with a wall-clock budget.

The public API is what this module exports, plus :mod:`harness.testing` (a recording endpoint
for tests, extra ``testing``); every other module is internal (its name starts with ``_``).
"""

from typing import TYPE_CHECKING

from harness._base import DEFAULT_STATE_ROOT, Harness, NpmHarness
from harness._claude_code import CLAUDE_CODE_CLI, ClaudeCode, ClaudeCodeTally
from harness._codex import CODEX_CLI, Codex, CodexTally
from harness._config import AgentEndpoint, InstallConfig, NpmCli
from harness._errors import HarnessError, InstallError, InstallLockTimeoutError, LaunchError
from harness._events import EventStats, EventTally, summarize_lines
from harness._install import InstalledCli, install_cli, install_once, run_checked
from harness._launch import Launch
from harness._mount import DEFAULT_MOUNT_ROOT, CliMount
from harness._run import AgentRun

__all__ = [
    "CLAUDE_CODE_CLI",
    "CODEX_CLI",
    "DEFAULT_MOUNT_ROOT",
    "DEFAULT_STATE_ROOT",
    "AgentEndpoint",
    "AgentRun",
    "ClaudeCode",
    "ClaudeCodeTally",
    "CliMount",
    "Codex",
    "CodexTally",
    "EventStats",
    "EventTally",
    "Harness",
    "HarnessError",
    "InstallConfig",
    "InstallError",
    "InstallLockTimeoutError",
    "InstalledCli",
    "Launch",
    "LaunchError",
    "NpmCli",
    "NpmHarness",
    "install_cli",
    "install_once",
    "run_checked",
    "summarize_lines",
]


if TYPE_CHECKING:
    __version__: str
else:

    def __getattr__(name: str) -> str:
        # The version comes from the installed metadata (pyproject.toml is its one source), read
        # on first use: importing importlib.metadata costs more than importing this package.
        if name == "__version__":
            from importlib.metadata import version

            return version("agent-rl-harness")
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
