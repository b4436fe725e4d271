"""A local stand-in for the E2B cloud that the REAL e2b SDK is pointed at (test double).

It speaks the wire the SDK speaks, so the SDK runs unmodified through its own transports:
- the control-plane REST API: `POST /v2/sandboxes` (201 + the Sandbox JSON model),
  `DELETE /sandboxes/{id}` (204; 404 for a sandbox that is not running), with injectable
  503s to exercise boot retries and delays to exercise cancellation;
- idempotent creates, keyed by the `Idempotency-Key` header: a boot, once accepted, finishes
  even if its client goes away; a request repeating the key of a finished boot is answered
  with that boot's sandbox, one repeating the key of a boot still under way with 409
  `idempotency_in_progress` (a failed boot is not remembered: its key may boot again);
- envd's HTTP API: `GET /health`, `GET /files?path=` (bytes, 404 JSON when missing),
  `POST /files?path=` with an octet-stream body (a JSON list of written entries);
- envd's Connect-RPC `process.Process` service (Start as a server stream of
  start/data/end events, SendSignal, List), served by connectrpc's own generated ASGI
  application from the SDK's `process_connect` module, with the JSON codec the SDK uses.

Every envd request must name a running sandbox (`E2b-Sandbox-Id`) and carry the access token
issued with it (`X-Access-Token`), as E2B's proxy and envd demand; a killed sandbox answers 502
"not found". Process RPCs see only the requesting sandbox's processes, as separate VMs would.

Processes are real host processes (`/bin/bash -l -c CMD`, each in its own session like
envd's), with envd's `E2B_SANDBOX` / `E2B_SANDBOX_ID` variables, and paths are host paths: a
test picks a temporary directory as the workspace. Like envd, a process killed by a signal
ends with exit code -1 and error "signal: killed"; a non-zero exit ends with its code and
error "exit status N".

Killing a sandbox kills every host process it started, as the VM's death would: the process
trees carrying its `E2B_SANDBOX_ID`, which every descendant inherits, so detached, `setsid`
and `nohup` processes die too. A process that empties its environment and then loses its
parent escapes this bookkeeping; a real VM has no such gap.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs

import uvicorn
from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext
from e2b.envd.process import process_connect, process_pb
from protobuf import Oneof

from sandbox import E2BConfig, RetryPolicy

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
Output = Literal["stdout", "stderr"]

ENVD_VERSION = "0.6.9"
_SIGNAL_NAMES = {signal.SIGKILL: "killed", signal.SIGTERM: "terminated"}
_ENVD_PATHS = ("/process.Process/", "/files", "/health")


@dataclass
class FakeSandbox:
    """One sandbox as the control plane knows it."""

    sandbox_id: str
    access_token: str
    idempotency_key: str
    running: bool = True


@dataclass(frozen=True)
class StartedCommand:
    """What envd's Start received for one command."""

    sandbox_id: str
    cmd: str
    args: tuple[str, ...]
    envs: dict[str, str]
    cwd: str | None
    pid: int


@dataclass
class FakeState:
    """What the fake saw and how it should misbehave."""

    home: Path = Path("/nonexistent")
    fail_creates: int = 0
    create_delay: float = 0.0
    """Seconds each boot takes (the client may give up meanwhile; the boot still finishes)."""
    envd_delay: float = 0.0
    """Seconds every envd request waits before it is served."""
    start_delay: float = 0.0
    """Seconds between spawning a command and reporting its start to the client."""
    kill_delay: float = 0.0
    """Seconds every DELETE waits before it kills."""
    creating: int = 0
    max_creating: int = 0
    create_requests: list[dict[str, Any]] = field(default_factory=list)
    idempotency_keys: list[str] = field(default_factory=list)
    sandboxes: dict[str, FakeSandbox] = field(default_factory=dict)
    delete_requests: list[str] = field(default_factory=list)
    """Sandbox ids of every DELETE received, in order, counted when it arrives."""
    killed_sandboxes: list[str] = field(default_factory=list)
    """Sandbox ids of every DELETE served, counted once it has killed."""
    started: list[StartedCommand] = field(default_factory=list)
    processes: dict[int, tuple[str, asyncio.subprocess.Process]] = field(default_factory=dict)
    boots: dict[str, asyncio.Task[FakeSandbox | None]] = field(default_factory=dict)

    def running(self) -> list[str]:
        return [s.sandbox_id for s in self.sandboxes.values() if s.running]

    def booted_with(self, key: str) -> FakeSandbox:
        (sandbox,) = (s for s in self.sandboxes.values() if s.idempotency_key == key)
        return sandbox


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
        sandbox_id = _sandbox_id(ctx)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self._state.home),
            **dict(config.envs),
            # Last, so no command can unset what the fake's kill bookkeeping relies on.
            "E2B_SANDBOX": "true",
            "E2B_SANDBOX_ID": sandbox_id,
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
        self._state.started.append(
            StartedCommand(
                sandbox_id, config.cmd, tuple(config.args), dict(config.envs), cwd, proc.pid
            )
        )
        self._state.processes[proc.pid] = (sandbox_id, proc)
        await asyncio.sleep(self._state.start_delay)
        yield _response(Oneof("start", process_pb.ProcessEvent.StartEvent(pid=proc.pid)))
        queue: asyncio.Queue[tuple[Output, bytes] | None] = asyncio.Queue()

        async def pump(name: Output, stream: asyncio.StreamReader | None) -> None:
            assert stream is not None
            while chunk := await stream.read(4096):
                await queue.put((name, chunk))

        pumps = asyncio.gather(pump("stdout", proc.stdout), pump("stderr", proc.stderr))
        pumps.add_done_callback(lambda _: queue.put_nowait(None))
        try:
            while (item := await queue.get()) is not None:
                yield _response(Oneof("data", _data_event(*item)))
            returncode = await proc.wait()
        finally:
            pumps.cancel()
            self._state.processes.pop(proc.pid, None)
        yield _response(Oneof("end", _end_event(returncode)))

    async def send_signal(
        self,
        request: process_pb.SendSignalRequest,
        ctx: RequestContext[process_pb.SendSignalRequest, process_pb.SendSignalResponse],
    ) -> process_pb.SendSignalResponse:
        selector = request.process.selector if request.process is not None else None
        pid = selector.value if selector is not None else None
        entry = self._state.processes.get(pid) if isinstance(pid, int) else None
        if entry is None or entry[0] != _sandbox_id(ctx):
            raise ConnectError(Code.NOT_FOUND, f"process with pid {pid} not found")
        with contextlib.suppress(ProcessLookupError):
            os.kill(entry[1].pid, int(request.signal.value) or signal.SIGKILL)
        return process_pb.SendSignalResponse()

    async def list(
        self,
        request: process_pb.ListRequest,
        ctx: RequestContext[process_pb.ListRequest, process_pb.ListResponse],
    ) -> process_pb.ListResponse:
        mine = [
            pid for pid, (owner, _) in self._state.processes.items() if owner == _sandbox_id(ctx)
        ]
        return process_pb.ListResponse(processes=[process_pb.ProcessInfo(pid=pid) for pid in mine])


def _sandbox_id(ctx: RequestContext[Any, Any]) -> str:
    return ctx.request_headers.get("e2b-sandbox-id", "")


def _data_event(name: Output, chunk: bytes) -> process_pb.ProcessEvent.DataEvent:
    if name == "stdout":
        stdout: Oneof[Literal["stdout"], bytes] = Oneof("stdout", chunk)
        return process_pb.ProcessEvent.DataEvent(output=stdout)
    stderr: Oneof[Literal["stderr"], bytes] = Oneof("stderr", chunk)
    return process_pb.ProcessEvent.DataEvent(output=stderr)


def _end_event(returncode: int) -> process_pb.ProcessEvent.EndEvent:
    if returncode < 0:
        name = _SIGNAL_NAMES.get(signal.Signals(-returncode), signal.Signals(-returncode).name)
        error = f"signal: {name}"
        return process_pb.ProcessEvent.EndEvent(
            exit_code=-1, exited=False, status=error, error=error
        )
    if returncode != 0:
        error = f"exit status {returncode}"
        return process_pb.ProcessEvent.EndEvent(
            exit_code=returncode, exited=True, status=error, error=error
        )
    return process_pb.ProcessEvent.EndEvent(exit_code=0, exited=True, status="exit status 0")


def _response(event: Any) -> process_pb.StartResponse:
    return process_pb.StartResponse(event=process_pb.ProcessEvent(event=event))


def sandbox_pids(sandbox_id: str) -> set[int]:
    """Live host processes of a sandbox: those carrying its E2B_SANDBOX_ID and their
    descendants (read from the host's /proc, zombies excluded)."""
    marker = f"E2B_SANDBOX_ID={sandbox_id}".encode()
    parents: dict[int, int] = {}
    members: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state, ppid = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:2]
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if state == "Z":
            continue
        parents[int(entry.name)] = int(ppid)
        if marker in environ:
            members.add(int(entry.name))
    grown = True
    while grown:
        children = {pid for pid, ppid in parents.items() if ppid in members} - members
        members |= children
        grown = bool(children)
    return members


async def kill_sandbox_processes(sandbox_id: str) -> None:
    """SIGKILL every process of the sandbox until none is left (forks in between included)."""
    for _ in range(200):
        pids = sandbox_pids(sandbox_id)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        await asyncio.sleep(0.005)
    raise RuntimeError(f"processes of sandbox {sandbox_id} survive SIGKILL: {pids}")


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
        if path == "/v2/sandboxes" and method == "POST":
            await self._create(scope, receive, send)
        elif path.startswith("/sandboxes/") and method == "DELETE":
            await self._kill(path.removeprefix("/sandboxes/"), send)
        elif not path.startswith(_ENVD_PATHS):
            await _reply_json(send, 404, {"code": 404, "message": f"no route {method} {path}"})
        elif await self._refuse_envd(scope, send):
            return
        elif path.startswith("/process.Process/"):
            await self._rpc(scope, receive, send)
        elif path == "/health":
            await _reply(send, 204, b"")
        elif path == "/files" and method == "GET":
            await self._read(scope, send)
        elif path == "/files" and method == "POST":
            await self._write(scope, receive, send)
        else:
            await _reply_json(send, 404, {"code": 404, "message": f"no route {method} {path}"})

    async def _refuse_envd(self, scope: Scope, send: Send) -> bool:
        """Answer (and return True) unless the request names a running sandbox and its token."""
        await asyncio.sleep(self.state.envd_delay)
        headers = _headers(scope)
        sandbox_id = headers.get("e2b-sandbox-id", "")
        sandbox = self.state.sandboxes.get(sandbox_id)
        if sandbox is None or not sandbox.running:
            message = f"The sandbox {sandbox_id} was not found"
            await _reply_json(send, 502, {"code": 502, "message": message})
            return True
        if headers.get("x-access-token") != sandbox.access_token:
            await _reply_json(send, 401, {"code": 401, "message": "invalid access token"})
            return True
        return False

    async def _create(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = json.loads(await _body(receive))
        key = _headers(scope).get("idempotency-key", "")
        self.state.create_requests.append(body)
        self.state.idempotency_keys.append(key)
        boot = self.state.boots.get(key) if key else None
        if boot is not None and not boot.done():
            message = f"a request with idempotency key {key} is in progress"
            error = {"code": 409, "message": message, "error_code": "idempotency_in_progress"}
            await _reply_json(send, 409, error)
            return
        if boot is None or boot.result() is None:
            boot = asyncio.ensure_future(self._boot(key))
            if key:
                self.state.boots[key] = boot
        sandbox = await asyncio.shield(boot)  # the boot outlives a client that goes away
        if sandbox is None:
            await _reply_json(send, 503, {"code": 503, "message": "no capacity (injected)"})
            return
        await _reply_json(
            send,
            201,
            {
                "templateID": body.get("templateID", "base"),
                "sandboxID": sandbox.sandbox_id,
                "clientID": "fake-client",
                "envdVersion": ENVD_VERSION,
                "envdAccessToken": sandbox.access_token,
            },
        )

    async def _boot(self, key: str) -> FakeSandbox | None:
        self.state.creating += 1
        self.state.max_creating = max(self.state.max_creating, self.state.creating)
        try:
            await asyncio.sleep(self.state.create_delay)
        finally:
            self.state.creating -= 1
        if self.state.fail_creates > 0:
            self.state.fail_creates -= 1
            return None
        sandbox_id = f"fake{uuid.uuid4().hex[:12]}"
        sandbox = FakeSandbox(sandbox_id, f"token-{uuid.uuid4().hex}", key)
        self.state.sandboxes[sandbox_id] = sandbox
        return sandbox

    async def _kill(self, sandbox_id: str, send: Send) -> None:
        self.state.delete_requests.append(sandbox_id)
        await asyncio.sleep(self.state.kill_delay)
        sandbox = self.state.sandboxes.get(sandbox_id)
        if sandbox is None or not sandbox.running:
            message = f"sandbox {sandbox_id} not found"
            await _reply_json(send, 404, {"code": 404, "message": message})
            return
        sandbox.running = False
        await kill_sandbox_processes(sandbox_id)
        self.state.killed_sandboxes.append(sandbox_id)
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


def _headers(scope: Scope) -> dict[str, str]:
    return {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}


def _query(scope: Scope, name: str) -> str:
    query: bytes = scope["query_string"]
    return parse_qs(query.decode())[name][0]


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


def backend_config(url: str, root: Path, **overrides: Any) -> E2BConfig:
    """Our backend pointed at the fake at `url`: workspace and output files under `root`,
    retries a few milliseconds apart."""
    config = E2BConfig(
        api_key="e2b_test_key",
        api_url=url,
        sandbox_url=url,
        http_version="1.1",
        request_timeout=10.0,
        boot_retry=RetryPolicy(attempts=3, initial_delay=0.01, multiplier=2.0, max_delay=0.05),
        workspace_path=str(root / "workspace"),
        output_root=root,
    )
    return dataclasses.replace(config, **overrides)


@contextlib.asynccontextmanager
async def serve_fake_e2b(state: FakeState) -> AsyncIterator[str]:
    """Run the fake on 127.0.0.1 in this event loop; yields its base URL.

    On exit every sandbox dies with its processes, as if the cloud were shut down."""
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
        for boot in state.boots.values():
            with contextlib.suppress(BaseException):
                await boot
        for sandbox_id in state.sandboxes:
            await kill_sandbox_processes(sandbox_id)
        server.should_exit = True
        await task
        sock.close()
