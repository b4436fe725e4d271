"""Run the adapter in-process (tests, the episode loop) or from the command line."""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Self

from aiohttp import web

from protocol_adapters.engine.protocol import Engine
from protocol_adapters.tokenizer import Vocabulary

from .app import create_app
from .config import AdapterConfig
from .ports import ParserFactory, PromptRenderer
from .sessions import Session, SessionRegistry
from .turn import TurnRunner

_ABORT_TIMEOUT = 5.0


class AdapterServer:
    """The adapter on a real socket. ``async with AdapterServer(...) as server: server.url``.

    Handler cancellation is on: when a client disconnects, its handler is cancelled and the
    engine request behind it is aborted.
    """

    def __init__(
        self,
        config: AdapterConfig,
        engine: Engine,
        renderer: PromptRenderer,
        vocabulary: Vocabulary,
        parsers: ParserFactory,
        sessions: SessionRegistry | None = None,
    ) -> None:
        self.config = config
        self.engine = engine
        self.sessions = sessions or SessionRegistry(config.limits)
        self.runner = TurnRunner(config, engine, renderer, vocabulary, parsers)
        self.app = create_app(config, self.runner, self.sessions, self.close_session)
        self._web: web.AppRunner | None = None
        self._port = config.port

    @property
    def url(self) -> str:
        """Base URL without a path (Anthropic clients); OpenAI clients append ``/v1``."""
        return f"http://{self.config.host}:{self._port}"

    async def start(self) -> None:
        self._web = web.AppRunner(self.app, handler_cancellation=True, access_log=None)
        await self._web.setup()
        site = web.TCPSite(self._web, self.config.host, self.config.port, backlog=1024)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        if sockets:
            self._port = sockets[0].getsockname()[1]

    async def close_session(self, token: str) -> Session:
        """Close a session and abort whatever it still has generating on the engine."""
        session = self.sessions.close(token)
        if session.in_flight:
            await asyncio.wait_for(
                asyncio.gather(
                    *(self.engine.abort(rid) for rid in list(session.in_flight)),
                    return_exceptions=True,
                ),
                _ABORT_TIMEOUT,
            )
        return session

    async def stop(self) -> None:
        for session in list(self.sessions):
            await self.close_session(session.token)
        if self._web is not None:
            await self._web.cleanup()
            self._web = None

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
