"""Typed configuration of a harness: which CLI, where it is cached, which endpoint it talks to.

Nothing here reads the environment; an application maps its flags and files onto these.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

_PACKAGE_NAME = re.compile(r"^(@[a-z0-9][a-z0-9._-]*/)?[a-z0-9][a-z0-9._-]*$")
_EXACT_VERSION = re.compile(r"^\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?$")
_BIN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True, slots=True)
class NpmCli:
    """An agent CLI published on npm, pinned to one exact version.

    `bin` is the command the package installs into `node_modules/.bin`. Only exact versions
    are accepted: a range would let two hosts of one training run install different CLIs.
    `program`: the native executable `bin` launches, relative to the install's prefix, when
    `bin` is a node launcher: started directly, the CLI needs no node where it runs (None:
    `bin` is the program itself).
    """

    package: str
    version: str
    bin: str
    program: str | None = None

    def __post_init__(self) -> None:
        if not _PACKAGE_NAME.match(self.package):
            raise ValueError(f"not an npm package name: {self.package!r}")
        if not _EXACT_VERSION.match(self.version):
            raise ValueError(f"pin an exact version, not {self.version!r}")
        if not _BIN_NAME.match(self.bin):
            raise ValueError(f"not a command name: {self.bin!r}")
        if self.program is not None:
            parts = PurePosixPath(self.program).parts
            if not parts or parts[0] == "/" or ".." in parts or "/".join(parts) != self.program:
                raise ValueError(f"not a path inside the install: {self.program!r}")

    @property
    def spec(self) -> str:
        """The `npm install` argument, e.g. `@openai/codex@0.169.0`."""
        return f"{self.package}@{self.version}"

    @property
    def program_relative(self) -> str:
        """What runs, relative to the install's prefix."""
        return self.program or f"node_modules/.bin/{self.bin}"

    @property
    def install_dir_name(self) -> str:
        """A file-system-safe directory name unique to package and version."""
        return f"{self.package.lstrip('@').replace('/', '+')}@{self.version}"


@dataclass(frozen=True, slots=True)
class InstallConfig:
    """Where and how CLIs are installed on a host.

    cache_dir: one directory per host shared by every run (e.g. ~/.cache/agent-rl/npm); each
    CLI version gets its own subdirectory, installed once.
    npm: the npm executable (a name looked up on PATH, or a path).
    npm_env: environment of the npm process; None inherits the caller's (registry settings,
    proxies and npm's own cache location live there).
    """

    cache_dir: Path
    npm: str = "npm"
    npm_env: Mapping[str, str] | None = None
    install_timeout: float = 900.0
    verify_timeout: float = 60.0
    lock_timeout: float = 1800.0


@dataclass(frozen=True, slots=True)
class AgentEndpoint:
    """The adapter as the agent sees it from inside the sandbox.

    base_url: scheme, host, port and optional path prefix, without `/v1` (each harness adds
    its dialect's path). token: the session token the adapter issued; the CLI sends it as
    its API key, which is how the adapter tells sessions apart. model: the policy's name,
    deliberately one the CLI does not know (see docs/clients.md). context_window: the engine's
    context length in tokens, from which each harness derives its compaction settings.
    """

    base_url: str
    token: str
    model: str
    context_window: int

    def __post_init__(self) -> None:
        parts = urlsplit(self.base_url)
        if parts.scheme not in {"http", "https"} or not parts.netloc:
            raise ValueError(f"base_url must be an http(s) URL: {self.base_url!r}")
        if parts.query or parts.fragment:
            raise ValueError(f"base_url must not carry a query or fragment: {self.base_url!r}")
        if parts.path.rstrip("/").endswith("/v1"):
            raise ValueError(f"base_url must not end in /v1 (harnesses add it): {self.base_url!r}")
        if not self.token or not all(
            c.isascii() and c.isprintable() and not c.isspace() for c in self.token
        ):
            raise ValueError("token must be non-empty printable ASCII without whitespace")
        if not self.model.strip() or "\0" in self.model or "\n" in self.model:
            raise ValueError(f"invalid model name: {self.model!r}")
        try:
            self.model.encode("utf-8")
        except UnicodeEncodeError as error:
            raise ValueError(f"model name is not valid Unicode: {self.model!r}") from error
        if self.context_window <= 0:
            raise ValueError(f"context_window must be positive, got {self.context_window}")

    @property
    def root(self) -> str:
        """base_url without a trailing slash."""
        return self.base_url.rstrip("/")
