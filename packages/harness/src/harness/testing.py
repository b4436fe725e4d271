"""A recording endpoint for tests and benchmarks of harnesses (needs `harness[testing]`).

It stands in for the protocol adapter where a test asks only "did the real CLI reach us,
with which credentials and model?". It speaks the real wire of each dialect: a final reply
is a complete, minimal SSE stream in Anthropic Messages grammar on `/v1/messages` and in
OpenAI Responses grammar on `/v1/responses`, enough for the CLI to finish cleanly. In
"hang" mode it accepts every request and never answers, like a wedged engine. It records
every request (path, headers, JSON body, arrival time) before deciding how to answer.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, Self

from aiohttp import web

Mode = Literal["answer", "hang"]


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    method: str
    path: str
    headers: Mapping[str, str]
    body: Any
    arrived: float
    """time.monotonic() when the request's headers had arrived."""

    @property
    def bearer(self) -> str | None:
        value = self.headers.get("Authorization", "")
        return value.removeprefix("Bearer ") if value.startswith("Bearer ") else None

    @property
    def model(self) -> str | None:
        model = self.body.get("model") if isinstance(self.body, dict) else None
        return model if isinstance(model, str) else None


class RecordingEndpoint:
    """An aiohttp server on 127.0.0.1 (ephemeral port); use as `async with`."""

    def __init__(self, mode: Mode = "answer", reply_text: str = "done") -> None:
        self.mode: Mode = mode
        self.reply_text = reply_text
        self.requests: list[RecordedRequest] = []
        self._arrival = asyncio.Event()
        self._never = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def wait_for_request(self, timeout: float) -> RecordedRequest:
        """The first recorded request, waiting up to `timeout` seconds for it."""
        await asyncio.wait_for(self._arrival.wait(), timeout)
        return self.requests[0]

    async def __aenter__(self) -> Self:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        arrived = time.monotonic()
        raw = await request.read()
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        self.requests.append(
            RecordedRequest(request.method, request.path_qs, dict(request.headers), body, arrived)
        )
        self._arrival.set()
        if self.mode == "hang":
            await self._never.wait()
        model = self.requests[-1].model or "unknown"
        if request.method == "POST" and request.path == "/v1/messages":
            return await self._stream(request, _anthropic_events(model, self.reply_text))
        if request.method == "POST" and request.path == "/v1/responses":
            return await self._stream(request, _responses_events(model, self.reply_text))
        return web.json_response({"error": {"message": "not found"}}, status=404)

    @staticmethod
    async def _stream(
        request: web.Request, events: list[tuple[str, dict[str, Any]]]
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for name, data in events:
            await response.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
        await response.write_eof()
        return response


def _anthropic_events(model: str, text: str) -> list[tuple[str, dict[str, Any]]]:
    usage = {"input_tokens": 1, "output_tokens": 1}
    message: dict[str, Any] = {
        "id": "msg_recording_endpoint",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage,
    }
    return [
        ("message_start", {"type": "message_start", "message": message}),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": text},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": 1},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]


def _responses_events(model: str, text: str) -> list[tuple[str, dict[str, Any]]]:
    item = {
        "type": "message",
        "id": "msg_recording_endpoint",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
    response = {"id": "resp_recording_endpoint", "object": "response", "model": model}
    usage = {
        "input_tokens": 1,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 1,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 2,
    }
    return [
        (
            "response.created",
            {"type": "response.created", "response": {**response, "status": "in_progress"}},
        ),
        (
            "response.output_item.added",
            {"type": "response.output_item.added", "output_index": 0, "item": item},
        ),
        (
            "response.output_item.done",
            {"type": "response.output_item.done", "output_index": 0, "item": item},
        ),
        (
            "response.completed",
            {
                "type": "response.completed",
                "response": {**response, "status": "completed", "output": [item], "usage": usage},
            },
        ),
    ]
