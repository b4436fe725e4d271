"""A sandbox cannot take the host's descriptors through its forwarded endpoint.

Each relayed connection costs the host two descriptors; a sandbox holding thousands open once
exhausted the host process's limit and a neighbour's next command failed with "Too many open
files". Now a sandbox relays at most `ResourceLimits.max_connections` at once and all sandboxes
of a backend at most their shared `RelayBudget`: a connection past a cap is closed at once,
counted, and reported as the `max_connections` limit hit.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator

import pytest

from sandbox import ForwardedEndpoint, LocalBackend, LocalSandbox, ResourceLimits, SandboxSpec
from sandbox._local._forward import HostRelay, RelayBudget

# Opens N connections to the forwarded port, sends a line on each, keeps them all open while it
# reads the answers, and prints how many were relayed (answered) and how many were closed.
HOLD = """
import socket, sys
n, port = int(sys.argv[1]), int(sys.argv[2])
socks = []
for _ in range(n):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    socks.append(s)
    try:
        s.sendall(b"ping\\n")
    except OSError:  # closed by the relay already
        pass
answered = 0
for s in socks:
    try:
        answered += s.recv(16) == b"ping\\n"
    except OSError:  # reset by the relay
        pass
print(answered, n - answered)
"""


@pytest.fixture
async def echo_port() -> AsyncIterator[int]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                writer.write(line)
                await writer.drain()
        finally:
            writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    async with server:
        yield server.sockets[0].getsockname()[1]


async def read_or_reset(reader: asyncio.StreamReader) -> bytes:
    try:
        return await asyncio.wait_for(reader.read(2), 5)
    except ConnectionResetError:
        return b""


def host_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_a_sandbox_relays_at_most_its_cap_and_a_neighbour_is_unharmed(
    backend: LocalBackend, echo_port: int
) -> None:
    limits = ResourceLimits(max_connections=8)
    spec = SandboxSpec(network=ForwardedEndpoint("127.0.0.1", echo_port, 9000), limits=limits)
    async with await backend.create(spec) as box, await backend.create(spec) as neighbour:
        assert isinstance(box, LocalSandbox)
        before = host_descriptors()
        held = await box.exec(f"python3 -c '{HOLD}' 60 9000", timeout=60)
        assert held.ok, held.stderr
        answered, refused = map(int, held.stdout.split())
        assert answered == 8  # the cap, all relayed
        assert refused == 52
        assert box.refused_connections >= 52
        assert "max_connections" in held.limits_hit
        assert host_descriptors() <= before + 2 * 8 + 8  # never 2 per attempted connection
        ok = await neighbour.exec(f"python3 -c '{HOLD}' 3 9000", timeout=30)
        assert ok.stdout.split() == ["3", "0"]
        assert "max_connections" not in ok.limits_hit


async def test_all_relays_of_a_backend_share_one_budget(echo_port: int) -> None:
    budget = RelayBudget(connections=3)
    listeners, relays = [], []
    for _ in range(2):
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        listeners.append(listener)
        relay = HostRelay(listener, "127.0.0.1", echo_port, budget=budget)
        await relay.start()
        relays.append(relay)
    streams = []
    try:
        for listener in listeners:
            for _ in range(3):
                reader, writer = await asyncio.open_connection(*listener.getsockname())
                writer.write(b"x\n")
                streams.append((reader, writer))
        answers = [await read_or_reset(reader) for reader, _ in streams]
        assert answers.count(b"x\n") == 3  # the budget, across both relays
        assert sum(relay.refused for relay in relays) == 3
        assert budget.open == 3
    finally:
        for _, writer in streams:
            writer.close()
        for relay in relays:
            await relay.close()
    assert budget.open == 0  # every relayed connection gave its share back
