"""A stalled event loop never makes a healthy engine look unreachable.

On a busy node the loop that serves the adapter also runs episodes; a garbage collection or a
burst of work can hold it for longer than the engine's connect timeout. The connect to a healthy
engine completes in the kernel meanwhile, but its completion and an expired connect timer
become ready in the same loop iteration, and a plain timer wins: the agent would get a 529 for
an engine that was fine. The connect timeout must count only time the loop ran.

The stall is put exactly where it hurts: right after a connect is issued, the next loop
iteration blocks (``stall_after_connect``). A connect that truly never completes (a listener
whose backlog is full drops the SYNs) must still fail as unreachable, stall or no stall.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anthropic
import pytest
from machine_load import slowdown
from transformers import PreTrainedTokenizerFast

from protocol_adapters._engine import GenerateRequest, SamplingParams, SGLangConfig, SGLangEngine
from protocol_adapters._tokenizer import Vocabulary
from protocol_adapters._types import AdapterError, ErrorKind
from protocol_adapters.testing import EngineDouble, ScriptedReply
from protocol_adapters.testing.stack import local_stack

FIXTURE = Path(__file__).parent.parent / "fixtures" / "small_tokenizer.json"
CONNECT_TIMEOUT = 0.2
STALL = 0.6
REPLY = ScriptedReply(text="The engine is fine.")


@contextlib.contextmanager
def stall_after_connect(seconds: float, port: int | None = None) -> Iterator[list[float]]:
    """Every TCP connect the running loop starts (to ``port``, if given) is followed by the loop
    blocking ``seconds`` (a callback queued as the connect is issued). Yields the stalls made."""
    loop = asyncio.get_running_loop()
    real = loop.sock_connect
    stalls: list[float] = []

    async def connect_then_stall(sock: socket.socket, address: Any) -> None:
        if port is None or address[1] == port:
            loop.call_soon(time.sleep, seconds)
            stalls.append(seconds)
        await real(sock, address)

    loop.sock_connect = connect_then_stall  # type: ignore[method-assign]
    try:
        yield stalls
    finally:
        del loop.sock_connect


@contextlib.contextmanager
def black_hole() -> Iterator[str]:
    """A base URL whose TCP connects never complete: a listener that never accepts, its
    backlog filled, so the kernel drops further SYNs."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    host, port = listener.getsockname()
    fillers = []
    try:
        for _ in range(8):
            filler = socket.socket()
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect((host, port))
            fillers.append(filler)
        yield f"http://{host}:{port}"
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


def request() -> GenerateRequest:
    return GenerateRequest(input_ids=(5, 6, 7, 8), sampling=SamplingParams(max_new_tokens=64))


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_file=str(FIXTURE))  # type: ignore[no-untyped-call]


@pytest.mark.parametrize("streaming", [False, True])
async def test_a_stall_longer_than_the_connect_timeout_does_not_fail_a_healthy_engine(
    tokenizer: Any, streaming: bool
) -> None:
    async with EngineDouble(tokenizer, [REPLY]) as double:
        config = SGLangConfig(double.url, connect_timeout=CONNECT_TIMEOUT)
        async with SGLangEngine(config) as engine:
            with stall_after_connect(STALL) as stalls:
                if streaming:
                    chunks = [chunk async for chunk in engine.stream(request())]
                    ids = [token for chunk in chunks for token in chunk.output_ids]
                else:
                    ids = list((await engine.generate(request())).output_ids)
    assert stalls == [STALL]  # the connect really was stalled, for 3x the timeout
    assert ids == double.reply_ids(REPLY)


async def test_a_connect_that_never_completes_still_times_out() -> None:
    with black_hole() as url:
        async with SGLangEngine(SGLangConfig(url, connect_timeout=CONNECT_TIMEOUT)) as engine:
            started = time.monotonic()
            with pytest.raises(AdapterError) as caught:
                await engine.generate(request())
            took = time.monotonic() - started
    assert caught.value.kind is ErrorKind.OVERLOADED
    assert "unreachable" in caught.value.message
    assert CONNECT_TIMEOUT <= took < CONNECT_TIMEOUT + 2 * slowdown()  # 2 s: an idle machine's


async def test_a_dead_engine_still_times_out_after_a_stall_which_does_not_count() -> None:
    with black_hole() as url:
        async with SGLangEngine(SGLangConfig(url, connect_timeout=CONNECT_TIMEOUT)) as engine:
            with stall_after_connect(STALL) as stalls:
                started = time.monotonic()
                with pytest.raises(AdapterError) as caught:
                    await engine.generate(request())
                took = time.monotonic() - started
    assert stalls == [STALL]
    assert caught.value.kind is ErrorKind.OVERLOADED
    # Most of the timeout ran after the stall (a stall counts as one tick), and not much more
    # (2 s on an idle machine).
    assert STALL + CONNECT_TIMEOUT * 0.75 <= took < STALL + CONNECT_TIMEOUT + 2 * slowdown()


async def test_through_the_adapter_a_stalled_loop_is_no_529(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    async with local_stack(
        lambda ids: REPLY,
        tokenizer_cache=tokenizer_cache,
        vocabulary=qwen_vocabulary,
        engine_config=lambda url: SGLangConfig(url, connect_timeout=CONNECT_TIMEOUT),
    ) as stack:
        tokens = [stack.server.sessions.open(f"stalled-{i}").token for i in range(3)]
        clients = [
            anthropic.AsyncAnthropic(base_url=stack.server.url, api_key=token, max_retries=0)
            for token in tokens
        ]
        with stall_after_connect(STALL, urlsplit(stack.double.url).port) as stalls:
            replies = await asyncio.gather(
                *(
                    client.messages.create(
                        model="policy",
                        max_tokens=64,
                        messages=[{"role": "user", "content": "Is the engine fine?"}],
                    )
                    for client in clients
                )
            )
        for client in clients:
            await client.close()
    # At least one new connection to the engine stalled the loop right after its connect (the
    # pool may hand the other calls a connection an earlier call freed: on a loaded machine the
    # three calls need not overlap), and no call got a 529.
    assert stalls
    assert [reply.content[0].text for reply in replies] == [REPLY.text] * 3  # type: ignore[union-attr]
