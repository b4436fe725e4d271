"""Property: whatever a client sends, a request the adapter answers with 2xx leaves a tree that
still serializes to UTF-8, reloads and linearizes, and no request gets a 5xx.

Requests are generated in all three dialects with text that may hold lone surrogates (sent as
JSON ``\\udXXX`` escapes, as ``json.dumps`` writes them), huge strings, and recorded headers with
arbitrary bytes. The server runs on an event loop of its own thread; requests are plain HTTP.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from server_clients import PATHS, Dialect, always_ok

from protocol_adapters._tokenizer import Vocabulary
from protocol_adapters.testing.stack import LocalStack, local_stack
from trajectory_tree import dumps, linearize, loads

T = TypeVar("T")


class ServedStack:
    """A local stack served from a background thread's event loop, for synchronous tests."""

    def __init__(self, tokenizer_cache: Path, vocabulary: Vocabulary) -> None:
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._stack: LocalStack | None = None
        self._failure: BaseException | None = None
        self._thread = threading.Thread(
            target=self._loop.run_until_complete,
            args=(self._serve(tokenizer_cache, vocabulary),),
            daemon=True,
        )

    async def _serve(self, tokenizer_cache: Path, vocabulary: Vocabulary) -> None:
        self._stop = asyncio.Event()
        try:
            async with local_stack(
                always_ok, tokenizer_cache=tokenizer_cache, vocabulary=vocabulary
            ) as stack:
                self._stack = stack
                self._ready.set()
                await self._stop.wait()
        except BaseException as exc:
            self._failure = exc
            self._ready.set()

    def __enter__(self) -> ServedStack:
        self._thread.start()
        self._ready.wait(60)
        if self._failure is not None:
            raise self._failure
        return self

    def __exit__(self, *exc: object) -> None:
        stop = self._stop
        assert stop is not None
        self._loop.call_soon_threadsafe(stop.set)
        self._thread.join(30)
        self._loop.close()

    @property
    def stack(self) -> LocalStack:
        assert self._stack is not None
        return self._stack

    def call(self, make: Callable[[], Awaitable[T]]) -> T:
        """Run a coroutine on the server's loop (the tree is touched only from there)."""

        async def run() -> T:
            return await make()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(60)


@pytest.fixture(scope="module")
def served(tokenizer_cache: Path, qwen_vocabulary: Vocabulary) -> Iterator[ServedStack]:
    with ServedStack(tokenizer_cache, qwen_vocabulary) as running:
        yield running


# -- what a client may send ------------------------------------------------------------------

LONE_SURROGATES = st.integers(0xD800, 0xDFFF).map(chr)
TEXT = st.text(max_size=24)
NOT_UNICODE = st.tuples(TEXT, LONE_SURROGATES, TEXT).map("".join)
HUGE_TEXT = st.sampled_from(["lorem ipsum dolor " * 6000, "é 猫 \n" * 20000, "x" * 120_000])
FIELDS = 10
FIELD_BYTES = [0x09, *range(0x20, 0x7F), *range(0x80, 0x100)]
"""Bytes HTTP allows in a header value (visible ASCII, space, tab and obs-text 0x80-0xFF);
aiohttp's parser refuses control characters itself, before any handler runs."""
HEADER_BYTES = st.lists(st.sampled_from(FIELD_BYTES), max_size=12).map(bytes)
UTF8_HEADER = st.text(
    st.characters(min_codepoint=0x20, exclude_characters="\x7f", codec="utf-8"), max_size=12
)
HEADER = st.one_of(st.none(), st.none(), UTF8_HEADER.map(str.encode), HEADER_BYTES)


@dataclass(frozen=True)
class Case:
    dialect: Dialect
    body: dict[str, Any]
    headers: dict[str, bytes]


def anthropic_body(t: list[str]) -> dict[str, Any]:
    return {
        "model": t[0],
        "max_tokens": 32,
        "system": t[1],
        "tools": [{"name": t[2], "description": t[3], "input_schema": {"type": "object"}}],
        "messages": [
            {"role": "user", "content": t[4]},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": t[5], "signature": t[6]},
                    {"type": "tool_use", "id": t[7], "name": t[2], "input": {"arg": t[8]}},
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": t[7], "content": t[9]}],
            },
        ],
    }


def chat_body(t: list[str]) -> dict[str, Any]:
    call = {
        "id": t[7],
        "type": "function",
        "function": {"name": t[2], "arguments": json.dumps({"arg": t[8]})},
    }
    return {
        "model": t[0],
        "max_tokens": 32,
        "tools": [{"type": "function", "function": {"name": t[2], "description": t[3]}}],
        "messages": [
            {"role": "system", "content": t[1]},
            {"role": "user", "content": t[4]},
            {"role": "assistant", "content": t[5], "tool_calls": [call]},
            {"role": "tool", "tool_call_id": t[7], "content": t[9]},
        ],
    }


def responses_body(t: list[str]) -> dict[str, Any]:
    return {
        "model": t[0],
        "max_output_tokens": 32,
        "instructions": t[1],
        "tools": [{"type": "function", "name": t[2], "description": t[3], "parameters": {}}],
        "input": [
            {"role": "user", "content": t[4]},
            {"type": "function_call", "call_id": t[7], "name": t[2], "arguments": t[8]},
            {"type": "function_call_output", "call_id": t[7], "output": t[9]},
        ],
    }


BODIES: dict[Dialect, Callable[[list[str]], dict[str, Any]]] = {
    "anthropic": anthropic_body,
    "openai_chat": chat_body,
    "openai_responses": responses_body,
}


@st.composite
def cases(draw: st.DrawFn) -> Case:
    dialect: Dialect = draw(st.sampled_from(sorted(BODIES)))
    texts = [draw(TEXT) for _ in range(FIELDS)]
    for special in (NOT_UNICODE, HUGE_TEXT):  # each in some field, half of the time
        if draw(st.booleans()):
            texts[draw(st.integers(0, FIELDS - 1))] = draw(special)
    names = ("x-claude-code-session-id", "x-claude-code-agent-id", "x-codex-turn-metadata")
    drawn = {name: draw(HEADER) for name in names}
    headers = {name: value for name, value in drawn.items() if value is not None}
    return Case(dialect, BODIES[dialect](texts), headers)


def send(url: str, token: str, case: Case) -> tuple[int, Any]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        data = json.dumps(case.body).encode()  # lone surrogates become \\udXXX escapes
        connection.putrequest("POST", PATHS[case.dialect])
        connection.putheader("Content-Type", "application/json")
        connection.putheader("Authorization", f"Bearer {token}")
        connection.putheader("Content-Length", str(len(data)))
        for name, value in case.headers.items():
            connection.putheader(name, value)
        connection.endheaders(data)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=cases())
def test_every_answered_request_leaves_a_tree_that_serializes_reloads_and_linearizes(
    served: ServedStack, case: Case
) -> None:
    async def open_session() -> str:
        return served.stack.server.sessions.open("property").token

    token = served.call(open_session)
    status, answer = send(served.stack.server.url, token, case)
    event(f"HTTP {status}: {answer['error']['message'][:24] if status >= 300 else 'answered'}")
    assert status < 500, answer
    if status >= 300:
        assert status == 400, answer
        return

    async def round_trip() -> tuple[int, int, int]:
        tree = (await served.stack.server.close_session(token)).tree
        text = dumps(tree)
        text.encode("utf-8")  # what a file or an HTTP body needs
        again = loads(text)
        lin = linearize(again)
        return len(again.turns), len(lin.samples), len(linearize(tree).samples)

    turns, samples, samples_before = served.call(round_trip)
    assert turns == 1
    assert samples == samples_before == 1
