"""Errors raised for input the tree refuses: each says what was wrong."""

from __future__ import annotations


class TrajectoryError(ValueError):
    """Base class for everything trajectory-tree rejects."""


class InvalidTurn(TrajectoryError):
    """A turn's inputs are inconsistent (lengths, token ids, logprobs, segments)."""


class ForeignRoute(TrajectoryError):
    """A route from another tree, or from another version of the same serialized tree."""


class FormatError(TrajectoryError):
    """A serialized tree that cannot be read back."""
