"""The fleet's one admin API: the routes and answers of ``_server/admin.py``, each call forwarded
to the worker that owns the session.

Opening pins the session to ``worker_for(session_id)`` (a session opened without an id gets one
here, so it is pinned too) and adds the worker's agent-facing ``base_url`` to the answer: the
caller points the agent there. Reading and closing find the worker by the token, in a map kept
here: the token is the worker's own (the agent presents it to that worker), so it cannot carry
the route without changing what workers hand out. Answers come back byte for byte, trees
streamed through. A session whose worker died since it was opened answers 410; a worker that
does not answer, 502; a worker being restarted is waited for when opening, then 503.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp
from aiohttp import hdrs, web

from protocol_adapters._server.admin import TREE_JSON_BYTES, Handler, authorized, error_answer

from .pinning import worker_for
from .supervisor import Running, Slot

log = logging.getLogger(__name__)

OPEN_WAIT = 30.0
"""How long opening a session waits for its worker to come back from a restart."""
_RELAYED = (hdrs.CONTENT_TYPE, TREE_JSON_BYTES)


@dataclass(frozen=True, slots=True)
class Pinned:
    """Where an open session lives: its worker and the generation it was opened on."""

    index: int
    generation: int


def _pin(raw: bytes, workers: int) -> tuple[int, bytes]:
    """The worker an open call goes to, and the body it is sent (with a session id made here
    when the caller gave none). A body the worker will refuse goes to worker 0 for its answer."""
    try:
        body = json.loads(raw) if raw.strip() else {}
    except ValueError:
        return 0, raw
    if not isinstance(body, dict) or not isinstance(body.get("session_id", ""), str):
        return 0, raw
    if not body.get("session_id"):
        body["session_id"] = "session-" + secrets.token_hex(8)
        raw = json.dumps(body).encode()
    return worker_for(body["session_id"], workers), raw


async def _relay(upstream: aiohttp.ClientResponse, request: web.Request) -> web.StreamResponse:
    headers = {name: upstream.headers[name] for name in _RELAYED if name in upstream.headers}
    answer = web.StreamResponse(status=upstream.status, headers=headers)
    if upstream.content_length is not None:
        answer.content_length = upstream.content_length
    await answer.prepare(request)
    async for chunk in upstream.content.iter_chunked(1 << 16):
        await answer.write(chunk)
    await answer.write_eof()
    return answer


def create_front_app(
    token: str, internal_token: str, slots: Sequence[Slot], http: aiohttp.ClientSession
) -> web.Application:
    """The admin API of ``_server/admin.py`` in front of ``slots``; ``token`` is the caller's,
    ``internal_token`` the workers'."""
    sessions: dict[str, Pinned] = {}
    internal = {hdrs.AUTHORIZATION: f"Bearer {internal_token}"}

    @web.middleware
    async def admin_only(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not authorized(request, token):
            return error_answer(401, "admin token required")
        try:
            return await handler(request)
        except aiohttp.ClientError as exc:  # a worker died mid-call
            return error_answer(502, f"the adapter process did not answer: {type(exc).__name__}")
        except web.HTTPException as exc:
            return error_answer(exc.status, exc.reason)
        except Exception as exc:
            log.exception("unexpected error handling %s %s", request.method, request.path)
            return error_answer(500, f"internal error: {type(exc).__name__}")

    async def open_session(request: web.Request) -> web.StreamResponse:
        index, body = _pin(await request.read(), len(slots))
        running = await slots[index].ready(OPEN_WAIT)
        if running is None:
            return error_answer(
                503, f"adapter process {index} is restarting; open the session again"
            )
        url = f"{running.serving.admin_url}/admin/sessions"
        headers = {**internal, hdrs.CONTENT_TYPE: "application/json"}
        async with http.post(url, data=body, headers=headers) as upstream:
            if upstream.status != 200:
                return await _relay(upstream, request)
            answer = await upstream.json()
        sessions[answer["token"]] = Pinned(index, running.generation)
        return web.json_response({**answer, "base_url": running.serving.url})

    def owner(pinned: Pinned) -> Running | None:
        running = slots[pinned.index].current
        return running if running is not None and running.generation == pinned.generation else None

    async def session_call(request: web.Request) -> web.StreamResponse:
        session_token = request.match_info["token"]
        pinned = sessions.get(session_token)
        if pinned is None:
            return error_answer(404, "no open session with this token")
        running = owner(pinned)
        if running is None:
            if request.method == hdrs.METH_DELETE:
                del sessions[session_token]
            return error_answer(
                410,
                f"the adapter process holding this session (worker {pinned.index}) exited: "
                "the session and its turns are lost",
            )
        url = running.serving.admin_url + request.raw_path
        async with http.request(request.method, url, headers=internal) as upstream:
            if request.method == hdrs.METH_DELETE and upstream.status in (200, 404):
                sessions.pop(session_token, None)
            return await _relay(upstream, request)

    async def not_found(request: web.Request) -> web.StreamResponse:
        return error_answer(404, f"no route for {request.method} {request.path}")

    app = web.Application(middlewares=[admin_only])
    app.router.add_post("/admin/sessions", open_session)
    app.router.add_get("/admin/sessions/{token}/tree", session_call)
    app.router.add_delete("/admin/sessions/{token}", session_call)
    app.router.add_route("*", "/{tail:.*}", not_found)
    return app
