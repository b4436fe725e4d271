"""OpenAI Responses through the real server, driven by the official ``openai`` SDK as Codex uses it.

Developer messages carry the system prompt; function tools, ``parallel_tool_calls``,
``reasoning.summary = "auto"``, ``include=["reasoning.encrypted_content"]`` and ``store=False``;
the next request echoes the reasoning, function_call and function_call_output items.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest
from server_checks import assert_engine_tokens_trained

from protocol_adapters._server.config import AdapterConfig
from protocol_adapters._server.sessions import SessionLimits
from protocol_adapters._tokenizer import Vocabulary
from protocol_adapters.testing import ScriptedReply
from protocol_adapters.testing.stack import LocalStack, local_stack
from trajectory_tree import LossReason, Reasoning, linearize

TOOLS: list[Any] = [
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
SCRIPT = [
    ScriptedReply(
        reasoning="**Running the tests**\n\nRun the failing test and read the module together.",
        tool_calls=[
            ("exec_command", {"cmd": "python -m pytest -q", "workdir": "/repo"}),
            ("exec_command", {"cmd": "cat mathlib.py"}),
        ],
    ),
    ScriptedReply(reasoning="`add` subtracts.", text="Fixed `add`: it used `-`."),
]
INPUT: list[Any] = [
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
    "tools": TOOLS,
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "reasoning": {"summary": "auto"},
    "include": ["reasoning.encrypted_content"],
    "store": False,
    "prompt_cache_key": "codex-thread-1",
}
# Codex sends no max_output_tokens: the reply may fill the context, which must be the engine's.
CONFIG = AdapterConfig(limits=SessionLimits(context_tokens=32768))


def client(stack: LocalStack, token: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=stack.server.url + "/v1", api_key=token, max_retries=0)


async def ask(api: openai.AsyncOpenAI, items: list[Any], *, stream: bool) -> Any:
    """One model call; returns the ``Response`` (assembled by the SDK when streaming)."""
    if not stream:
        return await api.responses.create(input=items, **CODEX_OPTIONS)
    async with api.responses.stream(input=items, **CODEX_OPTIONS) as events:
        async for _ in events:
            pass
        return await events.get_final_response()


def codex_echo(output: list[Any]) -> list[dict[str, Any]]:
    """What Codex sends back of a response's output: every item, its keys in another order."""
    echoed = []
    for item in output:
        dumped = item.model_dump(exclude_none=True)
        echoed.append(dict(reversed(list(dumped.items()))))
    return echoed


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_codex_session_trains_exactly_engine_tokens(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary, stream: bool
) -> None:
    async with local_stack(
        SCRIPT, tokenizer_cache=tokenizer_cache, vocabulary=qwen_vocabulary, config=CONFIG
    ) as stack:
        session = stack.server.sessions.open("codex-e2e")
        api = client(stack, session.token)
        items = list(INPUT)
        first = await ask(api, items, stream=stream)
        assert first.status == "completed"
        kinds = [item.type for item in first.output]
        assert kinds == ["reasoning", "function_call", "function_call"]
        reasoning = first.output[0]
        assert reasoning.encrypted_content, "include=reasoning.encrypted_content was asked for"
        assert reasoning.summary[0].text == SCRIPT[0].reasoning
        calls = first.output[1:]
        assert [json.loads(c.arguments) for c in calls] == [
            {"cmd": "python -m pytest -q", "workdir": "/repo"},
            {"cmd": "cat mathlib.py"},
        ]
        items += codex_echo(first.output)
        items += [
            {
                "type": "function_call_output",
                "call_id": c.call_id,
                "output": f"Process exited with code 0\nOutput:\nran {c.call_id}\n",
            }
            for c in calls
        ]
        second = await ask(api, items, stream=stream)
        assert second.status == "completed"
        assert [item.type for item in second.output] == ["reasoning", "message"]
        assert second.output_text == "Fixed `add`: it used `-`."
        await api.close()

        tree = session.tree
        assert len(tree.turns) == 2
        for turn, response, sent in zip(
            tree.turns, (first, second), stack.double.requests, strict=True
        ):
            assert turn.meta.request_id == sent.rid
            assert response.usage.input_tokens == len(sent.input_ids)
            assert response.usage.output_tokens == turn.output_length
            assert response.usage.total_tokens == len(sent.input_ids) + turn.output_length
        # The echoed reasoning item routed onto the recorded turn; the tree kept what the model
        # produced, and the second prompt starts with the first prompt and reply verbatim.
        echoed = tree.request_messages(tree.turns[1])
        assert isinstance(echoed[-3].content[0], Reasoning)
        first_ids = list(tree.prompt_ids(tree.turns[0])) + list(tree.output_ids(tree.turns[0]))
        assert list(stack.double.requests[1].input_ids[: len(first_ids)]) == first_ids
        lin = linearize(tree)
        assert len(lin.samples) == 1, "the echo must continue the same branch"
        assert_engine_tokens_trained(stack, tree, lin)
        reasons = {s.reason for s in lin.samples[0].spans}
        assert LossReason.TOOL_OUTPUT in reasons
        assert LossReason.RERENDERED_HISTORY not in reasons
        assert all(t.rerendered is None for t in tree.turns)
        assert stack.renderer.stats.full_renders == 0
        assert lin.exclusions == ()
