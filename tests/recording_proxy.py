"""A transparent HTTP relay between a real CLI and the adapter that records what each request got
back: its status and, for a refusal, the error message the CLI read.

The adapter refuses an over-long prompt before anything reaches the engine or the session tree,
so a test that must tell "the CLI compacted because it was refused" from "it compacted on the
usage it was told" can only see the difference on the wire. Bodies and headers pass through
unchanged (hop-by-hop headers aside) and responses are streamed chunk by chunk, so the CLI sees
the adapter's own SSE stream as it is written.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Self

import aiohttp
from aiohttp import web

# Headers that describe one connection, not the message (RFC 9110 section 7.6.1), plus those
# the relay recomputes for its own connection.
_NOT_RELAYED = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)


@dataclass(frozen=True, slots=True)
class Exchange:
    """One relayed request: its path, the status it got, the error message of a refusal."""

    method: str
    path: str
    status: int
    error: str | None


class RecordingProxy:
    """``async with RecordingProxy(upstream) as proxy``: point the CLI at ``proxy.url``."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.exchanges: list[Exchange] = []
        self.streamed: list[int] = []
        """Bytes relayed so far of each streamed response, in the order they started: a test
        can wait until a reply is really being generated (the adapter writes nothing of a
        streamed reply before the engine produced its first token)."""
        self._client: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self._url: str | None = None

    @property
    def url(self) -> str:
        if self._url is None:
            raise RuntimeError("the proxy is not running (use `async with`)")
        return self._url

    @property
    def refusals(self) -> list[Exchange]:
        return [e for e in self.exchanges if e.status >= 400]

    async def __aenter__(self) -> Self:
        # No decompression: the bytes the adapter wrote are the bytes the CLI reads.
        self._client = aiohttp.ClientSession(auto_decompress=False)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._relay)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        host, port = self._runner.addresses[0][:2]
        self._url = f"http://{host}:{port}"
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._client is not None:
            await self._client.close()

    async def _relay(self, request: web.Request) -> web.StreamResponse:
        assert self._client is not None
        body = await request.read()
        async with self._client.request(
            request.method,
            self.upstream + request.path_qs,
            data=body,
            headers=_relayed(request.headers),
            allow_redirects=False,
        ) as upstream:
            if upstream.status >= 400:
                content = await upstream.read()
                self._record(request, upstream.status, _error_message(content))
                return web.Response(
                    status=upstream.status, body=content, headers=_relayed(upstream.headers)
                )
            response = web.StreamResponse(
                status=upstream.status, headers=_relayed(upstream.headers)
            )
            await response.prepare(request)
            index = len(self.streamed)
            self.streamed.append(0)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
                self.streamed[index] += len(chunk)
            await response.write_eof()
            self._record(request, upstream.status, None)
            return response

    def _record(self, request: web.Request, status: int, error: str | None) -> None:
        self.exchanges.append(Exchange(request.method, request.path, status, error))


def _relayed(headers: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in _NOT_RELAYED}


def _error_message(content: bytes) -> str:
    """The message of an error body in any of the dialects' shapes, else the body itself."""
    try:
        body = json.loads(content)
    except ValueError:
        return content.decode(errors="replace")
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])
    return content.decode(errors="replace")
