"""Sandboxes never block the event loop that also serves the adapter and the other episodes.

Run under asyncio's debug mode with `slow_callback_duration` at 50 ms. Debug mode times each
callback by the wall clock, which also counts the loop thread waiting for a CPU: with 16
sandboxes busy on 2 cores that is the scheduler's doing, not ours. So each callback's own CPU
time (the loop thread's) is measured too, and its wait for a CPU (the kernel's run delay): a
callback is ours to fix when it *used* 50 ms of an idle machine's CPU (a busy host stretches
CPU time too, see `machine_load`), and any stall past half a second not spent waiting for a
CPU fails whatever its cause, that half second stretched as the machine's load stretches
reference work timed before and after. The host service the sandboxes talk to runs on a loop
of its own, in another thread: only sandbox code shares the loop under test.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
import time
from collections.abc import Iterator
from typing import Any

from machine_load import run_delay, slowdown

from sandbox import ForwardedEndpoint, LocalBackend, SandboxSpec

SLOW_CALLBACK = 0.05
GROSS_STALL = 0.5


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while line := await reader.readline():
        writer.write(line)
        await writer.drain()
    writer.close()


@contextlib.contextmanager
def echo_service() -> Iterator[int]:
    """A line echo server on 127.0.0.1, served from its own thread and loop; yields its port."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    ports: list[int] = []
    stop = asyncio.Event()

    async def serve() -> None:
        server = await asyncio.start_server(echo, "127.0.0.1", 0)
        ports.append(server.sockets[0].getsockname()[1])
        started.set()
        async with server:
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert started.wait(10)
    try:
        yield ports[0]
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        loop.close()


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


@contextlib.contextmanager
def timed_callbacks() -> Iterator[list[tuple[float, float, str]]]:
    """(wall s less the wait for a CPU, loop-thread CPU s, callback) of every callback of this
    thread's loop slower than SLOW_CALLBACK. The CPU leaves out the cyclic garbage collector's
    passes on this thread: a full pass walks the whole process's heap (debug mode keeps a
    traceback on every handle) and lands in whichever callback allocates at the time; it is not
    that callback's work. Over SLOW_CALLBACK, it is divided by how much the host stretches CPU
    time right then (an idle machine's CPU time)."""
    original = asyncio.events.Handle._run
    slow: list[tuple[float, float, str]] = []
    ours = threading.get_ident()
    collecting = [0.0, 0.0]  # this thread's CPU: at the current pass's start, in all passes

    def collector(phase: str, info: dict[str, int]) -> None:
        del info
        if threading.get_ident() == ours:
            if phase == "start":
                collecting[0] = time.thread_time()
            else:
                collecting[1] += time.thread_time() - collecting[0]

    def run(handle: Any) -> None:
        if threading.get_ident() != ours:
            original(handle)
            return
        wall, cpu, collected = time.perf_counter(), time.thread_time(), collecting[1]
        queued = run_delay()
        try:
            original(handle)
        finally:
            elapsed = time.perf_counter() - wall
            if elapsed > SLOW_CALLBACK:
                used = time.thread_time() - cpu - (collecting[1] - collected)
                held = elapsed - (run_delay() - queued)
                if used > SLOW_CALLBACK:
                    used /= slowdown(time.thread_time)
                slow.append((held, used, repr(handle)[:300]))

    gc.callbacks.append(collector)
    asyncio.events.Handle._run = run  # type: ignore[method-assign, assignment]
    try:
        yield slow
    finally:
        asyncio.events.Handle._run = original  # type: ignore[method-assign]
        gc.callbacks.remove(collector)


async def test_many_sandboxes_never_stall_the_loop(backend: LocalBackend) -> None:
    await backend.enforcement()
    busy = slowdown()
    loop = asyncio.get_running_loop()
    loop.set_debug(True)
    loop.slow_callback_duration = SLOW_CALLBACK
    try:
        with echo_service() as port, timed_callbacks() as slow:
            await asyncio.gather(*(one_episode(backend, port, i) for i in range(16)))
    finally:
        loop.set_debug(False)
    stall = GROSS_STALL * max(busy, slowdown())
    print(f"a stall: held over {stall * 1000:.0f} ms")
    for held, used, callback in sorted(slow, reverse=True)[:10]:
        print(f"held {held * 1000:7.1f} ms, used {used * 1000:5.1f} ms: {callback}")
    ours = [entry for entry in slow if entry[1] > SLOW_CALLBACK or entry[0] > stall]
    assert ours == []
