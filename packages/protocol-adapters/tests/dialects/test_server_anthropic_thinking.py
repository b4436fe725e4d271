"""Anthropic Messages with thinking through the real server: the reply's thinking block carries a
signature, Claude Code echoes it back (thinking kept in later turns), and the echo continues
the recorded branch with the model's own reasoning tokens, never a re-rendering of them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import pytest
from server_checks import assert_engine_tokens_trained

from protocol_adapters._tokenizer import Vocabulary
from protocol_adapters.testing import ScriptedReply
from protocol_adapters.testing.stack import local_stack
from trajectory_tree import LossReason, Reasoning, linearize

TOOLS: list[Any] = [
    {
        "name": "Read",
        "description": "Read a file",
        "input_schema": {
            "type": "object",
            "properties": {"file_path": {"type": "string"}},
            "required": ["file_path"],
        },
    }
]
SCRIPT = [
    ScriptedReply(
        reasoning="The bug is probably in setup.py.\nRead it first.",
        tool_calls=[("Read", {"file_path": "/repo/setup.py"})],
    ),
    ScriptedReply(reasoning="It pins an old version.", text="Bump the pin."),
]


async def ask(api: anthropic.AsyncAnthropic, messages: list[Any], *, stream: bool) -> Any:
    options: dict[str, Any] = {
        "model": "policy",
        "max_tokens": 2048,
        "system": [{"type": "text", "text": "You are Claude Code."}],
        "messages": messages,
        "tools": TOOLS,
        "thinking": {"type": "adaptive"},
    }
    if not stream:
        return await api.messages.create(**options)
    async with api.messages.stream(**options) as events:
        return await events.get_final_message()


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("signature", ["verbatim", "rewritten"])
async def test_thinking_echoed_with_signature_continues_the_branch(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary, stream: bool, signature: str
) -> None:
    async with local_stack(
        SCRIPT, tokenizer_cache=tokenizer_cache, vocabulary=qwen_vocabulary
    ) as stack:
        session = stack.server.sessions.open("thinking")
        api = anthropic.AsyncAnthropic(
            base_url=stack.server.url, api_key=session.token, max_retries=0
        )
        messages: list[Any] = [{"role": "user", "content": "Why does install fail?"}]
        first = await ask(api, messages, stream=stream)
        thinking, use = first.content
        assert thinking.type == "thinking"
        assert thinking.thinking == SCRIPT[0].reasoning
        assert thinking.signature
        assert use.type == "tool_use"
        echo = [block.model_dump() for block in first.content]
        if signature == "rewritten":  # a client may re-sign or mangle it: routing ignores it
            echo[0]["signature"] = "client-rewritten-" + echo[0]["signature"][::-1]
        messages.append({"role": "assistant", "content": echo})
        messages.append(
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "pin==1.0"}],
            }
        )
        second = await ask(api, messages, stream=stream)
        assert [b.type for b in second.content] == ["thinking", "text"]
        assert second.content[0].signature
        assert second.content[0].signature != thinking.signature
        await api.close()

        tree = session.tree
        assert len(tree.turns) == 2
        [echoed] = [m for m in tree.request_messages(tree.turns[1]) if m.role == "assistant"]
        assert isinstance(echoed.content[0], Reasoning)
        assert echoed.content[0].text == SCRIPT[0].reasoning
        # The second prompt is the first prompt and the first reply's ids, verbatim: the thinking
        # the model generated is neither dropped nor re-rendered.
        first_turn = list(tree.prompt_ids(tree.turns[0])) + list(tree.output_ids(tree.turns[0]))
        assert list(stack.double.requests[1].input_ids[: len(first_turn)]) == first_turn
        assert [second.usage.input_tokens, second.usage.output_tokens] == [
            len(stack.double.requests[1].input_ids),
            tree.turns[1].output_length,
        ]
        lin = linearize(tree)
        assert len(lin.samples) == 1
        assert_engine_tokens_trained(stack, tree, lin)
        assert LossReason.RERENDERED_HISTORY not in {s.reason for s in lin.samples[0].spans}
        assert stack.renderer.stats.full_renders == 0
