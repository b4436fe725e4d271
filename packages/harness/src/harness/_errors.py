"""Typed failures of harness operations, one class per thing a caller may handle."""

from __future__ import annotations


class HarnessError(Exception):
    """Base class of every error raised by this package."""


class InstallError(HarnessError):
    """Installing or verifying an agent CLI failed; the cache is left without a partial install."""


class InstallLockTimeoutError(InstallError):
    """Another process held the install lock for longer than the configured timeout."""


class LaunchError(HarnessError):
    """The agent could not be launched as asked (a task too large for argv, bad input)."""
