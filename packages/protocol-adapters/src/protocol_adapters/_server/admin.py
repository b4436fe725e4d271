"""Session lifecycle over HTTP, for callers in another process (a rollout worker, a Ray actor).

In-process callers use :class:`AdapterServer` directly; this API exists so the adapter can run as
its own service. It is an application of its own, served on its own listener
(:class:`AdminConfig`), because the agent-facing port is forwarded into sandboxes: an agent that
could reach this API could read or close its own episode. Every call must carry the admin token as
a bearer token; session tokens are credentials for one session's model calls and nothing else.

Closing a session serializes its tree *before* forgetting it: if anything went wrong on the way,
the session would still be there to be read or closed again, never lost with its turns.

A tree with MoE routing points into a binary sidecar (``trajectory_tree.dump_routing``) its JSON
does not hold. Asked with ``?routing=1``, the tree and close calls answer both from one
snapshot: ``application/octet-stream``, the JSON's UTF-8 first, its length in the
``Tree-Json-Bytes`` header, the sidecar after it.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web

from protocol_adapters._dialects.json_shape import text_problem
from protocol_adapters._types import AdapterError

from .config import AdminConfig
from .sessions import Session, SessionLimits, SessionRegistry
from .tree_json import tree_json, tree_with_routing

log = logging.getLogger(__name__)

TREE_JSON_BYTES = "Tree-Json-Bytes"
"""The header giving the JSON's length in a ``?routing=1`` answer; the sidecar follows it."""

StopSession = Callable[[Session], Awaitable[None]]
"""Refuses a session's new calls, aborts its generations, waits until its tree is final."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def authorized(request: web.Request, token: str) -> bool:
    """Whether ``request`` carries ``token`` as its bearer token (compared in constant time)."""
    scheme, _, offered = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        offered.strip().encode("utf-8", "surrogateescape"), token.encode()
    )


def error_answer(status: int, message: str) -> web.Response:
    """The admin API's error shape (the fleet's front answers in it too)."""
    return web.json_response({"error": {"message": message}}, status=status)


def _with_routing(request: web.Request) -> bool:
    """Whether the caller asked for the routing sidecar too (``?routing=1``)."""
    asked = request.query.get("routing", "0")
    if asked not in ("0", "1"):
        raise ValueError("routing must be 0 or 1")
    return asked == "1"


async def _tree_answer(session: Session, with_routing: bool) -> web.Response:
    if with_routing:
        document, sidecar = await tree_with_routing(session.tree)
        return web.Response(
            body=document + sidecar,
            content_type="application/octet-stream",
            headers={TREE_JSON_BYTES: str(len(document))},
        )
    return web.Response(text=await tree_json(session.tree), content_type="application/json")


def _limit(body: Mapping[str, object], key: str, default: int | None) -> int | None:
    value = body.get(key, default)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise ValueError(f"{key} must be an integer, got {value!r}")
    return value


def create_admin_app(
    config: AdminConfig, defaults: SessionLimits, sessions: SessionRegistry, stop: StopSession
) -> web.Application:
    """``POST /admin/sessions``, ``GET /admin/sessions/{token}/tree``,
    ``DELETE /admin/sessions/{token}``; anything else is a 404."""

    @web.middleware
    async def admin_only(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not authorized(request, config.token):
            return error_answer(401, "admin token required")
        try:
            return await handler(request)
        except web.HTTPException as exc:
            return error_answer(exc.status, exc.reason)
        except Exception as exc:  # the service stays up; the caller gets a JSON error
            log.exception("unexpected error handling %s %s", request.method, request.path)
            return error_answer(500, f"internal error: {type(exc).__name__}")

    async def open_session(request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json() if request.can_read_body else {}
        except ValueError:
            return error_answer(400, "body must be JSON")
        if not isinstance(body, dict):
            return error_answer(400, "body must be a JSON object")
        session_id = body.get("session_id", "")
        if not isinstance(session_id, str):
            return error_answer(400, "session_id must be a string")
        if (problem := text_problem(session_id)) is not None:
            return error_answer(400, f"session_id {problem}")
        try:
            max_turns = _limit(body, "max_turns", defaults.max_turns)
            if max_turns is None:
                raise ValueError("max_turns must be an integer, got None")
            context = _limit(body, "context_tokens", defaults.context_tokens)
            session = sessions.open(session_id, limits=SessionLimits(max_turns, context))
        except ValueError as exc:
            return error_answer(400, str(exc))
        return web.json_response({"token": session.token, "session_id": session.tree.session_id})

    def open_one(request: web.Request) -> Session | None:
        try:
            return sessions.get(request.match_info["token"])
        except AdapterError:
            return None

    async def get_tree(request: web.Request) -> web.StreamResponse:
        session = open_one(request)
        if session is None:
            return error_answer(404, "no open session with this token")
        try:
            with_routing = _with_routing(request)
        except ValueError as exc:
            return error_answer(400, str(exc))
        return await _tree_answer(session, with_routing)

    async def close_session(request: web.Request) -> web.StreamResponse:
        session = open_one(request)
        if session is None:
            return error_answer(404, "no open session with this token")
        try:
            with_routing = _with_routing(request)
        except ValueError as exc:
            return error_answer(400, str(exc))
        await stop(session)
        # Serialized first: a failure here keeps the session open.
        answer = await _tree_answer(session, with_routing)
        sessions.close(session.token)
        return answer

    async def not_found(request: web.Request) -> web.StreamResponse:
        return error_answer(404, f"no route for {request.method} {request.path}")

    app = web.Application(middlewares=[admin_only])
    app.router.add_post("/admin/sessions", open_session)
    app.router.add_get("/admin/sessions/{token}/tree", get_tree)
    app.router.add_delete("/admin/sessions/{token}", close_session)
    app.router.add_route("*", "/{tail:.*}", not_found)
    return app
