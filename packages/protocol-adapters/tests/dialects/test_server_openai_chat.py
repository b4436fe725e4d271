"""OpenAI Chat Completions through the real server, driven by the official ``openai`` SDK: what
is Chat's alone (the tool round trip every dialect makes is in ``test_contract.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from dialect_drivers import chat_completion
from server_checks import assert_engine_tokens_trained
from server_clients import openai_client

from protocol_adapters._tokenizer import Vocabulary
from protocol_adapters.testing import ScriptedReply
from protocol_adapters.testing.stack import local_stack
from trajectory_tree import linearize


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
        api = openai_client(stack, session.token)
        messages: list[Any] = [{"role": "user", "content": "List the files."}]
        first = await chat_completion(api, messages, stream=stream)
        message = first.choices[0].message
        assert message.content == "Looking." + after.lstrip("\n")  # all its text, joined
        messages.append(message.model_dump(exclude_none=True))
        assert message.tool_calls
        call = message.tool_calls[0]
        messages.append({"role": "tool", "tool_call_id": call.id, "content": "a.py"})
        second = await chat_completion(api, messages, stream=stream)
        assert second.choices[0].message.content == "Done."
        await api.close()
        lin = linearize(session.tree)
        assert len(lin.samples) == 1, "the echo must continue the same branch"
        assert_engine_tokens_trained(stack, session.tree, lin)
        assert all(t.rerendered is None for t in session.tree.turns)
