"""Client retries of an identical request (the SDKs and both CLIs retry 5xx transparently).

With ``replay_retries`` the recorded answer is sent again without calling the engine, so a retry
cannot fork the tree. By default the retry is generated afresh and the earlier answer, which the
client never continued, is excluded from training as an abandoned retry.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from server_checks import assert_engine_tokens_trained
from server_clients import anthropic_client

from protocol_adapters._server.config import AdapterConfig
from protocol_adapters._tokenizer import Vocabulary
from protocol_adapters.testing import ScriptedReply
from protocol_adapters.testing.stack import local_stack
from trajectory_tree import Exclusion, LossReason, linearize

SCRIPT = [
    ScriptedReply(
        reasoning="Look first.",
        text="Listing.",
        tool_calls=[("Bash", {"command": "ls"}), ("Bash", {"command": "pwd"})],
    ),
    ScriptedReply(text="A different answer."),
]
REQUEST: dict[str, Any] = {
    "model": "policy",
    "max_tokens": 256,
    "system": "You are Claude Code.",
    "tools": [
        {
            "name": "Bash",
            "description": "Run a shell command",
            "input_schema": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        }
    ],
    "messages": [{"role": "user", "content": "Where am I?"}],
}
RETRY = {"x-stainless-retry-count": "1"}


async def ask(api: Any, *, stream: bool, headers: dict[str, str] | None = None) -> Any:
    if not stream:
        return await api.messages.create(**REQUEST, extra_headers=headers)
    async with api.messages.stream(**REQUEST, extra_headers=headers) as events:
        return await events.get_final_message()


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_replay_answers_an_identical_retry_from_the_record(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary, stream: bool
) -> None:
    config = AdapterConfig(replay_retries=True)
    async with local_stack(
        SCRIPT, tokenizer_cache=tokenizer_cache, vocabulary=qwen_vocabulary, config=config
    ) as stack:
        session = stack.server.sessions.open("replay")
        async with anthropic_client(stack, session.token) as api:
            first = await ask(api, stream=stream)
            nodes = len(session.tree.nodes)
            again = await ask(api, stream=stream, headers=RETRY)
        assert len(stack.double.requests) == 1, "a replay must not call the engine"
        assert again.content == first.content  # same blocks, same tool-call ids, same signature
        assert again.stop_reason == first.stop_reason == "tool_use"
        assert again.usage.input_tokens == first.usage.input_tokens
        assert again.usage.output_tokens == first.usage.output_tokens
        tree = session.tree
        assert len(tree.turns) == 1
        assert len(tree.nodes) == nodes
        assert tree.turns[0].meta.retry_count == 0
        lin = linearize(tree)
        assert lin.exclusions == ()
        assert_engine_tokens_trained(stack, tree, lin)


async def test_without_replay_a_retry_regenerates_and_the_first_answer_is_abandoned(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    async with local_stack(
        SCRIPT, tokenizer_cache=tokenizer_cache, vocabulary=qwen_vocabulary
    ) as stack:
        session = stack.server.sessions.open("no-replay")
        async with anthropic_client(stack, session.token) as api:
            first = await ask(api, stream=True)
            again = await ask(api, stream=True, headers=RETRY)
        assert len(stack.double.requests) == 2
        assert first.content[-1].type == "tool_use"
        assert again.content[0].text == "A different answer."
        tree = session.tree
        abandoned, retried = tree.turns
        assert retried.meta.retry_count == 1
        assert tree.node(abandoned.node).parent is tree.node(retried.node).parent
        assert list(tree.prompt_ids(abandoned)) == list(tree.prompt_ids(retried))
        lin = linearize(tree)
        assert lin.exclusions == (
            Exclusion(abandoned.id, LossReason.ABANDONED_RETRY, abandoned.output_length),
        )
        assert [s.trained_turns for s in lin.samples] == [(retried.id,)]
        assert_engine_tokens_trained(stack, tree, lin)


async def test_a_replayed_answer_is_continued_like_the_original(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    """After a replay the client continues from the answer it got: the same branch."""
    config = AdapterConfig(replay_retries=True)
    async with local_stack(
        [SCRIPT[0], ScriptedReply(text="Done.")],
        tokenizer_cache=tokenizer_cache,
        vocabulary=qwen_vocabulary,
        config=config,
    ) as stack:
        session = stack.server.sessions.open("replay-continue")
        async with anthropic_client(stack, session.token) as api:
            await ask(api, stream=True)
            replayed = await ask(api, stream=True, headers=RETRY)
            uses = [b for b in replayed.content if b.type == "tool_use"]
            messages = [
                *REQUEST["messages"],
                {"role": "assistant", "content": [b.model_dump() for b in replayed.content]},
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": u.id, "content": "out"} for u in uses
                    ],
                },
            ]
            final = await api.messages.create(**{**REQUEST, "messages": messages})
        assert final.content[0].text == "Done."
        tree = session.tree
        assert len(tree.turns) == 2
        lin = linearize(tree)
        assert lin.exclusions == ()
        assert [s.trained_turns for s in lin.samples] == [(0, 1)]
        assert_engine_tokens_trained(stack, tree, lin)


async def test_replay_never_hands_one_agent_another_agents_answer(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    """Two sub-agents may send the very same request; only the same agent asking again is a
    retry. Each gets its own generation, and each answer is trained as that agent's work."""
    config = AdapterConfig(replay_retries=True)
    async with local_stack(
        [ScriptedReply(text="first agent's answer"), ScriptedReply(text="second agent's answer")],
        tokenizer_cache=tokenizer_cache,
        vocabulary=qwen_vocabulary,
        config=config,
    ) as stack:
        session = stack.server.sessions.open("replay-agents")
        texts = []
        async with anthropic_client(stack, session.token) as api:
            for agent in ("a0000000000000001", "a0000000000000002", "a0000000000000001"):
                reply = await ask(api, stream=True, headers={"x-claude-code-agent-id": agent})
                texts.append(reply.content[0].text)
        assert texts == ["first agent's answer", "second agent's answer", "first agent's answer"]
        assert len(stack.double.requests) == 2  # the third request was the first agent's retry
        tree = session.tree
        assert [t.meta.agent_id for t in tree.turns] == ["a0000000000000001", "a0000000000000002"]
        lin = linearize(tree)
        assert lin.exclusions == ()
        assert len(lin.samples) == 2
        assert_engine_tokens_trained(stack, tree, lin)
