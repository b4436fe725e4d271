"""A pass-through HTTP proxy in front of the engine that keeps a copy of every /generate.

`swe-rl check` puts it between the adapter and SGLang, so what the engine was sent and what it
answered are known independently of the adapter's own record: the token-trust step compares
the samples with these copies. Bodies pass through unchanged (streamed answers chunk by chunk);
the engine's answers are read with their wire format's rules (protocol-adapters'
docs/sglang-wire.md), never through the adapter's code.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

_HOP_BY_HOP = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade"}
)


@dataclass(slots=True)
class Exchange:
    """One /generate call as it went by: the request's JSON and the answer's bytes."""

    request: dict[str, object]
    status: int = 0
    body: bytearray = field(default_factory=bytearray)
    streamed: bool = False


@dataclass(frozen=True, slots=True)
class EngineReply:
    """What the engine generated for one prompt: its ids and their logprobs, in order."""

    input_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish: str | None


class EngineRecorder:
    """`async with EngineRecorder(engine_url) as recorder:` point the adapter at
    `recorder.url`; `recorder.replies()` then holds every answered /generate."""

    def __init__(self, engine_url: str) -> None:
        self.engine_url = engine_url.rstrip("/")
        self.exchanges: list[Exchange] = []
        self._runner: web.AppRunner | None = None
        self._client: aiohttp.ClientSession | None = None
        self._url = ""

    @property
    def url(self) -> str:
        if not self._url:
            raise RuntimeError("the recorder is not running")
        return self._url

    async def __aenter__(self) -> EngineRecorder:
        self._client = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{path:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self._url = f"http://{host}:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._client is not None:
            await self._client.close()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._client is not None
        body = await request.read()
        exchange = None
        if request.path == "/generate":
            with contextlib.suppress(ValueError):
                data = json.loads(body)
                if isinstance(data, dict):
                    exchange = Exchange(data)
                    self.exchanges.append(exchange)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        target = self.engine_url + request.path_qs
        try:
            upstream = await self._client.request(
                request.method, target, data=body, headers=headers
            )
        except (aiohttp.ClientError, OSError) as error:
            return web.Response(status=502, text=f"the engine did not answer: {error}")
        async with upstream:
            kind = upstream.headers.get("Content-Type", "")
            if exchange is not None:
                exchange.status = upstream.status
                exchange.streamed = kind.startswith("text/event-stream")
            if not kind.startswith("text/event-stream"):
                data = await upstream.read()
                if exchange is not None:
                    exchange.body.extend(data)
                return web.Response(
                    status=upstream.status, body=data, headers={"Content-Type": kind}
                )
            response = web.StreamResponse(status=upstream.status, headers={"Content-Type": kind})
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                if exchange is not None:
                    exchange.body.extend(chunk)
                await response.write(chunk)
            await response.write_eof()
            return response

    def replies(self) -> list[EngineReply]:
        """Every answered /generate's prompt and output, read from the bytes the engine sent."""
        return [reply for exchange in self.exchanges for reply in _reply(exchange)]


def _reply(exchange: Exchange) -> Iterable[EngineReply]:
    if exchange.status != 200:
        return
    ids = exchange.request.get("input_ids")
    if not isinstance(ids, list):
        return
    payloads = _events(bytes(exchange.body)) if exchange.streamed else [_json(bytes(exchange.body))]
    output: list[tuple[float, int]] = []
    finish: str | None = None
    for payload in payloads:
        meta = payload.get("meta_info") if isinstance(payload, dict) else None
        if not isinstance(meta, dict):
            continue
        entries = [(float(e[0]), int(e[1])) for e in meta.get("output_token_logprobs") or ()]
        total = meta.get("completion_tokens")
        if output and total == len(entries):  # cumulative chunks repeat what came before
            entries = entries[len(output) :]
        output.extend(entries)
        reason = meta.get("finish_reason")
        if isinstance(reason, dict):
            finish = str(reason.get("type"))
    yield EngineReply(
        tuple(int(i) for i in ids),
        tuple(token for _, token in output),
        tuple(logprob for logprob, _ in output),
        finish,
    )


def _json(body: bytes) -> object:
    try:
        return json.loads(body)
    except ValueError:
        return None


def _events(body: bytes) -> list[object]:
    events: list[object] = []
    for line in body.decode("utf-8", errors="replace").splitlines():
        if line.startswith("data:"):
            text = line[5:].strip()
            if text and text != "[DONE]":
                events.append(_json(text.encode()))
    return events
