"""Async sandboxes for agent episodes: local bubblewrap by default, E2B for scale."""

__version__ = "0.1.0"
