"""Where an installed CLI appears inside a sandbox.

The install directory is shared read-only: a local sandbox bind-mounts it (SandboxSpec's
read_only_binds), so the agent can run the CLI but never modify the copy every other
sandbox on the host uses. On E2B there is no host to mount from; there the directory is
either baked into the template or uploaded at create time, at the path given here (see the
README). Everything in an npm prefix is relative (bin symlinks, the platform binary next to
the launcher), so any mount point works.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

from harness._install import InstalledCli
from sandbox import ReadOnlyBind

#: Default parent directory of CLI mounts inside a sandbox.
DEFAULT_MOUNT_ROOT = PurePosixPath("/opt/agent-rl/cli")


@dataclass(frozen=True, slots=True)
class CliMount:
    """An installed CLI together with the path of its prefix inside the sandbox."""

    installed: InstalledCli
    sandbox_prefix: PurePosixPath

    def __post_init__(self) -> None:
        if not self.sandbox_prefix.is_absolute():
            raise ValueError(f"sandbox_prefix must be absolute: {self.sandbox_prefix}")

    @classmethod
    def under(cls, installed: InstalledCli, root: PurePosixPath = DEFAULT_MOUNT_ROOT) -> CliMount:
        """Mount at `<root>/<name>@<version>` (needs an isolating backend to bind it there)."""
        return cls(installed, root / installed.prefix.name)

    @classmethod
    def at_host_path(cls, installed: InstalledCli) -> CliMount:
        """Use the host path unchanged: for runs on the host or a non-isolated sandbox."""
        return cls(installed, PurePosixPath(installed.prefix.resolve()))

    @property
    def bind(self) -> ReadOnlyBind:
        """The SandboxSpec bind that makes the install appear at `sandbox_prefix`."""
        return ReadOnlyBind(self.installed.prefix, self.sandbox_prefix)

    @property
    def bin_path(self) -> PurePosixPath:
        """The CLI's command as seen inside the sandbox."""
        return self.sandbox_prefix / self.installed.bin_relative
