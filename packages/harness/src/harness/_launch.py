"""A harness's complete launch plan: files, environment and argv, as plain data.

Keeping the plan separate from running it lets tests check every measured setting
(docs/clients.md) without starting anything, and lets one runner serve every harness.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from harness._errors import LaunchError
from sandbox import validate_env

#: Linux's limit on one argv string (MAX_ARG_STRLEN); the task travels as one argument.
MAX_ARGUMENT_BYTES = 128 * 1024


@dataclass(frozen=True, slots=True)
class Launch:
    """How to start one agent run inside a sandbox.

    env is layered over the sandbox's base environment; unset_env names are removed from it
    first, so no credential or routing variable of the host can redirect the CLI away from
    the adapter. dirs are created and files (sandbox path -> text) written before the start.
    """

    argv: tuple[str, ...]
    env: Mapping[str, str]
    unset_env: tuple[str, ...] = ()
    dirs: tuple[str, ...] = ()
    files: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.argv:
            raise LaunchError("empty argv")
        for arg in self.argv:
            if "\0" in arg:
                raise LaunchError("an argument contains a NUL byte")
            if len(arg.encode()) >= MAX_ARGUMENT_BYTES:
                raise LaunchError(
                    f"an argument of {len(arg.encode())} bytes exceeds the kernel's "
                    f"{MAX_ARGUMENT_BYTES}-byte limit for one argv string"
                )
        overlap = set(self.unset_env) & set(self.env)
        if overlap:
            # `env -u` would also remove our own value: the CLI would silently run without it.
            raise LaunchError(f"variables both set and unset: {sorted(overlap)}")
        try:
            validate_env(self.env)
        except ValueError as error:
            raise LaunchError(str(error)) from error
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))
        object.__setattr__(self, "files", MappingProxyType(dict(self.files)))

    @property
    def shell_command(self) -> str:
        """The plan as one shell line: make the dirs, drop unset_env, exec the CLI with no
        stdin; for starting it where only a shell can (`Harness.run` starts the argv itself,
        with no shell, so that an image without one runs the CLI too).

        `exec` makes the CLI the process the sandbox tracks, so a kill at the budget hits it
        directly; stdin is /dev/null because both CLIs otherwise wait to read it.
        """
        prefix = f"mkdir -p -- {shlex.join(self.dirs)} && " if self.dirs else ""
        unset = "".join(f"-u {shlex.quote(name)} " for name in self.unset_env)
        return f"{prefix}exec env {unset}{shlex.join(self.argv)} </dev/null"
