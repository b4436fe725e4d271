"""Forwarding one host TCP endpoint into a sandbox that has no network.

The sandbox's network namespace has only loopback. Its init opens a listening socket on
127.0.0.1:PORT *inside* that namespace and hands it to the host (see _init.py); the host
accepts on it and relays each connection to the real endpoint (the protocol adapter). Nothing
else on the host is reachable: there is no route out, no file to connect to, and the socket is
held by the host alone, so sandboxed code cannot take it over (it may listen on other ports of
its own loopback, which reach nothing). No helper process runs in the sandbox for this.

Each relayed connection costs the host two descriptors (the accepted socket and the one to the
endpoint). A sandbox holding thousands open could exhaust the host process's descriptors, and a
neighbour's next command would fail with "Too many open files". So a sandbox relays at most
`max_connections` at once, and all sandboxes of a backend together at most what their shared
`RelayBudget` allows (a share of the process's descriptor limit); a connection past either is
closed at once and counted (`refused`), and reported as the `max_connections` limit hit.

Closing ends every relayed connection by aborting its transports, so both copy loops finish
on their own: nothing is cancelled mid-callback and nothing is logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket

_RELAY_CHUNK = 64 * 1024
_CLOSE_GRACE = 1.0
_DESCRIPTORS_PER_CONNECTION = 2


class RelayBudget:
    """Connections all relays of one backend may hold at once: a quarter of the process's
    descriptor limit by default (the rest stays for commands, files and the adapter)."""

    def __init__(self, connections: int | None = None) -> None:
        if connections is None:
            soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
            connections = max(64, soft // (4 * _DESCRIPTORS_PER_CONNECTION))
        self.connections = connections
        self.open = 0


class HostRelay:
    """Accepts connections on `listener` (inside the sandbox) and pipes each to host:port, at
    most `max_connections` at once (None: no cap of its own) within the shared `budget`."""

    def __init__(
        self,
        listener: socket.socket,
        host: str,
        port: int,
        *,
        max_connections: int | None = None,
        budget: RelayBudget | None = None,
    ) -> None:
        self._listener = listener
        self._host = host
        self._port = port
        self._max = max_connections
        self._budget = budget or RelayBudget()
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.refused = 0
        """Connections closed at once because a cap was reached."""

    async def start(self) -> None:
        self._listener.setblocking(False)
        self._server = await asyncio.start_server(self._handle, sock=self._listener)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._writers):
            writer.transport.abort()
        if self._connections:
            _, pending = await asyncio.wait(self._connections, timeout=_CLOSE_GRACE)
            for task in pending:  # only a relay stuck in a blocking call would get here
                task.cancel()
            if pending:
                await asyncio.wait(pending)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        full = self._max is not None and len(self._connections) >= self._max
        if full or self._budget.open >= self._budget.connections:
            self.refused += 1
            writer.transport.abort()
            return
        self._budget.open += 1
        self._connections.add(task)
        self._writers.add(writer)
        try:
            try:
                up_reader, up_writer = await asyncio.open_connection(self._host, self._port)
            except OSError:
                return
            self._writers.add(up_writer)
            try:
                await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
            finally:
                self._writers.discard(up_writer)
                await _close(up_writer)
        finally:
            self._writers.discard(writer)
            await _close(writer)
            self._connections.discard(task)
            self._budget.open -= 1


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(_RELAY_CHUNK):
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        writer.transport.abort()


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(ConnectionError, OSError):
        await writer.wait_closed()
