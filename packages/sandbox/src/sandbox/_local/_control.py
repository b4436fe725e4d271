"""The host's end of the control socket to a local sandbox's pid 1 (see _init.py).

Everything is driven by the event loop's reader callback: no thread, no subprocess per command,
no polling. Replies are matched to requests by id; exits arrive as events and are kept per pid,
so a command that exits before anyone waits for it is never missed.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import json
import os
import signal
import socket
from collections.abc import Mapping, Sequence
from typing import Any

from sandbox._errors import SandboxBootError, SandboxCommandError, SandboxError
from sandbox._local._init import ANCILLARY_SPACE, MAX_DATAGRAM, received_fds

_Reply = tuple[dict[str, object], list[int]]


class InitGoneError(SandboxError):
    """The sandbox's pid 1 is gone (the sandbox was closed or died)."""


class InitChannel:
    """Requests to a sandbox's init and the exits it reports."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._loop = asyncio.get_running_loop()
        self._next_id = 0
        self._replies: dict[int, asyncio.Future[_Reply]] = {}
        self._abandoned: set[int] = set()
        """Requests whose caller went away: a command they started is killed on arrival."""
        self._exits: dict[int, asyncio.Future[int]] = {}
        self.full: tuple[str, ...] = ()
        """Size limits whose tmpfs was full when the latest command ended."""
        self.rlimit_kills: dict[str, int] = {}
        """Processes other than commands killed by an rlimit's signal, by limit, so far."""
        self._ready: asyncio.Future[None] = self._loop.create_future()
        self._gone: InitGoneError | None = None
        self._loop.add_reader(sock.fileno(), self._on_readable)

    async def ready(self, timeout: float) -> None:
        """Wait for init's first message, which it sends once it serves requests."""
        try:
            async with asyncio.timeout(timeout):  # not wait_for: it can swallow a cancellation
                await asyncio.shield(self._ready)
        except TimeoutError:
            raise SandboxBootError(f"sandbox init did not start within {timeout} s") from None
        except InitGoneError as error:
            raise SandboxBootError(f"sandbox init exited while starting: {error}") from None

    async def spawn(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str,
        stdio: tuple[int, int, int],
    ) -> int:
        """Start a command in a new session inside the sandbox; returns its pid there."""
        body = json.dumps({"argv": list(argv), "env": dict(env), "cwd": cwd}).encode()
        if len(body) + 64 <= MAX_DATAGRAM:
            header: dict[str, object] = json.loads(body)
            reply, _ = await self._request({"op": "spawn", **header}, stdio)
        else:
            memfd = os.memfd_create("spawn-request", os.MFD_CLOEXEC)
            try:
                _write_all(memfd, body)
                os.lseek(memfd, 0, os.SEEK_SET)
                reply, _ = await self._request({"op": "spawn", "body": True}, (*stdio, memfd))
            finally:
                os.close(memfd)
        if "error" in reply:
            raise SandboxCommandError(str(reply["error"]))
        pid = reply["pid"]
        assert isinstance(pid, int)
        return pid

    async def wait(self, pid: int) -> int:
        """The command's return code once init reaped it (negative: killed by that signal)."""
        return await asyncio.shield(self._exit_future(pid))

    def exited(self, pid: int) -> bool:
        future = self._exits.get(pid)
        return future is not None and future.done()

    def kill_group(self, pid: int, signum: int = signal.SIGKILL) -> None:
        """Signal the process group `pid` leads, unless it is already reaped; never blocks."""
        if self._gone is not None or self.exited(pid):
            return
        with contextlib.suppress(BlockingIOError, OSError):
            self._send({"op": "signal", "pid": pid, "sig": signum}, ())

    async def kill_all(self, timeout: float) -> int:
        """SIGKILL every process of the sandbox but init; the number still alive after
        `timeout` seconds (0: all gone)."""
        reply, _ = await self._request({"op": "killall", "timeout": timeout}, ())
        remaining = reply.get("remaining")
        assert isinstance(remaining, int)
        return remaining

    async def listen(self, port: int) -> socket.socket:
        """A TCP socket listening on 127.0.0.1:port inside the sandbox's network namespace."""
        reply, fds = await self._request({"op": "listen", "port": port}, ())
        if "error" in reply:
            raise SandboxBootError(str(reply["error"]))
        if len(fds) != 1:
            raise SandboxBootError("sandbox init sent no listening socket")
        return socket.socket(fileno=fds[0])

    def close(self) -> None:
        """Close our end; init exits when it notices, which ends the sandbox."""
        if self._gone is None:
            self._fail(InitGoneError("sandbox closed"))
        self._loop.remove_reader(self._sock.fileno())
        self._sock.close()

    # -- plumbing -----------------------------------------------------------------------

    async def _request(self, message: dict[str, object], fds: Sequence[int]) -> _Reply:
        if self._gone is not None:
            raise self._gone
        self._next_id += 1
        request = self._next_id
        future: asyncio.Future[_Reply] = self._loop.create_future()
        self._replies[request] = future
        data = {**message, "id": request}
        sent = False
        try:
            while not sent:
                try:
                    self._send(data, fds)
                    sent = True
                except BlockingIOError:
                    await self._writable()
            return await future
        except asyncio.CancelledError:
            if sent:
                self._abandoned.add(request)
            raise
        finally:
            self._replies.pop(request, None)

    def _send(self, message: Mapping[str, object], fds: Sequence[int]) -> None:
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        try:
            self._sock.sendmsg([json.dumps(message).encode()], ancillary)
        except (BrokenPipeError, ConnectionResetError) as error:
            gone = InitGoneError(f"sandbox init is gone: {error}")
            self._fail(gone)
            raise gone from error

    async def _writable(self) -> None:
        future: asyncio.Future[None] = self._loop.create_future()
        self._loop.add_writer(self._sock.fileno(), future.set_result, None)
        try:
            await future
        finally:
            self._loop.remove_writer(self._sock.fileno())

    def _exit_future(self, pid: int) -> asyncio.Future[int]:
        future = self._exits.get(pid)
        if future is None:
            future = self._exits[pid] = self._loop.create_future()
            if self._gone is not None:
                future.set_exception(self._gone)
        return future

    def _on_readable(self) -> None:
        while True:
            try:
                data, ancillary, flags, _ = self._sock.recvmsg(MAX_DATAGRAM, ANCILLARY_SPACE)
            except BlockingIOError:
                return
            except OSError as error:
                self._fail(InitGoneError(f"sandbox init is gone: {error}"))
                return
            if not data:
                self._fail(InitGoneError("sandbox init exited"))
                return
            fds = received_fds(ancillary)
            if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
                for fd in fds:
                    os.close(fd)
                self._fail(InitGoneError("sandbox init sent an oversized message"))
                return
            self._dispatch(json.loads(data), fds)

    def _dispatch(self, message: dict[str, object], fds: list[int]) -> None:
        event = message.get("ev")
        if event == "exit":
            pid, code = message["pid"], message["returncode"]
            assert isinstance(pid, int)
            assert isinstance(code, int)
            full, kills = message.get("full", []), message.get("rlimit_kills", {})
            assert isinstance(full, list)
            assert isinstance(kills, dict)
            self.full = tuple(str(limit) for limit in full)
            self.rlimit_kills = {str(limit): int(count) for limit, count in kills.items()}
            future = self._exit_future(pid)
            if not future.done():
                future.set_result(code)
        elif event == "ready":
            if not self._ready.done():
                self._ready.set_result(None)
        else:
            request = message.get("id")
            future_reply = self._replies.get(request) if isinstance(request, int) else None
            if future_reply is None or future_reply.done():
                for fd in fds:
                    os.close(fd)
                pid = message.get("pid")
                if request in self._abandoned and isinstance(pid, int):
                    self._exit_future(pid)
                    self.kill_group(pid)
                if isinstance(request, int):
                    self._abandoned.discard(request)
                return
            future_reply.set_result((message, fds))
            # A spawned pid's exit can arrive in this same read: have its future ready now.
            if isinstance(message.get("pid"), int):
                self._exit_future(int(str(message["pid"])))

    def _fail(self, error: InitGoneError) -> None:
        if self._gone is not None:
            return
        self._gone = error
        futures: list[asyncio.Future[Any]] = [*self._replies.values(), *self._exits.values()]
        for future in (*futures, self._ready):
            if not future.done():
                future.set_exception(error)
                # Nobody may be waiting on an exit; keep asyncio from logging it as unretrieved.
                future.exception()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
