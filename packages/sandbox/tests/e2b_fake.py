"""A local stand-in for the E2B cloud that the REAL e2b SDK is pointed at (test double).

It speaks the wire the SDK speaks, so the SDK runs unmodified through its own transports:
- the control-plane REST API: `POST /v2/sandboxes` (201 + the Sandbox JSON model),
  `DELETE /sandboxes/{id}` (204), with injectable 503s to exercise boot retries;
- envd's HTTP API: `GET /health`, `GET /files?path=` (bytes, 404 JSON when missing),
  `POST /files?path=` with an octet-stream body (a JSON list of written entries);
- envd's Connect-RPC `process.Process` service (Start as a server stream of
  start/data/end events, SendSignal, List), served by connectrpc's own generated ASGI
  application from the SDK's `process_connect` module, with the JSON codec the SDK uses.

Processes are real host processes (`/bin/bash -l -c CMD`, each in its own session like
envd's), and paths are host paths: a test picks a temporary directory as the workspace.
Like envd, a process killed by a signal ends with exit code -1 and error "signal: killed";
a non-zero exit ends with its code and error "exit status N".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import uvicorn
from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext
from e2b.envd.process import process_connect, process_pb
from protobuf import Oneof

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

ENVD_VERSION = "0.6.9"
_SIGNAL_NAMES = {signal.SIGKILL: "killed", signal.SIGTERM: "terminated"}


@dataclass
class FakeState:
    """What the fake saw and how it should misbehave."""

    home: Path = Path("/nonexistent")
    fail_creates: int = 0
    create_delay: float = 0.0
    creating: int = 0
    max_creating: int = 0
    create_requests: list[dict[str, Any]] = field(default_factory=list)
    idempotency_keys: list[str] = field(default_factory=list)
    killed_sandboxes: list[str] = field(default_factory=list)
    processes: dict[int, tuple[str, asyncio.subprocess.Process]] = field(default_factory=dict)


class FakeProcessService(process_connect.Process):
    """envd's process service over real host processes (unused RPCs answer UNIMPLEMENTED)."""

    def __init__(self, state: FakeState) -> None:
        self._state = state

    async def start(
        self,
        request: process_pb.StartRequest,
        ctx: RequestContext[process_pb.StartRequest, process_pb.StartResponse],
    ) -> AsyncIterator[process_pb.StartResponse]:
        config = request.process
        assert config is not None
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self._state.home),
            **dict(config.envs),
        }
        cwd = config.cwd if config.has_field("cwd") else None
        if cwd is not None and not os.path.isdir(cwd):
            raise ConnectError(Code.INVALID_ARGUMENT, f"cwd does not exist: {cwd}")
        proc = await asyncio.create_subprocess_exec(
            config.cmd,
            *config.args,
            cwd=cwd,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        sandbox_id = ctx.request_headers.get("e2b-sandbox-id", "")
        self._state.processes[proc.pid] = (sandbox_id, proc)
        yield _response(Oneof("start", process_pb.ProcessEvent.StartEvent(pid=proc.pid)))
        queue: asyncio.Queue[tuple[str, bytes] | None] = asyncio.Queue()

        async def pump(name: str, stream: asyncio.StreamReader | None) -> None:
            assert stream is not None
            while chunk := await stream.read(4096):
                await queue.put((name, chunk))

        pumps = asyncio.gather(pump("stdout", proc.stdout), pump("stderr", proc.stderr))
        pumps.add_done_callback(lambda _: queue.put_nowait(None))
        try:
            while (item := await queue.get()) is not None:
                name, chunk = item
                data = process_pb.ProcessEvent.DataEvent(output=Oneof(name, chunk))
                yield _response(Oneof("data", data))
            returncode = await proc.wait()
        finally:
            pumps.cancel()
            self._state.processes.pop(proc.pid, None)
        if returncode < 0:
            name = _SIGNAL_NAMES.get(signal.Signals(-returncode), signal.Signals(-returncode).name)
            end = process_pb.ProcessEvent.EndEvent(
                exit_code=-1, exited=False, status=f"signal: {name}", error=f"signal: {name}"
            )
        elif returncode != 0:
            end = process_pb.ProcessEvent.EndEvent(
                exit_code=returncode,
                exited=True,
                status=f"exit status {returncode}",
                error=f"exit status {returncode}",
            )
        else:
            end = process_pb.ProcessEvent.EndEvent(exit_code=0, exited=True, status="exit status 0")
        yield _response(Oneof("end", end))

    async def send_signal(
        self,
        request: process_pb.SendSignalRequest,
        ctx: RequestContext[process_pb.SendSignalRequest, process_pb.SendSignalResponse],
    ) -> process_pb.SendSignalResponse:
        selector = request.process.selector if request.process is not None else None
        pid = selector.value if selector is not None else None
        entry = self._state.processes.get(pid) if isinstance(pid, int) else None
        if entry is None:
            raise ConnectError(Code.NOT_FOUND, f"process with pid {pid} not found")
        with contextlib.suppress(ProcessLookupError):
            os.kill(entry[1].pid, int(request.signal.value) or signal.SIGKILL)
        return process_pb.SendSignalResponse()

    async def list(
        self,
        request: process_pb.ListRequest,
        ctx: RequestContext[process_pb.ListRequest, process_pb.ListResponse],
    ) -> process_pb.ListResponse:
        return process_pb.ListResponse(
            processes=[process_pb.ProcessInfo(pid=pid) for pid in self._state.processes]
        )


def _response(event: Any) -> process_pb.StartResponse:
    return process_pb.StartResponse(event=process_pb.ProcessEvent(event=event))


class FakeE2B:
    """The ASGI application: REST control plane + envd HTTP API + envd Connect-RPC."""

    def __init__(self, state: FakeState) -> None:
        self.state = state
        self._rpc = process_connect.ProcessASGIApplication(FakeProcessService(state))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        method: str = scope["method"]
        if path.startswith("/process.Process/"):
            await self._rpc(scope, receive, send)  # type: ignore[arg-type]
        elif path == "/v2/sandboxes" and method == "POST":
            await self._create(scope, receive, send)
        elif path.startswith("/sandboxes/") and method == "DELETE":
            await self._kill(path.removeprefix("/sandboxes/"), send)
        elif path == "/health":
            await _reply(send, 204, b"")
        elif path == "/files" and method == "GET":
            await self._read(scope, send)
        elif path == "/files" and method == "POST":
            await self._write(scope, receive, send)
        else:
            await _reply_json(send, 404, {"code": 404, "message": f"no route {method} {path}"})

    async def _create(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = json.loads(await _body(receive))
        self.state.create_requests.append(body)
        self.state.creating += 1
        self.state.max_creating = max(self.state.max_creating, self.state.creating)
        try:
            await asyncio.sleep(self.state.create_delay)
        finally:
            self.state.creating -= 1
        headers = dict(scope["headers"])
        self.state.idempotency_keys.append(headers.get(b"idempotency-key", b"").decode())
        if self.state.fail_creates > 0:
            self.state.fail_creates -= 1
            await _reply_json(send, 503, {"code": 503, "message": "no capacity (injected)"})
            return
        sandbox_id = f"fake{uuid.uuid4().hex[:12]}"
        await _reply_json(
            send,
            201,
            {
                "templateID": body.get("templateID", "base"),
                "sandboxID": sandbox_id,
                "clientID": "fake-client",
                "envdVersion": ENVD_VERSION,
                "envdAccessToken": f"token-{sandbox_id}",
            },
        )

    async def _kill(self, sandbox_id: str, send: Send) -> None:
        self.state.killed_sandboxes.append(sandbox_id)
        for owner, proc in list(self.state.processes.values()):
            if owner == sandbox_id:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        await _reply(send, 204, b"")

    async def _read(self, scope: Scope, send: Send) -> None:
        path = _query(scope, "path")
        try:
            data = Path(path).read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            await _reply_json(send, 404, {"code": 404, "message": f"path '{path}' does not exist"})
            return
        await _reply(send, 200, data, "application/octet-stream")

    async def _write(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = Path(_query(scope, "path"))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(await _body(receive))
        await _reply_json(send, 200, [{"name": path.name, "type": "file", "path": str(path)}])


def _query(scope: Scope, name: str) -> str:
    return parse_qs(scope["query_string"].decode())[name][0]


async def _body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def _reply(send: Send, status: int, body: bytes, content_type: str = "text/plain") -> None:
    headers = [(b"content-type", content_type.encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _reply_json(send: Send, status: int, payload: object) -> None:
    await _reply(send, status, json.dumps(payload).encode(), "application/json")


@contextlib.asynccontextmanager
async def serve_fake_e2b(state: FakeState) -> AsyncIterator[str]:
    """Run the fake on 127.0.0.1 in this event loop; yields its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(FakeE2B(state), log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        for _, proc in list(state.processes.values()):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        server.should_exit = True
        await task
        sock.close()
