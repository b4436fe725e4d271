"""Session lifecycle over HTTP, for callers in another process (a rollout worker, a Ray actor).

In-process callers use :class:`AdapterServer` directly; this API exists so the adapter can run as
its own service. It is off unless ``AdapterConfig.admin_token`` is set, and every call must carry
that token as a bearer token: session tokens are credentials, never handed out anonymously.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

from aiohttp import web

from protocol_adapters.types import AdapterError
from trajectory_tree import dumps

from .config import AdapterConfig
from .sessions import SessionLimits, SessionRegistry

CloseSession = Callable[[str], Awaitable[object]]


def _authorized(request: web.Request, config: AdapterConfig) -> bool:
    expected = config.admin_token
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return (
        expected is not None
        and scheme.lower() == "bearer"
        and hmac.compare_digest(token.strip().encode(), expected.encode())
    )


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message}}, status=status)


def admin_routes(
    config: AdapterConfig, sessions: SessionRegistry, close: CloseSession
) -> list[web.RouteDef]:
    """Routes under ``/admin``; ``close`` closes a session and aborts its in-flight requests."""

    async def guard(request: web.Request) -> web.Response | None:
        if not _authorized(request, config):
            return _error(401, "admin token required")
        return None

    async def open_session(request: web.Request) -> web.StreamResponse:
        if (denied := await guard(request)) is not None:
            return denied
        try:
            body = await request.json() if request.can_read_body else {}
        except ValueError:
            return _error(400, "body must be JSON")
        if not isinstance(body, dict):
            return _error(400, "body must be a JSON object")
        session_id = body.get("session_id", "")
        if not isinstance(session_id, str):
            return _error(400, "session_id must be a string")
        limits = config.limits
        if "context_tokens" in body or "max_turns" in body:
            try:
                limits = SessionLimits(
                    max_turns=int(body.get("max_turns", limits.max_turns)),
                    context_tokens=int(body.get("context_tokens", limits.context_tokens)),
                )
            except (TypeError, ValueError):
                return _error(400, "max_turns and context_tokens must be integers")
        session = sessions.open(session_id, limits=limits)
        return web.json_response({"token": session.token, "session_id": session.tree.session_id})

    async def get_tree(request: web.Request) -> web.StreamResponse:
        if (denied := await guard(request)) is not None:
            return denied
        token = request.match_info["token"]
        try:
            session = sessions.get(token)
        except AdapterError:
            return _error(404, "no open session with this token")
        return web.Response(text=dumps(session.tree), content_type="application/json")

    async def close_session(request: web.Request) -> web.StreamResponse:
        if (denied := await guard(request)) is not None:
            return denied
        token = request.match_info["token"]
        try:
            session = sessions.get(token)
        except AdapterError:
            return _error(404, "no open session with this token")
        await close(token)
        return web.Response(text=dumps(session.tree), content_type="application/json")

    return [
        web.post("/admin/sessions", open_session),
        web.get("/admin/sessions/{token}/tree", get_tree),
        web.delete("/admin/sessions/{token}", close_session),
    ]
