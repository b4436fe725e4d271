"""The app's one user-facing error: a bad argument or input, reported as one line."""

from __future__ import annotations


class UsageError(Exception):
    """A bad argument or input; the command line prints it as one line and exits 2."""
