"""OpenAI Chat Completions through the real server, driven by the official ``openai`` SDK.

A two-turn tool session with two parallel tool calls in one reply, tool results as ``role:
tool`` messages and the assistant message echoed back exactly as the SDK hands it over.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest
from server_checks import assert_engine_tokens_trained

from protocol_adapters._tokenizer import Vocabulary
from protocol_adapters.testing import ScriptedReply
from protocol_adapters.testing.stack import LocalStack, local_stack
from trajectory_tree import LossReason, linearize

TOOLS: list[Any] = [
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
SCRIPT = [
    ScriptedReply(
        reasoning="Two independent reads; do both at once.",
        text="Reading both files.",
        tool_calls=[
            ("exec_command", {"cmd": "cat a.py", "workdir": "/repo"}),
            ("exec_command", {"cmd": "cat b.py"}),
        ],
    ),
    ScriptedReply(text="a.py imports b.py. Done."),
]


def client(stack: LocalStack, token: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=stack.server.url + "/v1", api_key=token, max_retries=0)


async def ask(api: openai.AsyncOpenAI, messages: list[Any], *, stream: bool) -> Any:
    """One model call; returns the ``ChatCompletion`` (assembled by the SDK when streaming)."""
    if not stream:
        return await api.chat.completions.create(
            model="policy", messages=messages, tools=TOOLS, max_tokens=512
        )
    async with api.chat.completions.stream(
        model="policy",
        messages=messages,
        tools=TOOLS,
        max_tokens=512,
        stream_options={"include_usage": True},
    ) as events:
        async for _ in events:
            pass
        return await events.get_final_completion()


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_parallel_tool_calls_session_trains_exactly_engine_tokens(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary, stream: bool
) -> None:
    async with local_stack(
        SCRIPT, tokenizer_cache=tokenizer_cache, vocabulary=qwen_vocabulary
    ) as stack:
        session = stack.server.sessions.open("chat-e2e")
        api = client(stack, session.token)
        messages: list[Any] = [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "How do a.py and b.py relate?"},
        ]
        first = await ask(api, messages, stream=stream)
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls"
        calls = choice.message.tool_calls
        assert [json.loads(c.function.arguments) for c in calls] == [
            {"cmd": "cat a.py", "workdir": "/repo"},
            {"cmd": "cat b.py"},
        ]
        assert len({c.id for c in calls}) == 2
        assert choice.message.content == "Reading both files."
        # The echo: the assistant message exactly as the SDK gives it, then one tool message
        # per call.
        messages.append(choice.message.model_dump(exclude_none=True))
        messages += [
            {"role": "tool", "tool_call_id": c.id, "content": f"contents of {c.function.name}"}
            for c in calls
        ]
        second = await ask(api, messages, stream=stream)
        assert second.choices[0].finish_reason == "stop"
        assert second.choices[0].message.content == "a.py imports b.py. Done."
        await api.close()

        tree = session.tree
        assert len(tree.turns) == 2
        for turn, completion, sent in zip(
            tree.turns, (first, second), stack.double.requests, strict=True
        ):
            assert turn.meta.request_id == sent.rid
            assert completion.usage.prompt_tokens == len(sent.input_ids)
            assert completion.usage.completion_tokens == turn.output_length
            assert completion.usage.total_tokens == len(sent.input_ids) + turn.output_length
        assert len(tree.turns[0].reply.tool_calls) == 2
        assert stack.double.requests[1].input_ids[: tree.turns[0].prompt_length] == tuple(
            stack.double.requests[0].input_ids
        )
        lin = linearize(tree)
        assert len(lin.samples) == 1, "the echo must continue the same branch"
        assert_engine_tokens_trained(stack, tree, lin)
        reasons = {s.reason for s in lin.samples[0].spans}
        assert LossReason.TOOL_OUTPUT in reasons
        assert LossReason.RERENDERED_HISTORY not in reasons
        assert all(t.rerendered is None for t in tree.turns)
        assert stack.renderer.stats.full_renders == 0
        assert lin.exclusions == ()


@pytest.mark.parametrize("after", [" ", "\nI will wait for the output."], ids=["space", "text"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_a_reply_with_text_after_its_call_routes_back_when_echoed(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary, stream: bool, after: str
) -> None:
    """Chat's wire has no order between content and tool calls: text the model wrote after a
    call comes back joined with the rest of the content. The tree records the reply as the
    client holds it, so the echo routes back and the episode stays one sample."""
    script = [
        ScriptedReply(
            text="Looking.", tool_calls=[("exec_command", {"cmd": "ls"})], after_calls=after
        ),
        ScriptedReply(text="Done."),
    ]
    async with local_stack(
        script, tokenizer_cache=tokenizer_cache, vocabulary=qwen_vocabulary
    ) as stack:
        session = stack.server.sessions.open("chat-text-after-call")
        api = client(stack, session.token)
        messages: list[Any] = [{"role": "user", "content": "List the files."}]
        first = await ask(api, messages, stream=stream)
        message = first.choices[0].message
        assert message.content == "Looking." + after.lstrip("\n")  # all its text, joined
        messages.append(message.model_dump(exclude_none=True))
        call = message.tool_calls[0]
        messages.append({"role": "tool", "tool_call_id": call.id, "content": "a.py"})
        second = await ask(api, messages, stream=stream)
        assert second.choices[0].message.content == "Done."
        await api.close()
        lin = linearize(session.tree)
        assert len(lin.samples) == 1, "the echo must continue the same branch"
        assert_engine_tokens_trained(stack, session.tree, lin)
        assert all(t.rerendered is None for t in session.tree.turns)
