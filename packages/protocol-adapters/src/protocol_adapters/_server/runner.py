"""Run the adapter in-process (tests, the episode loop) or from the command line."""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Self

from aiohttp import web

from protocol_adapters._engine.protocol import Engine
from protocol_adapters._tokenizer import Vocabulary
from protocol_adapters._types import AdapterError

from .admin import create_admin_app
from .app import create_app
from .config import AdapterConfig
from .ports import ParserFactory, PromptRenderer
from .sessions import ContextTooLarge, Session, SessionRegistry
from .timing import TimedEngine, TurnTimings
from .turn import TurnRunner
from .workers import Workers

_ABORT_TIMEOUT = 5.0
"""How long closing a session waits for the engine to acknowledge its aborts, and then for the
aborted calls to record what they got."""


class AdapterServer:
    """The adapter on a real socket. ``async with AdapterServer(...) as server: server.url``.

    Handler cancellation is on: when a client disconnects, its handler is cancelled and the
    engine request behind it is aborted. With ``config.admin`` set, the session API listens on
    a second socket of its own (``server.admin_url``), never on the agent-facing one. With a
    ``timings`` recorder, every answered model call's latency split (what the adapter added
    before and after the engine) is recorded in it (see ``timing.py``).
    """

    def __init__(
        self,
        config: AdapterConfig,
        engine: Engine,
        renderer: PromptRenderer,
        vocabulary: Vocabulary,
        parsers: ParserFactory,
        sessions: SessionRegistry | None = None,
        timings: TurnTimings | None = None,
    ) -> None:
        self.config = config
        self.engine = engine
        self.sessions = sessions or SessionRegistry(config.limits)
        self.workers = Workers(config.large_bodies)
        self.timings = timings
        timed = engine if timings is None else TimedEngine(engine)
        self.runner = TurnRunner(config, timed, renderer, vocabulary, parsers, self.workers)
        self.app = create_app(config, self.runner, self.sessions, self.workers, timings)
        self.admin_app = (
            None
            if config.admin is None
            else create_admin_app(config.admin, config.limits, self.sessions, self.stop_session)
        )
        self._listeners: list[web.AppRunner] = []
        self._url: str | None = None
        self._admin_url: str | None = None

    @property
    def url(self) -> str:
        """Base URL without a path (Anthropic clients); OpenAI clients append ``/v1``."""
        if self._url is None:
            raise RuntimeError("the adapter is not running (use `async with`)")
        return self._url

    @property
    def admin_url(self) -> str | None:
        """Base URL of the session API (``None`` when ``config.admin`` is not set)."""
        return self._admin_url

    async def start(self) -> None:
        """Learn the engine's context length, then listen.

        Raises :class:`ContextTooLarge` when the configured context is larger than the engine's
        (every prompt between the two would be refused by the engine with a misleading error),
        and the engine's :class:`AdapterError` when it cannot be asked.
        """
        engine_context = await self.engine.context_length()
        self.sessions.engine_context = engine_context
        try:
            self.sessions.resolve_context(self.sessions.limits)
        except ContextTooLarge as exc:
            self.sessions.engine_context = None
            raise ContextTooLarge(f"refusing to start: {exc}") from None
        await self.workers.start()
        try:
            self._url = await self._listen(self.app, self.config.host, self.config.port)
            admin = self.config.admin
            if self.admin_app is not None and admin is not None:
                self._admin_url = await self._listen(self.admin_app, admin.host, admin.port)
        except BaseException:
            await self._close_listeners()
            raise

    async def _listen(self, app: web.Application, host: str, port: int) -> str:
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await runner.setup()
        self._listeners.append(runner)
        await web.TCPSite(runner, host, port, backlog=1024).start()
        bound_host, bound_port = runner.addresses[0][:2]
        return f"http://{bound_host}:{bound_port}"

    async def close_session(self, token: str) -> Session:
        """Close a session: stop it (see :meth:`stop_session`), then forget its token.

        Raises ``KeyError`` for a token that is not open (never opened, or closed already).
        """
        try:
            session = self.sessions.get(token)
        except AdapterError:
            raise KeyError("no open session with this token") from None
        await self.stop_session(session)
        self.sessions.close(token)
        return session

    async def stop_session(self, session: Session) -> None:
        """Refuse the session's new calls, abort what it still has generating on the engine and
        wait (bounded) until every call it admitted has recorded its turn, so its tree is final.
        Safe to call again."""
        session.closed = True
        if session.in_flight:
            await asyncio.wait_for(
                asyncio.gather(
                    *(self.engine.abort(rid) for rid in list(session.in_flight)),
                    return_exceptions=True,
                ),
                _ABORT_TIMEOUT,
            )
        await session.settled(_ABORT_TIMEOUT)

    async def stop(self) -> None:
        for session in list(self.sessions):
            await self.close_session(session.token)
        await self._close_listeners()
        self.workers.close()

    async def _close_listeners(self) -> None:
        while self._listeners:
            await self._listeners.pop().cleanup()
        self._url = self._admin_url = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
