"""The :class:`Engine` over SGLang's native HTTP API, with one pooled aiohttp session.

Failure mapping (each raises :class:`AdapterError`):

- cannot connect (refused, unreachable, connect timeout) -> ``OVERLOADED``: nothing reached the
  engine, so the client may simply retry later (it is down, restarting or saturated). The
  connect timeout counts only time the event loop ran (``connect.py``): a stalled loop never
  makes a healthy engine look unreachable;
- connection reset or dropped after the request was sent -> ``ENGINE_ERROR``;
- ``request_timeout`` or ``stream_idle_timeout`` passed -> ``TIMEOUT``;
- an HTTP error status -> see :func:`wire.error_for_status` (4xx ``INVALID_REQUEST`` or
  ``CONTEXT_LENGTH``, 5xx ``ENGINE_ERROR``, 429/503 busy);
- a response we cannot vouch for token by token -> ``ENGINE_ERROR``.

Whenever a generation may still be running on the engine when a call ends abnormally (timeout,
dropped connection, malformed stream, the caller's task cancelled, a stream left early), its rid is
sent to ``/abort_request``: shielded from further cancellation, bounded by ``abort_timeout``,
failures logged and swallowed. An orphaned generation keeps a GPU slot busy and can crash SGLang
when the trainer takes the memory back.

An answer or stream event over ``STEP_CHARS`` (MoE routing makes them hundreds of MB) is parsed
and validated on a worker thread, its long strings a slice at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable
from types import TracebackType
from typing import Self, TypeVar

import aiohttp

from protocol_adapters._server.body import STEP_CHARS, loads_in_steps
from protocol_adapters._types import AdapterError, ErrorKind

from .coalesce import coalesced
from .config import SGLangConfig
from .connect import ConnectDeadline, connect_trace
from .ids_json import IdsJson, encode
from .sse_reader import SSEParser
from .types import GenerateChunk, GenerateRequest, GenerateResult
from .wire import (
    StreamDecoder,
    context_length_of,
    encoded_body,
    error_for_status,
    malformed,
    parse_result,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

_JSON = {"Content-Type": "application/json"}


class _Expired(Exception):
    """One of our own deadlines passed (never the connect timeout)."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


class _Call:
    """One generation in progress; ``over`` once the engine is known not to be generating it."""

    __slots__ = ("over",)

    def __init__(self) -> None:
        self.over = False


class SGLangEngine:
    """Talks to one SGLang server or gateway at ``config.base_url``.

    Use as ``async with SGLangEngine(config) as engine:`` or call :meth:`aclose` at the end: the
    engine owns its connection pool, which every call shares (a new client per turn would pay a
    TCP handshake each time and defeat keep-alive).
    """

    def __init__(self, config: SGLangConfig) -> None:
        self.config = config
        self._session: aiohttp.ClientSession | None = None
        self._pending_aborts: set[asyncio.Task[None]] = set()
        self._in_flight: set[str] = set()
        self._all_done: asyncio.Event | None = None  # set by the last call to end, once closing
        self._closed = False
        self._warned_cumulative = False
        self._ids_json = IdsJson(config.prompt_json_cache_bytes)

    async def __aenter__(self) -> Self:
        self._client()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Abort generations still running, give their calls a moment to receive the aborted
        results, let pending aborts finish, then close the pool.

        Each step is bounded by ``abort_timeout``: closing never leaves a generation orphaned on
        the engine unless the engine cannot be reached.
        """
        self._closed = True
        if self._session is not None and self._in_flight:
            session = self._session
            self._all_done = asyncio.Event()
            await asyncio.gather(*(self._send_abort(session, rid) for rid in self._in_flight))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.abort_timeout):
                    await self._all_done.wait()
        if self._pending_aborts:
            await asyncio.gather(*self._pending_aborts, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _body(self, request: GenerateRequest, *, stream: bool) -> bytes:
        """The request's bytes; the ids' JSON text reuses the session's previous prompt's."""
        key, ids = request.routing_key, request.input_ids
        entry, known = self._ids_json.plan(key, ids)
        if len(ids) - known > _OFF_LOOP_IDS:
            encoded = await asyncio.to_thread(encode, ids, entry, known)
        else:
            encoded = encode(ids, entry, known)
        text = self._ids_json.keep(key, encoded, known)
        return encoded_body(request, stream=stream, ids_text=text)

    # -- Engine --------------------------------------------------------------------------------

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        session = self._client()
        deadline = self._deadline()
        async with self._generation(request) as call:
            async with await self._post(
                session,
                "/generate",
                await self._body(request, stream=False),
                self._headers(request),
                deadline,
            ) as response:
                body = await self._within(response.read(), deadline)
            call.over = True
            if response.status != 200:
                raise error_for_status(response.status, _text(body), request.rid)
            if len(body) > _OFF_LOOP_CHARS:
                return await asyncio.to_thread(_answer, body, request)
            return _answer(body, request)

    async def stream(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        session = self._client()
        deadline = self._deadline()
        idle = self.config.stream_idle_timeout
        decoder = StreamDecoder(request)
        parser = SSEParser()
        async with self._generation(request) as call:
            response = await self._post(
                session,
                "/generate",
                await self._body(request, stream=True),
                {**self._headers(request), "Accept": "text/event-stream"},
                deadline,
                idle,
            )
            try:
                if response.status != 200:
                    body = await self._within(response.read(), deadline)
                    call.over = True
                    raise error_for_status(response.status, _text(body), request.rid)
                done = False
                while not done:
                    # What the socket already delivered is taken without a timeout scope (~7 us
                    # each): readany would not wait for it either.
                    data = response.content.read_nowait() or await self._within(
                        response.content.readany(), deadline, idle
                    )
                    try:
                        events = parser.feed(data) if data else parser.close()
                    except ValueError as exc:
                        raise malformed(request.rid, f"stream is not UTF-8 text: {exc}") from None
                    read: list[GenerateChunk] = []
                    failure: AdapterError | None = None
                    for event in events:
                        if event.strip() == "[DONE]":
                            done = True
                            break
                        try:
                            if len(event) > _OFF_LOOP_CHARS:
                                chunk = await asyncio.to_thread(_chunk, decoder, event, request.rid)
                            else:
                                chunk = _chunk(decoder, event, request.rid)
                        except AdapterError as exc:
                            failure = exc  # after the read's good chunks: they are recorded
                            break
                        read.append(chunk)
                    for chunk in coalesced(read):
                        call.over = chunk.finish_reason is not None
                        yield chunk
                    if failure is not None:
                        raise failure
                    if not data:
                        break
                if not decoder.finished:
                    ending = "[DONE]" if done else "end of stream"
                    raise malformed(
                        request.rid,
                        f"{ending} after {decoder.tokens_seen} tokens without a finish reason",
                    )
                if done:
                    await self._drain(response)
                if decoder.cumulative and not self._warned_cumulative:
                    self._warned_cumulative = True
                    logger.warning(
                        "the engine at %s streams token logprobs cumulatively: each chunk re-sends "
                        "every earlier token (quadratic in the reply length); start SGLang with "
                        "--incremental-streaming-output",
                        self.config.base_url,
                    )
            finally:
                response.close()

    async def abort(self, rid: str) -> None:
        """Ask the engine to stop ``rid``; raises ``AdapterError`` if the engine can't be told."""
        session = self._client()
        attempt = self._connect_deadline()
        try:
            async with (
                asyncio.timeout(self.config.abort_timeout),
                attempt,
                session.post(
                    self.config.url("/abort_request"),
                    data=_encode({"rid": rid}),
                    headers=_JSON,
                    trace_request_ctx=attempt,
                ) as response,
            ):
                body = await response.read()
        except TimeoutError as exc:
            raise AdapterError(
                ErrorKind.TIMEOUT,
                f"abort of {rid} not acknowledged within {self.config.abort_timeout}s",
            ) from exc
        except aiohttp.ClientError as exc:
            raise AdapterError(ErrorKind.ENGINE_ERROR, f"abort of {rid} failed: {exc}") from exc
        if response.status != 200:
            raise error_for_status(response.status, _text(body), rid)

    async def context_length(self) -> int:
        """The engine's context length, from ``GET /server_info`` (``/get_server_info`` on
        releases before the rename). Unreachable -> ``OVERLOADED``; no usable answer ->
        ``ENGINE_ERROR``."""
        session = self._client()
        for path in _SERVER_INFO_PATHS:
            attempt = self._connect_deadline()
            try:
                async with (
                    asyncio.timeout(self.config.info_timeout),
                    attempt,
                    session.get(self.config.url(path), trace_request_ctx=attempt) as response,
                ):
                    body = await response.read()
            except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
                raise AdapterError(
                    ErrorKind.OVERLOADED, f"engine at {self.config.base_url} unreachable: {exc}"
                ) from exc
            except (TimeoutError, aiohttp.ClientError) as exc:
                raise AdapterError(
                    ErrorKind.ENGINE_ERROR,
                    f"engine at {self.config.base_url} did not answer {path}: {exc!r}",
                ) from exc
            if response.status == 404:
                continue
            if response.status != 200:
                raise error_for_status(response.status, _text(body), path)
            try:
                return context_length_of(json.loads(body))
            except ValueError as exc:
                raise AdapterError(
                    ErrorKind.ENGINE_ERROR, f"engine {path} is not JSON: {exc}"
                ) from None
        raise AdapterError(
            ErrorKind.ENGINE_ERROR,
            f"engine at {self.config.base_url} answers neither of {', '.join(_SERVER_INFO_PATHS)}",
        )

    # -- helpers -------------------------------------------------------------------------------

    def _client(self) -> aiohttp.ClientSession:
        if self._closed:
            raise RuntimeError("SGLangEngine is closed")
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.config.max_connections),
                timeout=aiohttp.ClientTimeout(total=None),  # connects: ConnectDeadline
                trace_configs=[connect_trace()],
            )
        return self._session

    def _connect_deadline(self) -> ConnectDeadline:
        return ConnectDeadline(self.config.connect_timeout)

    async def _post(
        self,
        session: aiohttp.ClientSession,
        path: str,
        data: bytes,
        headers: dict[str, str],
        deadline: float,
        idle: float | None = None,
    ) -> aiohttp.ClientResponse:
        """POST ``path`` until the response's headers arrive, under the call's deadline, its
        connect under a :class:`ConnectDeadline` (stalls of the loop do not count)."""
        attempt = self._connect_deadline()
        async with attempt:
            return await self._within(
                session.post(
                    self.config.url(path), data=data, headers=headers, trace_request_ctx=attempt
                ),
                deadline,
                idle,
            )

    @contextlib.asynccontextmanager
    async def _generation(self, request: GenerateRequest) -> AsyncIterator[_Call]:
        """One call's life on the engine, the same for ``generate`` and ``stream``: counted in
        flight, transport failures mapped to ``AdapterError`` (see the module docstring), and
        aborted at the end unless the body set ``over`` (the engine is done with the rid).
        """
        call = _Call()
        self._in_flight.add(request.rid)
        try:
            yield call
        except aiohttp.ClientConnectorError as exc:
            call.over = True
            raise self._unreachable(request, exc) from exc
        except aiohttp.ConnectionTimeoutError as exc:
            call.over = True
            raise self._unreachable(request, exc) from exc
        except _Expired as exc:
            raise self._timed_out(request, exc.what) from None
        except aiohttp.ClientError as exc:
            raise self._dropped(request, exc) from exc
        finally:
            self._ended(request.rid)
            if not call.over:
                await self._abort_quietly(request.rid)

    def _ended(self, rid: str) -> None:
        self._in_flight.discard(rid)
        if not self._in_flight and self._all_done is not None:
            self._all_done.set()

    def _headers(self, request: GenerateRequest) -> dict[str, str]:
        if request.routing_key is None:
            return _JSON
        return {**_JSON, self.config.routing_header: request.routing_key}

    def _deadline(self) -> float:
        return asyncio.get_running_loop().time() + self.config.request_timeout

    async def _within(
        self, awaitable: Awaitable[T], deadline: float, idle: float | None = None
    ) -> T:
        """Await one step under the request deadline and, for stream reads, the idle limit.

        Each step gets its own timeout scope so no scope ever spans a ``yield`` of the stream
        (a scope left open across a yield would cancel whatever the consumer is doing).
        """
        remaining = deadline - asyncio.get_running_loop().time()
        idle_binds = idle is not None and idle < remaining
        limit = idle if idle is not None and idle_binds else remaining
        scope = asyncio.timeout(max(limit, 0.0))
        try:
            async with scope:
                return await awaitable
        except TimeoutError:
            if not scope.expired():
                raise  # not one of ours: the caller maps it
            raise _Expired(
                f"no data for {idle}s (stream idle timeout)"
                if idle_binds
                else f"no complete answer within {self.config.request_timeout}s (request timeout)"
            ) from None

    async def _drain(self, response: aiohttp.ClientResponse) -> None:
        """Read the body's end after ``[DONE]`` so the connection goes back to the pool.

        Bounded: a server that keeps the stream open past ``[DONE]`` only costs a connection.
        """
        try:
            async with asyncio.timeout(self.config.abort_timeout):
                while await response.content.readany():
                    pass
        except (TimeoutError, aiohttp.ClientError):
            pass

    def _unreachable(self, request: GenerateRequest, exc: Exception) -> AdapterError:
        return AdapterError(
            ErrorKind.OVERLOADED,
            f"engine at {self.config.base_url} unreachable for {request.rid}: {exc}",
        )

    def _timed_out(self, request: GenerateRequest, what: str) -> AdapterError:
        return AdapterError(ErrorKind.TIMEOUT, f"engine timed out on {request.rid}: {what}")

    def _dropped(self, request: GenerateRequest, exc: Exception) -> AdapterError:
        detail = str(exc) or type(exc).__name__
        return AdapterError(
            ErrorKind.ENGINE_ERROR, f"connection to the engine lost during {request.rid}: {detail}"
        )

    async def _abort_quietly(self, rid: str) -> None:
        """Best-effort abort that survives a second cancellation of the caller."""
        if self._session is None or self._session.closed:
            return
        task = asyncio.ensure_future(self._send_abort(self._session, rid))
        self._pending_aborts.add(task)
        task.add_done_callback(self._pending_aborts.discard)
        await asyncio.shield(task)

    async def _send_abort(self, session: aiohttp.ClientSession, rid: str) -> None:
        attempt = self._connect_deadline()
        try:
            async with (
                asyncio.timeout(self.config.abort_timeout),
                attempt,
                session.post(
                    self.config.url("/abort_request"),
                    data=_encode({"rid": rid}),
                    headers=_JSON,
                    trace_request_ctx=attempt,
                ) as response,
            ):
                await response.read()
            if response.status != 200:
                logger.warning("abort of %s answered HTTP %d", rid, response.status)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            logger.warning("abort of %s failed: %r", rid, exc)


_SERVER_INFO_PATHS = ("/server_info", "/get_server_info")

_OFF_LOOP_IDS = 8192
"""Above this many ids to encode (a prompt that does not extend the session's previous one),
their JSON text (~10-20 ms at 128k ids) is written on a worker thread."""


def _encode(body: object) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


def _text(body: bytes) -> str:
    return body.decode("utf-8", errors="replace")


_OFF_LOOP_CHARS = STEP_CHARS
"""An answer or stream event longer than this is parsed on a worker thread, its long strings a
slice at a time: MoE routing makes answers of hundreds of MB (``routed_experts.py``)."""


def _answer(body: bytes, request: GenerateRequest) -> GenerateResult:
    try:
        payload = loads_in_steps(body.decode()) if len(body) > STEP_CHARS else json.loads(body)
    except ValueError as exc:
        raise malformed(request.rid, f"body is not JSON ({exc}): {_text(body)[:200]!r}") from None
    return parse_result(payload, request)


def _chunk(decoder: StreamDecoder, event: str, rid: str) -> GenerateChunk:
    try:
        payload = loads_in_steps(event) if len(event) > STEP_CHARS else json.loads(event)
    except ValueError as exc:
        raise malformed(rid, f"stream event is not JSON ({exc}): {event[:200]!r}") from None
    return decoder.feed(payload)
