"""Open sessions, keyed by the token the agent uses as its API key.

A session is one agent episode: one trajectory tree, however many sub-agents share the token. It is
never serialized behind a lock: requests of one session run concurrently and the append-only tree
keeps them consistent. The registry tracks each session's in-flight engine requests so closing a
session can abort them (an orphaned generation outliving its episode wastes the GPU, and crashes
SGLang when the trainer takes the memory back).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field

from protocol_adapters.types import AdapterError, ErrorKind
from trajectory_tree import SessionTree


@dataclass(frozen=True, slots=True)
class SessionLimits:
    """Per-session caps. ``context_tokens`` is the engine's context length."""

    max_turns: int = 1000
    context_tokens: int = 131072


@dataclass(slots=True)
class Session:
    token: str
    tree: SessionTree
    limits: SessionLimits
    in_flight: set[str] = field(default_factory=set)
    """Engine request ids currently generating for this session."""
    started: int = 0
    """Turns admitted so far (counted at admission, so concurrent requests cannot overshoot)."""
    closed: bool = False

    def admit(self) -> None:
        """Count one more model call, or refuse it when the session is closed or at its cap."""
        if self.closed:
            raise AdapterError(ErrorKind.AUTHENTICATION, "session is closed")
        if self.started >= self.limits.max_turns:
            raise AdapterError(
                ErrorKind.RATE_LIMITED,
                f"session turn limit reached ({self.limits.max_turns} model calls)",
            )
        self.started += 1


class SessionRegistry:
    """Maps session tokens to sessions. Tokens are secrets: compare them only by dict lookup."""

    def __init__(self, limits: SessionLimits | None = None) -> None:
        self._limits = limits or SessionLimits()
        self._sessions: dict[str, Session] = {}

    def open(
        self, session_id: str = "", *, token: str | None = None, limits: SessionLimits | None = None
    ) -> Session:
        """Open a session; a fresh random token is made unless one is given."""
        token = token or "sess-" + secrets.token_urlsafe(24)
        if token in self._sessions:
            raise ValueError("a session with this token is already open")
        session = Session(token, SessionTree(session_id or token), limits or self._limits)
        self._sessions[token] = session
        return session

    def get(self, token: str) -> Session:
        session = self._sessions.get(token)
        if session is None:
            raise AdapterError(ErrorKind.AUTHENTICATION, "unknown or expired session token")
        return session

    def close(self, token: str) -> Session:
        """Remove the session and mark it closed; the caller aborts ``in_flight`` requests."""
        session = self._sessions.pop(token, None)
        if session is None:
            raise KeyError("no open session with this token")
        session.closed = True
        return session

    def __iter__(self) -> Iterator[Session]:
        return iter(list(self._sessions.values()))

    def __len__(self) -> int:
        return len(self._sessions)
