"""Open sessions, keyed by the token the agent uses as its API key.

A session is one agent episode: one trajectory tree, however many sub-agents share the token. It is
never serialized behind a lock: requests of one session run concurrently and the append-only tree
keeps them consistent. The registry tracks each session's in-flight engine requests so closing a
session can abort them (an orphaned generation outliving its episode wastes the GPU, and crashes
SGLang when the trainer takes the memory back).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field

from protocol_adapters._dialects.parse_memo import ParseMemo
from protocol_adapters._types import AdapterError, ErrorKind
from trajectory_tree import SessionTree

from .shortened import Refused

MIN_CONTEXT_TOKENS = 3
"""Room for one prompt token and one generated token under SGLang's rule (see ``Session``)."""


class ContextTooLarge(ValueError):
    """A configured context length the engine cannot serve."""


@dataclass(frozen=True, slots=True)
class SessionLimits:
    """Per-session caps.

    ``context_tokens`` is the most tokens one model call may hold, prompt and reply together:
    ``None`` means the engine's own context length, learned when the server starts; a larger
    value than the engine's is refused. ``max_turns`` counts the model calls whose reply the
    client received: refused and failed calls, aborted generations and replays of a recorded
    answer do not use it up.
    """

    max_turns: int = 1000
    context_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        if self.context_tokens is not None and self.context_tokens < MIN_CONTEXT_TOKENS:
            raise ValueError(
                f"context_tokens must be >= {MIN_CONTEXT_TOKENS}, got {self.context_tokens}"
            )


PARSE_MEMOS = 8
"""Agents per session whose last request's parse is kept: a main agent and its live sub-agents."""


@dataclass(slots=True)
class Session:
    """One open session.

    ``context_tokens`` is resolved (the engine's when the limits left it open). SGLang refuses a
    generation whose prompt plus ``max_new_tokens`` reaches the context length (``>=``), so a
    prompt may hold at most ``context_tokens - 2`` tokens and leaves ``context_tokens - 1 -
    prompt`` tokens of room for the reply.
    """

    token: str
    tree: SessionTree
    limits: SessionLimits
    context_tokens: int
    in_flight: set[str] = field(default_factory=set)
    """Engine request ids currently generating for this session."""
    answered: int = 0
    """Model calls whose generated reply the client received (what ``max_turns`` caps)."""
    pending: int = 0
    """Calls admitted and not yet settled. They count against the cap until they settle, so
    concurrent calls can never overshoot it."""
    closed: bool = False
    refused: dict[str | None, Refused] = field(default_factory=dict)
    """Each agent's last request refused as too long, to tell its shortened resend
    (shortened.py); keyed by agent id (None: the main agent)."""
    parsed: OrderedDict[str | None, ParseMemo] = field(default_factory=OrderedDict)
    """Each agent's last request's messages, parsed (keyed like ``refused``; the most recently
    used :data:`PARSE_MEMOS` agents)."""
    _settled: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self._settled.set()

    def parse_memo(self, agent: str | None) -> ParseMemo:
        """The memo of ``agent``'s requests (None: the main agent), most recently used now."""
        memo = self.parsed.pop(agent, None) or ParseMemo()
        self.parsed[agent] = memo
        while len(self.parsed) > PARSE_MEMOS:
            self.parsed.popitem(last=False)
        return memo

    @property
    def max_prompt_tokens(self) -> int:
        return self.context_tokens - 2

    def room(self, prompt_tokens: int) -> int:
        """The most tokens the engine will generate after a prompt of ``prompt_tokens``."""
        return self.context_tokens - 1 - prompt_tokens

    def admit(self) -> None:
        """Let one more model call in, or refuse it when the session is closed or at its cap."""
        if self.closed:
            raise AdapterError(ErrorKind.AUTHENTICATION, "session is closed")
        if self.answered + self.pending >= self.limits.max_turns:
            raise AdapterError(
                ErrorKind.RATE_LIMITED,
                f"session turn limit reached ({self.limits.max_turns} model calls)",
            )
        self.pending += 1
        self._settled.clear()

    def settle(self, *, answered: bool) -> None:
        """An admitted call ended; ``answered`` when the client got a generated reply."""
        self.pending -= 1
        if answered:
            self.answered += 1
        if self.pending == 0:
            self._settled.set()

    async def settled(self, timeout: float) -> bool:
        """Wait until no admitted call is still running; False if ``timeout`` passed first."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._settled.wait()
        return self.pending == 0


class SessionRegistry:
    """Maps session tokens to sessions. Tokens are secrets: compare them only by dict lookup.

    ``engine_context`` is the engine's context length once the server has learned it; sessions
    whose limits leave the context open get it, and no session may have a larger one.
    """

    def __init__(self, limits: SessionLimits | None = None) -> None:
        self._limits = limits or SessionLimits()
        self._sessions: dict[str, Session] = {}
        self.engine_context: int | None = None

    @property
    def limits(self) -> SessionLimits:
        return self._limits

    def open(
        self, session_id: str = "", *, token: str | None = None, limits: SessionLimits | None = None
    ) -> Session:
        """Open a session; a fresh random token is made unless one is given.

        ``session_id`` names the session's tree and keys the engine's sticky routing; a fresh
        random id is made when none is given (never the token: the token is a credential, and
        the id travels in trees, samples and routing headers).

        Raises :class:`ContextTooLarge` for a context the engine cannot serve, and
        ``RuntimeError`` when the context is left to the engine before the server learned it.
        """
        limits = limits or self._limits
        context = self.resolve_context(limits)
        token = token or "sess-" + secrets.token_urlsafe(24)
        if token in self._sessions:
            raise ValueError("a session with this token is already open")
        name = session_id or "session-" + secrets.token_hex(8)
        session = Session(token, SessionTree(name), limits, context)
        self._sessions[token] = session
        return session

    def resolve_context(self, limits: SessionLimits) -> int:
        """The context length a session with ``limits`` gets."""
        engine = self.engine_context
        if limits.context_tokens is None:
            if engine is None:
                raise RuntimeError(
                    "the engine's context length is not known yet: start the server first, or "
                    "set SessionLimits.context_tokens"
                )
            return engine
        if engine is not None and limits.context_tokens > engine:
            raise ContextTooLarge(
                f"context_tokens={limits.context_tokens} is larger than the engine's context "
                f"length ({engine} tokens): prompts that fit it would be refused by the engine"
            )
        return limits.context_tokens

    def get(self, token: str) -> Session:
        session = self._sessions.get(token)
        if session is None:
            raise AdapterError(ErrorKind.AUTHENTICATION, "unknown or expired session token")
        return session

    def close(self, token: str) -> Session | None:
        """Forget the session (marked closed); None if it was already gone. The caller aborts
        its ``in_flight`` requests first."""
        session = self._sessions.pop(token, None)
        if session is not None:
            session.closed = True
        return session

    def __iter__(self) -> Iterator[Session]:
        return iter(list(self._sessions.values()))

    def __len__(self) -> int:
        return len(self._sessions)
