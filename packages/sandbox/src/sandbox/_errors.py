"""Typed failures of sandbox operations.

Callers branch on these (retry a boot, treat a missing file as "no report written"), so each
failure mode has its own class instead of a message to parse.
"""

from __future__ import annotations


class SandboxError(Exception):
    """Base class of every error raised by this package."""


class SandboxUnavailableError(SandboxError):
    """A backend cannot run here (a missing tool, an SDK that is not installed)."""


class SandboxBootError(SandboxError):
    """Creating a sandbox failed, after the configured retries."""


class SandboxClosedError(SandboxError):
    """The sandbox was used after `close()`."""


class SandboxFileNotFoundError(SandboxError, FileNotFoundError):
    """A path read inside the sandbox does not exist (or is not a regular file)."""

    def __init__(self, path: str) -> None:
        super().__init__(f"no such file in sandbox: {path}")
        self.path = path


class SandboxCommandError(SandboxError):
    """An internal helper command (file I/O, git plumbing) failed inside the sandbox."""


class UnsupportedSpecError(SandboxError):
    """The spec asks for something this backend cannot provide."""
