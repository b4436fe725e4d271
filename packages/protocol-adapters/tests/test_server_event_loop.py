"""Many sessions at once never stall the event loop the adapter shares with a node's episodes.

48 sessions (the three dialects, streamed and not, through the official SDKs) run 6 turns each
with growing histories (a ~25 KB tool result per turn), and 2 long ones 12 Claude Code agents
each (a main agent and sub-agents, on branches of their own) of 3 turns of ~80 KB (~1M tokens,
a ~9 MB tree), through the real server and the engine double; they are opened and closed over
the admin API, which answers each close with the whole tree. The server and the double run on
the loop under test, in asyncio's debug mode with ``slow_callback_duration`` at 50 ms; the
clients run in a process of their own, as agents do.

Debug mode times a callback by the wall clock, which also counts the loop thread waiting for a
CPU on a busy machine: that is the scheduler's doing, not ours. So each callback's own CPU time
(the loop thread's) is measured too, and its wait for a CPU (the kernel's run delay): a callback
is ours to fix when it *used* 50 ms, or when it was blocked for a second otherwise (a worker
thread holding the GIL that long). Blocks of a few hundred ms do happen on a loaded 2-core VM
without any of that (GIL handoffs to a thread that must first get a CPU, the hypervisor's
steal time). Garbage collections are timed apart and left out of all of it (see
:func:`collections_timed`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import multiprocessing
import os
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import openai
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from protocol_adapters.server.config import AdapterConfig, AdminConfig
from protocol_adapters.testing import ScriptedReply
from protocol_adapters.testing.stack import local_stack
from protocol_adapters.tokenizer import Vocabulary

from .server_clients import Dialect

SLOW_CALLBACK = 0.05
GROSS_STALL = 1.0
SESSIONS = 48
TURNS = 6
WORDS_PER_RESULT = 2500
LONG_SESSIONS = 2
LONG_AGENTS = 12
LONG_TURNS = 3
LONG_WORDS_PER_RESULT = 10000
ADMIN_TOKEN = "admin-secret-for-the-loop-test"
KINDS: tuple[tuple[Dialect, bool], ...] = tuple(
    (dialect, stream)
    for dialect in ("anthropic", "openai_chat", "openai_responses")
    for stream in (True, False)
)
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"command": {"type": "string"}},
    "required": ["command"],
}
WORDS = (
    "def",
    "class",
    "return",
    "import",
    "self",
    "value",
    "error",
    "test",
    "assert",
    "file",
    "line",
    "path",
    "node",
    "tree",
    "token",
    "session",
    "branch",
    "sample",
    "reply",
    "render",
    "engine",
    "stream",
    "chunk",
    "logprob",
    "prompt",
    "context",
)


def reply(input_ids: object) -> ScriptedReply:
    del input_ids
    return ScriptedReply(
        text="Reading the next file.",
        reasoning="The tests point at the parser.",
        tool_calls=[("Bash", {"command": "cat src/module.py"})],
    )


@dataclass(frozen=True, slots=True)
class Plan:
    """One session's shape: its dialect, streamed or not, turns and tool output size."""

    index: int
    turns: int = TURNS
    words: int = WORDS_PER_RESULT
    agents: int = 1
    """Anthropic only: agents of one session at once, each on a branch of its own."""

    @property
    def dialect(self) -> Dialect:
        return KINDS[self.index % len(KINDS)][0]

    @property
    def stream(self) -> bool:
        return KINDS[self.index % len(KINDS)][1]

    def tool_output(self, turn: int, agent: int = 0) -> str:
        """A different output every turn, so every render tokenizes new text."""
        rng = random.Random(f"{self.index} {agent} {turn}")
        return " ".join(rng.choice(WORDS) + str(rng.randrange(100)) for _ in range(self.words))


async def anthropic_turns(client: anthropic.AsyncAnthropic, plan: Plan) -> None:
    await asyncio.gather(*(anthropic_agent(client, plan, agent) for agent in range(plan.agents)))


async def anthropic_agent(client: anthropic.AsyncAnthropic, plan: Plan, agent: int) -> None:
    tools: Any = [{"name": "Bash", "description": "Run a command", "input_schema": SCHEMA}]
    system = f"You are agent {agent} of session {plan.index}."
    messages: list[Any] = [{"role": "user", "content": f"Fix issue {plan.index}."}]
    for turn in range(plan.turns):
        message: anthropic.types.Message
        if plan.stream:
            async with client.messages.stream(
                model="policy", max_tokens=256, system=system, messages=messages, tools=tools
            ) as events:
                message = await events.get_final_message()
        else:
            message = await client.messages.create(
                model="policy", max_tokens=256, system=system, messages=messages, tools=tools
            )
        call = next(block for block in message.content if block.type == "tool_use")
        messages.append({"role": "assistant", "content": [b.model_dump() for b in message.content]})
        output = plan.tool_output(turn, agent)
        result = {"type": "tool_result", "tool_use_id": call.id, "content": output}
        messages.append({"role": "user", "content": [result]})


async def chat_turns(client: openai.AsyncOpenAI, plan: Plan) -> None:
    tools: Any = [{"type": "function", "function": {"name": "Bash", "parameters": SCHEMA}}]
    messages: list[Any] = [{"role": "user", "content": f"Fix issue {plan.index}."}]
    for turn in range(plan.turns):
        completion: ChatCompletion
        if plan.stream:
            async with client.chat.completions.stream(
                model="policy", messages=messages, tools=tools, max_tokens=256
            ) as events:
                completion = await events.get_final_completion()
        else:
            completion = await client.chat.completions.create(
                model="policy", messages=messages, tools=tools, max_tokens=256
            )
        message = completion.choices[0].message
        assert message.tool_calls
        call = message.tool_calls[0]
        messages.append(message.model_dump(exclude_none=True))
        messages.append(
            {"role": "tool", "tool_call_id": call.id, "content": plan.tool_output(turn)}
        )


async def responses_turns(client: openai.AsyncOpenAI, plan: Plan) -> None:
    tools: Any = [{"type": "function", "name": "Bash", "parameters": SCHEMA, "strict": False}]
    items: list[Any] = [{"role": "user", "content": f"Fix issue {plan.index}."}]
    for turn in range(plan.turns):
        response: Response
        if plan.stream:
            async with client.responses.stream(
                model="policy", input=items, tools=tools, max_output_tokens=256
            ) as events:
                response = await events.get_final_response()
        else:
            response = await client.responses.create(
                model="policy", input=items, tools=tools, max_output_tokens=256
            )
        items.extend(item.model_dump(exclude_none=True) for item in response.output)
        call = next(item for item in response.output if item.type == "function_call")
        items.append(
            {
                "type": "function_call_output",
                "call_id": call.call_id,
                "output": plan.tool_output(turn),
            }
        )


class Admin:
    """The admin API, as a rollout driver in another process uses it."""

    def __init__(self, http: aiohttp.ClientSession, url: str) -> None:
        self.http = http
        self.url = url
        self.headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

    async def open(self, session_id: str) -> str:
        async with self.http.post(
            self.url + "/admin/sessions", json={"session_id": session_id}, headers=self.headers
        ) as response:
            assert response.status == 200, await response.text()
            token: str = (await response.json())["token"]
            return token

    async def close(self, token: str) -> dict[str, Any]:
        async with self.http.delete(
            f"{self.url}/admin/sessions/{token}", headers=self.headers
        ) as response:
            assert response.status == 200, await response.text()
            tree: dict[str, Any] = json.loads(await response.read())
            return tree


async def episode(url: str, admin: Admin, plan: Plan) -> None:
    """One session's turns, closed and its tree checked."""
    token = await admin.open(f"episode-{plan.index}")
    if plan.dialect == "anthropic":
        async with anthropic.AsyncAnthropic(base_url=url, api_key=token, max_retries=0) as claude:
            await anthropic_turns(claude, plan)
    else:
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key=token, max_retries=0) as client:
            turns = chat_turns if plan.dialect == "openai_chat" else responses_turns
            await turns(client, plan)
    tree = await admin.close(token)
    recorded = [node["turn"] for node in tree["nodes"] if "turn" in node]
    assert [turn["finish_reason"] for turn in recorded] == ["stop"] * plan.turns * plan.agents


def agents(url: str, admin_url: str, plans: list[Plan]) -> None:
    """Every session's client, in a process of their own (as agents are on a node: the SDKs'
    own work, each call re-walking its whole history, is not the adapter's)."""

    async def run_all() -> None:
        async with aiohttp.ClientSession() as http:
            admin = Admin(http, admin_url)
            await asyncio.gather(*(episode(url, admin, plan) for plan in plans))

    asyncio.run(run_all())


@dataclass(slots=True)
class Collections:
    """Garbage collections so far: how many, how long (on any thread: a pass holds the GIL, so
    it stalls the loop wherever it runs), and the loop thread's CPU time in them."""

    count: int = 0
    wall: float = 0.0
    loop_cpu: float = 0.0
    longest: float = 0.0


@contextlib.contextmanager
def collections_timed() -> Iterator[Collections]:
    """Times the cyclic garbage collector's passes.

    A full collection walks every container object of the process (here mostly the test's: the
    clients' histories, every request the engine double keeps) and stalls whatever callback it
    lands in. That is the process's heap, not the callback's work: the loop test subtracts it.
    """
    loop_thread = threading.get_ident()
    totals = Collections()
    started: list[float] = [0.0, 0.0]

    def timer(phase: str, info: dict[str, int]) -> None:
        del info
        if phase == "start":
            started[:] = [time.perf_counter(), time.thread_time()]
            return
        wall = time.perf_counter() - started[0]
        totals.count += 1
        totals.wall += wall
        totals.longest = max(totals.longest, wall)
        if threading.get_ident() == loop_thread:
            totals.loop_cpu += time.thread_time() - started[1]

    gc.callbacks.append(timer)
    try:
        yield totals
    finally:
        gc.callbacks.remove(timer)


@dataclass(frozen=True, slots=True)
class Slow:
    """A callback that held the loop longer than SLOW_CALLBACK, garbage collections left out:
    ``used`` of the loop thread's CPU, ``queued`` waiting for a CPU (the machine's load), and
    the rest ``blocked`` (waiting for the GIL another thread held, or on a syscall)."""

    wall: float
    used: float
    queued: float
    callback: str

    @property
    def blocked(self) -> float:
        return self.wall - self.used - self.queued


class RunQueueWait:
    """This thread's time spent runnable but waiting for a CPU (``schedstat``'s run delay), in
    seconds; 0 where the kernel does not keep it."""

    def __init__(self) -> None:
        path = f"/proc/self/task/{threading.get_native_id()}/schedstat"
        self._fd = os.open(path, os.O_RDONLY) if os.path.exists(path) else None

    def __call__(self) -> float:
        if self._fd is None:
            return 0.0
        return int(os.pread(self._fd, 64, 0).split()[1]) / 1e9

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)


@contextlib.contextmanager
def timed_callbacks() -> Iterator[list[Slow]]:
    """Every callback of this thread's loop slower than SLOW_CALLBACK (see :class:`Slow`)."""
    original = asyncio.events.Handle._run
    slow: list[Slow] = []
    loop_thread = threading.get_ident()
    queued = RunQueueWait()

    with collections_timed() as collected:

        def run(handle: Any) -> None:
            if threading.get_ident() != loop_thread:
                original(handle)
                return
            wall, cpu, waited = time.perf_counter(), time.thread_time(), queued()
            gc_wall, gc_cpu = collected.wall, collected.loop_cpu
            try:
                original(handle)
            finally:
                elapsed = time.perf_counter() - wall - (collected.wall - gc_wall)
                if elapsed > SLOW_CALLBACK:
                    used = time.thread_time() - cpu - (collected.loop_cpu - gc_cpu)
                    slow.append(Slow(elapsed, used, queued() - waited, repr(handle)[:300]))

        asyncio.events.Handle._run = run  # type: ignore[method-assign,assignment]
        try:
            yield slow
        finally:
            asyncio.events.Handle._run = original  # type: ignore[method-assign]
            queued.close()


async def test_many_sessions_never_stall_the_loop(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    config = AdapterConfig(admin=AdminConfig(ADMIN_TOKEN))
    async with (
        local_stack(
            reply,
            tokenizer_cache=tokenizer_cache,
            vocabulary=qwen_vocabulary,
            config=config,
            engine_context_length=131072,
        ) as stack,
    ):
        assert stack.server.admin_url is not None
        plans = [Plan(i) for i in range(SESSIONS)]
        plans += [  # KINDS[0] and KINDS[1]: Anthropic, streamed and not
            Plan(SESSIONS + i, LONG_TURNS, LONG_WORDS_PER_RESULT, LONG_AGENTS)
            for i in range(LONG_SESSIONS)
        ]
        loop = asyncio.get_running_loop()
        loop.set_debug(True)
        loop.slow_callback_duration = SLOW_CALLBACK
        try:
            with timed_callbacks() as slow:
                clients = multiprocessing.get_context("spawn").Process(
                    target=agents, args=(stack.server.url, stack.server.admin_url, plans)
                )
                clients.start()
                await asyncio.to_thread(clients.join)
        finally:
            loop.set_debug(False)
    assert clients.exitcode == 0, "a client failed (its traceback is above)"
    for entry in sorted(slow, key=lambda entry: -entry.wall)[:20]:
        print(
            f"{entry.wall * 1000:7.1f} ms: used {entry.used * 1000:5.1f}, queued "
            f"{entry.queued * 1000:5.1f}, blocked {entry.blocked * 1000:5.1f}  {entry.callback}"
        )
    ours = [entry for entry in slow if entry.used > SLOW_CALLBACK or entry.blocked > GROSS_STALL]
    assert ours == []
