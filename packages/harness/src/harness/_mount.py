"""Where an installed CLI appears inside a sandbox.

The install directory is shared read-only: a local sandbox bind-mounts it (SandboxSpec's
read_only_binds), so the agent can run the CLI but never modify the copy every other
sandbox on the host uses. The bind names the CLI's program as a host program, so that on a
task's image, whose libc is not the host's (or which has none), the sandbox can start it on
the host's loader and libraries (`Sandbox.host_program_argv`). On E2B there is no host to
mount from; there the directory is either baked into the template or uploaded at create time,
at the path given here (see the README). Everything in an npm prefix is relative (bin symlinks,
the platform binary next to the launcher), so any mount point works.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

from harness._install import InstalledCli
from sandbox import ReadOnlyBind

#: Default parent directory of CLI mounts inside a sandbox: a top-level name no image has, so a
#: local sandbox can make the mount point on any root (an image's directories are read-only:
#: an image's /opt has no room for one), and an E2B template can hold the CLI there (its /run
#: is a fresh tmpfs at boot).
DEFAULT_MOUNT_ROOT = PurePosixPath("/agent-rl/cli")


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
        """The SandboxSpec bind that makes the install appear at `sandbox_prefix`, its program
        named as a host program."""
        return ReadOnlyBind(
            self.installed.prefix, self.sandbox_prefix, host_programs=(self.installed.program,)
        )

    @property
    def bin_path(self) -> PurePosixPath:
        """The CLI's command as seen inside the sandbox."""
        return self.sandbox_prefix / self.installed.bin_relative

    @property
    def program_path(self) -> PurePosixPath:
        """What runs, as seen inside the sandbox: the command, or the native executable its
        launcher would start (`NpmCli.program`)."""
        return self.sandbox_prefix / self.installed.program
