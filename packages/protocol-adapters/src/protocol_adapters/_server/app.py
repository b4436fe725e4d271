"""The aiohttp application: three dialects over one turn runner.

Every failure is answered in the dialect the client spoke, with the status it expects, and never
takes the server down. The session token is whatever the client sends as its API key
(``x-api-key`` or ``Authorization: Bearer``), so an agent CLI needs no change beyond a base URL.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from protocol_adapters._dialects import DIALECTS, Dialect
from protocol_adapters._dialects.json_shape import text_problem
from protocol_adapters._types import AdapterError, ErrorKind, NeutralRequest, Usage

from .config import AdapterConfig
from .sessions import Session, SessionRegistry
from .timing import TurnTimings, start_clock
from .turn import AGENT_ID_HEADER, READ_HEADERS, Finished, Generated, Started, TurnRunner
from .workers import Workers

log = logging.getLogger(__name__)

ANTHROPIC = DIALECTS["anthropic"]
OPENAI_CHAT = DIALECTS["openai_chat"]
OPENAI_RESPONSES = DIALECTS["openai_responses"]

RUNNER_KEY = web.AppKey("runner", TurnRunner)
SESSIONS_KEY = web.AppKey("sessions", SessionRegistry)
CONFIG_KEY = web.AppKey("config", AdapterConfig)
WORKERS_KEY = web.AppKey("workers", Workers)
TIMINGS_KEY = web.AppKey("timings", TurnTimings)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def session_token(request: web.Request) -> str | None:
    key = request.headers.get("x-api-key")
    if key:
        return key.strip()
    auth = request.headers.get("Authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return None


def error_json(
    dialect: Dialect, kind: ErrorKind, message: str, param: str | None = None
) -> web.Response:
    status, body = dialect.error_response(kind, message, param)
    headers = {"Retry-After": "1"} if kind in (ErrorKind.RATE_LIMITED, ErrorKind.OVERLOADED) else {}
    return web.json_response(body, status=status, headers=headers)


async def read_request(request: web.Request, dialect: Dialect) -> NeutralRequest:
    """The body as the dialect's neutral request, or an AdapterError in its terms."""
    return await request.app[WORKERS_KEY].decode(dialect.name, await read_body(request))


async def read_body(request: web.Request) -> bytes | bytearray:
    """The whole body, within ``max_body_bytes``.

    With a ``Content-Length`` each chunk is copied once, into a buffer of that size: growing a
    buffer chunk by chunk, or joining the chunks at the end, copies a 20 MB body again in one
    piece on the event loop (15-35 ms of GIL, while other sessions wait).
    """
    limit = request.app[CONFIG_KEY].max_body_bytes
    length = request.content_length
    if length is None:
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge as exc:
            raise AdapterError(
                ErrorKind.REQUEST_TOO_LARGE, f"request body too large: {exc.text}"
            ) from None
    if length > limit:
        raise AdapterError(
            ErrorKind.REQUEST_TOO_LARGE,
            f"request body too large: {length} bytes, the limit is {limit}",
        )
    body = bytearray(length)
    filled = 0
    async for chunk in request.content.iter_any():
        end = filled + len(chunk)
        if end > length:
            raise AdapterError(ErrorKind.INVALID_REQUEST, "request body longer than its length")
        body[filled:end] = chunk
        filled = end
    if filled != length:
        raise AdapterError(ErrorKind.INVALID_REQUEST, "request body ended early")
    return body


def read_headers(request: web.Request) -> dict[str, str]:
    """The request headers that reach the tree, lower-cased; each must be valid UTF-8 (aiohttp
    hands over other bytes as lone surrogates, which no tree file or HTTP body could hold)."""
    headers: dict[str, str] = {}
    for name in READ_HEADERS:
        value = request.headers.get(name)
        if value is None:
            continue
        if text_problem(value) is not None:
            raise AdapterError(ErrorKind.INVALID_REQUEST, f"header {name}: not valid UTF-8")
        headers[name] = value
    return headers


def _session(request: web.Request) -> Session:
    token = session_token(request)
    if token is None:
        raise AdapterError(
            ErrorKind.AUTHENTICATION,
            "missing API key: send the session token as x-api-key or bearer",
        )
    return request.app[SESSIONS_KEY].get(token)


def model_handler(dialect: Dialect) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        timings = request.app.get(TIMINGS_KEY)
        clock = None if timings is None else start_clock()
        response: web.StreamResponse
        try:
            session = _session(request)
            headers = read_headers(request)
            raw = await read_body(request)
            if clock is not None:
                clock.body_read = time.perf_counter()
            memo = session.parse_memo(headers.get(AGENT_ID_HEADER))
            neutral = await request.app[WORKERS_KEY].decode(dialect.name, raw, memo)
            runner = request.app[RUNNER_KEY]
            if not neutral.stream:
                outcome = await runner.run(session, neutral, headers)
                payload = dialect.response_body(
                    neutral,
                    outcome.reply,
                    outcome.usage,
                    outcome.stop,
                    dialect.new_response_id(),
                    outcome.logprobs,
                )
                response = web.json_response(payload)
                if clock is not None:  # written here, so the flush can be timed
                    await response.prepare(request)
                    await response.write_eof()
            else:
                response = await _stream(request, dialect, runner, session, neutral, headers)
        except AdapterError as exc:
            return error_json(dialect, exc.kind, exc.message, exc.param)
        if timings is not None and clock is not None and response.status == 200:
            timing = clock.finish(dialect.name, neutral.stream)
            if timing is not None:
                timings.record(timing)
        return response

    return handle


async def _stream(
    request: web.Request,
    dialect: Dialect,
    runner: TurnRunner,
    session: Session,
    neutral: NeutralRequest,
    headers: dict[str, str],
) -> web.StreamResponse:
    items = runner.stream(session, neutral, headers)
    encoder = dialect.stream_encoder(neutral, dialect.new_response_id())
    response: web.StreamResponse | None = None
    try:
        async for item in items:
            if isinstance(item, Started):
                # Errors before this point get a plain HTTP error; after it, an in-stream event.
                response = web.StreamResponse(
                    headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
                )
                await response.prepare(request)
                await response.write(encoder.start(Usage(item.prompt_tokens, 0)))
            elif isinstance(item, Generated):
                assert response is not None
                data = encoder.logprobs(item.tokens)  # OpenAI's: held for the next event
                if data:
                    await response.write(data)
            elif isinstance(item, Finished):
                assert response is not None
                outcome = item.outcome
                await response.write(encoder.finish(outcome.stop, outcome.usage))
            else:
                assert response is not None
                data = encoder.event(item)
                if data:
                    await response.write(data)
    except AdapterError as exc:
        if response is None:
            return error_json(dialect, exc.kind, exc.message, exc.param)
        await response.write(encoder.error(exc.kind, exc.message))
    finally:
        await items.aclose()
    assert response is not None
    await response.write_eof()
    return response


async def count_tokens(request: web.Request) -> web.StreamResponse:
    try:
        session = _session(request)
        neutral = await read_request(request, ANTHROPIC)
        tokens = await request.app[RUNNER_KEY].count_tokens(session, neutral)
        return web.json_response({"input_tokens": tokens})
    except AdapterError as exc:
        return error_json(ANTHROPIC, exc.kind, exc.message, exc.param)


async def models(request: web.Request) -> web.StreamResponse:
    names = request.app[CONFIG_KEY].models
    data = [
        {
            "id": n,
            "object": "model",
            "type": "model",
            "created": 0,
            "owned_by": "policy",
            "display_name": n,
            "created_at": "1970-01-01T00:00:00Z",
        }
        for n in names
    ]
    return web.json_response(
        {
            "object": "list",
            "data": data,
            "has_more": False,
            "first_id": names[0] if names else None,
            "last_id": names[-1] if names else None,
        }
    )


async def health(request: web.Request) -> web.StreamResponse:
    return web.json_response({"status": "ok", "sessions": len(request.app[SESSIONS_KEY])})


@web.middleware
async def unexpected_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Anything unforeseen becomes a 500 in the dialect's shape; the server stays up."""
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except (ConnectionResetError, TimeoutError):
        raise
    except Exception as exc:
        log.exception("unexpected error handling %s %s", request.method, request.path)
        return error_json(
            dialect_of_path(request.path),
            ErrorKind.ENGINE_ERROR,
            f"internal error: {type(exc).__name__}",
        )


def dialect_of_path(path: str) -> Dialect:
    """The dialect a client expects errors in, from the path alone (Anthropic where unclear)."""
    if path.startswith("/v1/chat"):
        return OPENAI_CHAT
    if path.startswith("/v1/responses"):
        return OPENAI_RESPONSES
    return ANTHROPIC


async def _not_found(request: web.Request) -> web.StreamResponse:
    return error_json(
        dialect_of_path(request.path),
        ErrorKind.NOT_FOUND,
        f"no route for {request.method} {request.path}",
    )


def create_app(
    config: AdapterConfig,
    runner: TurnRunner,
    sessions: SessionRegistry,
    workers: Workers,
    timings: TurnTimings | None = None,
) -> web.Application:
    """The agent-facing application; serve it with :class:`AdapterServer` (handler cancellation
    on). It has no session API: ``/admin/...`` is a 404 here (see ``admin.py``). With
    ``timings``, each answered model call's timing is recorded there (``timing.py``)."""
    app = web.Application(client_max_size=config.max_body_bytes, middlewares=[unexpected_errors])
    app[RUNNER_KEY] = runner
    app[SESSIONS_KEY] = sessions
    app[CONFIG_KEY] = config
    app[WORKERS_KEY] = workers
    if timings is not None:
        app[TIMINGS_KEY] = timings
    app.router.add_post("/v1/messages", model_handler(ANTHROPIC))
    app.router.add_post("/v1/messages/count_tokens", count_tokens)
    app.router.add_post("/v1/chat/completions", model_handler(OPENAI_CHAT))
    app.router.add_post("/v1/responses", model_handler(OPENAI_RESPONSES))
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_route("*", "/{tail:.*}", _not_found)
    return app
