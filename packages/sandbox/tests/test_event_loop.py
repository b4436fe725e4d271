"""Sandboxes never block the event loop that also serves the adapter and the other episodes.

Run under asyncio's debug mode, which reports every callback that holds the loop longer than
`slow_callback_duration`: creating, using and closing many sandboxes at once must not produce
one. (Everything heavy in this package runs in worker threads or in the sandbox's own init.)
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from sandbox.local import LocalBackend
from sandbox.spec import ForwardedEndpoint, SandboxSpec

SLOW_CALLBACK = 0.05


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while line := await reader.readline():
        writer.write(line)
        await writer.drain()
    writer.close()


async def one_episode(backend: LocalBackend, port: int, index: int) -> None:
    spec = SandboxSpec(network=ForwardedEndpoint("127.0.0.1", port, 9000))
    async with await backend.create(spec) as box:
        await box.write_file("task.txt", f"task {index}\n" * 1000)
        assert (await box.exec("wc -l < task.txt")).stdout == "1000\n"
        talk = (
            "exec 3<>/dev/tcp/127.0.0.1/9000; for i in $(seq 50); do echo $i >&3; read r <&3; done"
        )
        assert (await box.exec(talk, timeout=30)).ok
        agent = await box.start("for i in $(seq 200); do echo line $i; done; sleep 0.2")
        await agent.wait(timeout=30)
        assert len(await box.read_file("task.txt")) == 1000 * len(f"task {index}\n")


async def test_many_sandboxes_never_stall_the_loop(
    backend: LocalBackend, caplog: pytest.LogCaptureFixture
) -> None:
    await backend.enforcement()
    loop = asyncio.get_running_loop()
    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    loop.set_debug(True)
    loop.slow_callback_duration = SLOW_CALLBACK
    try:
        with caplog.at_level(logging.WARNING, logger="asyncio"):
            async with server:
                await asyncio.gather(*(one_episode(backend, port, i) for i in range(16)))
    finally:
        loop.set_debug(False)
    slow = [r.getMessage() for r in caplog.records if "took" in r.getMessage()]
    assert slow == []
