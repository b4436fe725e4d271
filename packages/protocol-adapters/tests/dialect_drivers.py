"""The three dialects driven the way their real clients drive them, through the official SDKs.

One driver per dialect holds one conversation, sends it (streamed or not) and reads each reply
back into the facts every dialect shares (:class:`Reply`), so ``dialects/test_contract.py`` can
state once what each of them must do. What only one client does stays in its driver: Claude Code
answers parallel calls in completion order with ``cache_control`` on the last result, a Chat
Completions agent echoes the assistant message as the SDK hands it over, Codex echoes every
output item with its keys in another order. Reading a reply checks what only its dialect's wire
carries (a Responses reasoning item's encrypted content, asked for with ``include``).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import anthropic
import openai
from openai.types.chat import ChatCompletion
from openai.types.responses import Response
from server_clients import Dialect, anthropic_client, openai_client

from protocol_adapters._server.config import AdapterConfig
from protocol_adapters._server.sessions import SessionLimits
from protocol_adapters.testing import ScriptedReply
from protocol_adapters.testing.stack import LocalStack


@dataclass(frozen=True, slots=True)
class Call:
    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Reply:
    """A reply as its client read it, in terms every dialect has."""

    parts: list[str]
    """``reasoning``, ``text`` and ``call``, one per block or item, in the order of the wire
    (Chat's message has no order: its parts in the one order it can express)."""
    reasoning: list[str]
    text: str
    calls: list[Call]
    stop: str
    """Why the reply ended, in the dialect's own word."""
    input_tokens: int
    output_tokens: int
    total_tokens: int | None
    """``None`` where the dialect reports no total (Anthropic)."""


def parts_of(reply: ScriptedReply) -> list[str]:
    """The parts a scripted reply reads back as, in generation order."""
    reasoning = ["reasoning"] if reply.reasoning is not None else []
    text = ["text"] if reply.text else []
    return [*reasoning, *text, *(["call"] * len(reply.tool_calls))]


class Driver(ABC):
    """One conversation in one dialect, as its client holds it (``async with``)."""

    dialect: ClassVar[Dialect]
    session: ClassVar[str]
    """The session id the contract's tool round trip opens."""
    script: ClassVar[tuple[ScriptedReply, ScriptedReply]]
    """The engine's two replies of a tool round trip: reasoning and two parallel calls, then an
    answer after the results."""
    stops: ClassVar[tuple[str, str]]
    """The dialect's stop word after calls, and after an answer."""
    config: ClassVar[AdapterConfig | None] = None

    @abstractmethod
    def __init__(self, stack: LocalStack, token: str) -> None:
        """A client of ``stack``'s server for the session ``token`` names."""

    @abstractmethod
    async def ask(self, *, stream: bool) -> Reply:
        """Send the conversation so far; the reply, assembled by the SDK when streamed."""

    @abstractmethod
    def answer(self) -> None:
        """Echo the last reply as the client does, and answer each of its calls."""

    @abstractmethod
    async def close(self) -> None: ...

    async def __aenter__(self) -> Driver:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


# -- Anthropic Messages, as Claude Code sends it -----------------------------------------------

ANTHROPIC_TOOLS: list[Any] = [
    {
        "name": "Bash",
        "description": "Run a shell command",
        "input_schema": {
            "type": "object",
            "properties": {"command": {"type": "string"}, "timeout": {"type": "number"}},
            "required": ["command"],
        },
    }
]


class AnthropicDriver(Driver):
    dialect = "anthropic"
    session = "anthropic-e2e"
    script = (
        ScriptedReply(
            reasoning="I should look at the files.",
            text="Let me list them.",
            tool_calls=[
                ("Bash", {"command": "ls -la", "timeout": 60000.0}),
                ("Bash", {"command": "pwd"}),
            ],
        ),
        ScriptedReply(text="There are two files. Done."),
    )
    stops = ("tool_use", "end_turn")

    def __init__(self, stack: LocalStack, token: str) -> None:
        self.api = anthropic_client(stack, token)
        self.messages: list[Any] = [{"role": "user", "content": "What is here?"}]
        self.last: anthropic.types.Message | None = None

    async def ask(self, *, stream: bool) -> Reply:
        options: dict[str, Any] = {
            "model": "policy",
            "max_tokens": 1024,
            "system": "You are a coding agent.",
            "messages": self.messages,
            "tools": ANTHROPIC_TOOLS,
        }
        message: anthropic.types.Message
        if stream:
            async with self.api.messages.stream(**options) as events:
                message = await events.get_final_message()
        else:
            message = await self.api.messages.create(**options)
        self.last = message
        parts: list[str] = []
        reasoning: list[str] = []
        calls: list[Call] = []
        for block in message.content:
            if block.type == "thinking":
                parts.append("reasoning")
                reasoning.append(block.thinking)
            elif block.type == "text":
                parts.append("text")
            elif block.type == "tool_use":
                parts.append("call")
                calls.append(Call(block.id, block.name, dict(block.input)))
            else:
                parts.append(block.type)
        return Reply(
            parts,
            reasoning,
            "".join(b.text for b in message.content if b.type == "text"),
            calls,
            str(message.stop_reason),
            message.usage.input_tokens,
            message.usage.output_tokens,
            None,
        )

    def answer(self) -> None:
        assert self.last is not None
        # Echo as Claude Code does: the whole reply back, tool inputs re-serialized by the client.
        echo = [b.model_dump() for b in self.last.content]
        self.messages.append({"role": "assistant", "content": echo})
        uses = [b for b in self.last.content if b.type == "tool_use"]
        # Parallel results come back in completion order (reversed here); the last one carries
        # cache_control.
        results: list[dict[str, object]] = [
            {"type": "tool_result", "tool_use_id": u.id, "content": f"output of {u.input}"}
            for u in reversed(uses)
        ]
        results[-1]["cache_control"] = {"type": "ephemeral"}
        self.messages.append({"role": "user", "content": results})

    async def close(self) -> None:
        await self.api.close()


# -- OpenAI Chat Completions, as a coding agent sends it ---------------------------------------

CHAT_TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "exec_command",
            "description": "Run a shell command",
            "parameters": {
                "type": "object",
                "properties": {"cmd": {"type": "string"}, "workdir": {"type": "string"}},
                "required": ["cmd"],
            },
        },
    }
]


async def chat_completion(
    api: openai.AsyncOpenAI, messages: list[Any], *, stream: bool
) -> ChatCompletion:
    """One model call with :data:`CHAT_TOOLS`; the completion (assembled by the SDK when
    streaming, usage included)."""
    if not stream:
        return await api.chat.completions.create(
            model="policy", messages=messages, tools=CHAT_TOOLS, max_tokens=512
        )
    async with api.chat.completions.stream(
        model="policy",
        messages=messages,
        tools=CHAT_TOOLS,
        max_tokens=512,
        stream_options={"include_usage": True},
    ) as events:
        async for _ in events:
            pass
        return await events.get_final_completion()


class ChatDriver(Driver):
    """Two parallel tool calls in one reply, tool results as ``role: tool`` messages, the
    assistant message echoed back exactly as the SDK hands it over."""

    dialect = "openai_chat"
    session = "chat-e2e"
    script = (
        ScriptedReply(
            reasoning="Two independent reads; do both at once.",
            text="Reading both files.",
            tool_calls=[
                ("exec_command", {"cmd": "cat a.py", "workdir": "/repo"}),
                ("exec_command", {"cmd": "cat b.py"}),
            ],
        ),
        ScriptedReply(text="a.py imports b.py. Done."),
    )
    stops = ("tool_calls", "stop")

    def __init__(self, stack: LocalStack, token: str) -> None:
        self.api = openai_client(stack, token)
        self.messages: list[Any] = [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "How do a.py and b.py relate?"},
        ]
        self.last: ChatCompletion | None = None

    async def ask(self, *, stream: bool) -> Reply:
        completion = await chat_completion(self.api, self.messages, stream=stream)
        self.last = completion
        choice = completion.choices[0]
        message = choice.message
        reasoning = (message.model_extra or {}).get("reasoning_content")
        calls = []
        for call in message.tool_calls or []:
            assert call.type == "function"
            calls.append(Call(call.id, call.function.name, json.loads(call.function.arguments)))
        usage = completion.usage
        assert usage is not None
        return Reply(
            [*(["reasoning"] if reasoning else []), *(["text"] if message.content else [])]
            + ["call"] * len(calls),
            [reasoning] if reasoning else [],
            message.content or "",
            calls,
            choice.finish_reason,
            usage.prompt_tokens,
            usage.completion_tokens,
            usage.total_tokens,
        )

    def answer(self) -> None:
        assert self.last is not None
        message = self.last.choices[0].message
        # The echo: the assistant message exactly as the SDK gives it, then one tool message
        # per call.
        self.messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or []:
            assert call.type == "function"
            self.messages.append(
                {
                    "role": "tool",
                    "tool_call_id": call.id,
                    "content": f"contents of {call.function.name}",
                }
            )

    async def close(self) -> None:
        await self.api.close()


# -- OpenAI Responses, as Codex sends it -------------------------------------------------------

RESPONSES_TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "exec_command",
        "description": "Runs a command in a PTY.",
        "strict": False,
        "parameters": {
            "type": "object",
            "properties": {"cmd": {"type": "string"}, "workdir": {"type": "string"}},
            "required": ["cmd"],
            "additionalProperties": False,
        },
    }
]
CODEX_INPUT: list[Any] = [
    {
        "type": "message",
        "role": "developer",
        "content": [{"type": "input_text", "text": "You are Codex, a coding agent."}],
    },
    {
        "type": "message",
        "role": "user",
        "content": [
            {"type": "input_text", "text": "<environment_context>/repo</environment_context>"}
        ],
    },
    {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "Fix the failing test."}],
    },
]
CODEX_OPTIONS: dict[str, Any] = {
    "model": "policy",
    "tools": RESPONSES_TOOLS,
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "reasoning": {"summary": "auto"},
    "include": ["reasoning.encrypted_content"],
    "store": False,
    "prompt_cache_key": "codex-thread-1",
}


def codex_echo(output: list[Any]) -> list[dict[str, Any]]:
    """What Codex sends back of a response's output: every item, its keys in another order."""
    echoed = []
    for item in output:
        dumped = item.model_dump(exclude_none=True)
        echoed.append(dict(reversed(list(dumped.items()))))
    return echoed


class ResponsesDriver(Driver):
    """Developer messages carry the system prompt; function tools, ``parallel_tool_calls``,
    ``reasoning.summary = "auto"``, ``include=["reasoning.encrypted_content"]`` and
    ``store=False``; the next request echoes the reasoning, function_call and
    function_call_output items."""

    dialect = "openai_responses"
    session = "codex-e2e"
    script = (
        ScriptedReply(
            reasoning="**Running the tests**\n\nRun the failing test and read the module together.",
            tool_calls=[
                ("exec_command", {"cmd": "python -m pytest -q", "workdir": "/repo"}),
                ("exec_command", {"cmd": "cat mathlib.py"}),
            ],
        ),
        ScriptedReply(reasoning="`add` subtracts.", text="Fixed `add`: it used `-`."),
    )
    stops = ("completed", "completed")
    # Codex sends no max_output_tokens: the reply may fill the context, which must be the engine's.
    config = AdapterConfig(limits=SessionLimits(context_tokens=32768))

    def __init__(self, stack: LocalStack, token: str) -> None:
        self.api = openai_client(stack, token)
        self.items: list[Any] = list(CODEX_INPUT)
        self.last: Response | None = None

    async def ask(self, *, stream: bool) -> Reply:
        response: Response
        if stream:
            async with self.api.responses.stream(input=self.items, **CODEX_OPTIONS) as events:
                async for _ in events:
                    pass
                response = await events.get_final_response()
        else:
            response = await self.api.responses.create(input=self.items, **CODEX_OPTIONS)
        self.last = response
        parts: list[str] = []
        reasoning: list[str] = []
        calls: list[Call] = []
        for item in response.output:
            if item.type == "reasoning":
                assert item.encrypted_content, "include=reasoning.encrypted_content was asked for"
                parts.append("reasoning")
                reasoning += [summary.text for summary in item.summary]
            elif item.type == "message":
                parts.append("text")
            elif item.type == "function_call":
                parts.append("call")
                calls.append(Call(item.call_id, item.name, json.loads(item.arguments)))
            else:
                parts.append(item.type)
        usage = response.usage
        assert usage is not None
        return Reply(
            parts,
            reasoning,
            response.output_text,
            calls,
            str(response.status),
            usage.input_tokens,
            usage.output_tokens,
            usage.total_tokens,
        )

    def answer(self) -> None:
        assert self.last is not None
        self.items += codex_echo(self.last.output)
        self.items += [
            {
                "type": "function_call_output",
                "call_id": item.call_id,
                "output": f"Process exited with code 0\nOutput:\nran {item.call_id}\n",
            }
            for item in self.last.output
            if item.type == "function_call"
        ]

    async def close(self) -> None:
        await self.api.close()


DRIVERS: dict[Dialect, type[Driver]] = {
    "anthropic": AnthropicDriver,
    "openai_chat": ChatDriver,
    "openai_responses": ResponsesDriver,
}
