"""Real agent CLIs (Claude Code, Codex): pinned npm installs, configured for the adapter,
run in a sandbox with a wall-clock budget."""

from importlib.metadata import version as _distribution_version

from harness.base import DEFAULT_STATE_ROOT, Harness, NpmHarness
from harness.claude_code import CLAUDE_CODE_CLI, ClaudeCode, ClaudeCodeTally
from harness.codex import CODEX_CLI, Codex, CodexTally
from harness.config import AgentEndpoint, InstallConfig, NpmCli
from harness.errors import HarnessError, InstallError, InstallLockTimeoutError, LaunchError
from harness.events import EventStats, EventTally
from harness.install import InstalledCli, install_cli, install_once
from harness.launch import Launch
from harness.mount import DEFAULT_MOUNT_ROOT, CliMount
from harness.run import AgentRun

__version__ = _distribution_version("agent-rl-harness")  # pyproject.toml is the one source

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
]
