"""Forwarding one host TCP endpoint into a sandbox that has no network.

The sandbox has its own network namespace with only loopback. On the host we listen on a Unix
socket in the sandbox's private state directory and relay every connection to the adapter's
TCP endpoint; the socket's directory is bind-mounted read-only into the sandbox, and inside
`socat` listens on 127.0.0.1:PORT and relays to that socket. Nothing else on the host is
reachable: there is no route out of the namespace, only this one file.

Why socat: a single small Debian package, already the standard tool for exactly this relay,
starts in about a millisecond, and needs nothing from the sandbox image beyond the host /usr
that is mounted anyway. (A Python relay would need an interpreter inside and cost ~30 ms.)
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

#: Where the relay socket's directory appears inside the sandbox.
SANDBOX_SOCKET_DIR = "/run/sandbox-forward"
SOCKET_NAME = "endpoint.sock"
_RELAY_CHUNK = 64 * 1024


class HostRelay:
    """Accepts connections on a Unix socket and pipes each to the host TCP endpoint."""

    def __init__(self, socket_path: Path, host: str, port: int) -> None:
        self._socket_path = socket_path
        self._host = host
        self._port = port
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._handle, path=str(self._socket_path))

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            try:
                up_reader, up_writer = await asyncio.open_connection(self._host, self._port)
            except OSError:
                return
            try:
                await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
            finally:
                await _close(up_writer)
        finally:
            await _close(writer)
            self._tasks.discard(task)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(_RELAY_CHUNK):
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        writer.close()


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(ConnectionError, OSError):
        await writer.wait_closed()


def socat_argv(socat: str, port: int) -> list[str]:
    """The in-sandbox listener: 127.0.0.1:port -> the relay socket (one child per connection)."""
    return [
        socat,
        f"TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork",
        f"UNIX-CONNECT:{SANDBOX_SOCKET_DIR}/{SOCKET_NAME}",
    ]


def is_listening(netns_pid: int, port: int) -> bool:
    """True once 127.0.0.1:port is in LISTEN state in the network namespace of `netns_pid`.

    Read from the host through /proc, so readiness costs no process inside the sandbox.
    """
    wanted = f"0100007F:{port:04X}"
    try:
        table = Path(f"/proc/{netns_pid}/net/tcp").read_text()
    except OSError:
        return False
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) > 3 and fields[1] == wanted and fields[3] == "0A":
            return True
    return False
