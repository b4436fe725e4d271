"""The agent CLIs the app runs, by the names the command line and run files use."""

from __future__ import annotations

from harness import ClaudeCode, Codex, Harness

AGENTS = ("claude-code", "codex")


def harness_for(name: str) -> Harness:
    """The pinned harness for an agent name (ValueError naming the choices otherwise)."""
    if name == "claude-code":
        return ClaudeCode()
    if name == "codex":
        return Codex()
    raise ValueError(f"unknown agent {name!r}; choose one of {', '.join(AGENTS)}")
