"""One session, three agents at once: Claude Code's main agent and two sub-agents (own system
prompt, fewer tools, the ``x-claude-code-agent-id`` header) send interleaved streamed requests
over one session token. Nothing is serialized behind a session lock, every turn is recorded once
on its own branch, and every branch is a valid sample."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anthropic
from server_checks import assert_engine_tokens_trained

from protocol_adapters._tokenizer import Vocabulary
from protocol_adapters.testing import Faults, ScriptedReply
from protocol_adapters.testing.stack import LocalStack, local_stack
from trajectory_tree import linearize

BASH: dict[str, Any] = {
    "name": "Bash",
    "description": "Run a shell command",
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
}
AGENT: dict[str, Any] = {
    "name": "Agent",
    "description": "Launch a sub-agent",
    "input_schema": {
        "type": "object",
        "properties": {"description": {"type": "string"}, "prompt": {"type": "string"}},
        "required": ["description", "prompt"],
    },
}
AGENTS: dict[str, str | None] = {
    "main": None,
    "tests": "a0123456789abcdef",
    "docs": "afedcba9876543210",
}
NAME = re.compile(r"You are agent (\w+)\.")


class AgentScript:
    """Replies by reading the prompt ids as the model would: which agent's system prompt, and
    how many tool results it holds so far (one tool call, then a final answer)."""

    def __init__(self, vocabulary: Vocabulary) -> None:
        self.vocabulary = vocabulary
        self.arrivals: list[str] = []

    def __call__(self, input_ids: Sequence[int]) -> ScriptedReply:
        text = self.vocabulary.decode(list(input_ids))
        match = NAME.search(text)
        assert match is not None, text[:200]
        agent = match[1]
        self.arrivals.append(agent)
        if text.count("<tool_response>") == 0:
            return ScriptedReply(
                text=f"{agent}: checking.", tool_calls=[("Bash", {"command": f"ls {agent}"})]
            )
        return ScriptedReply(text=f"{agent}: done.")


async def run_agent(stack: LocalStack, token: str, name: str) -> None:
    """Two streamed turns of one agent: a tool call, its result, a final answer."""
    agent_id = AGENTS[name]
    headers = {} if agent_id is None else {"x-claude-code-agent-id": agent_id}
    system: list[Any] = [
        {"type": "text", "text": "You are Claude Code."},
        {"type": "text", "text": f"You are agent {name}."},
    ]
    messages: list[Any] = [{"role": "user", "content": f"Do the {name} part."}]
    if agent_id is not None:  # a sub-agent's history: its prompt, then the environment
        messages.append({"role": "system", "content": "Environment: /repo, Linux."})
    tools: list[Any] = [BASH, AGENT] if agent_id is None else [BASH]
    async with anthropic.AsyncAnthropic(
        base_url=stack.server.url, api_key=token, max_retries=0, default_headers=headers
    ) as api:
        for _ in range(2):
            async with api.messages.stream(
                model="policy", max_tokens=256, system=system, messages=messages, tools=tools
            ) as events:
                reply = await events.get_final_message()
            messages.append(
                {"role": "assistant", "content": [b.model_dump() for b in reply.content]}
            )
            uses = [b for b in reply.content if b.type == "tool_use"]
            if not uses:
                assert reply.content[-1].text == f"{name}: done."  # type: ignore[union-attr]
                return
            result = {"type": "tool_result", "tool_use_id": uses[0].id, "content": f"{name}.txt"}
            messages.append({"role": "user", "content": [result]})
    raise AssertionError(f"agent {name} did not finish")


async def test_main_agent_and_two_sub_agents_interleave_in_one_session(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    script = AgentScript(qwen_vocabulary)
    async with local_stack(
        script,
        tokenizer_cache=tokenizer_cache,
        vocabulary=qwen_vocabulary,
        faults=Faults(chunk_delay=0.01),
    ) as stack:
        session = stack.server.sessions.open("three-agents")
        await asyncio.gather(*(run_agent(stack, session.token, name) for name in AGENTS))

        # All three first turns reached the engine before any second turn: truly concurrent.
        assert sorted(script.arrivals[:3]) == sorted(AGENTS)
        assert sorted(script.arrivals) == sorted(list(AGENTS) * 2)
        tree = session.tree
        assert len(tree.turns) == 6
        assert sorted(t.meta.request_id for t in tree.turns) == sorted(
            r.rid for r in stack.double.requests
        )
        for turn in tree.turns:
            system = tree.request_messages(turn)[0].plain_text
            name = NAME.search(system)
            assert name is not None
            assert turn.meta.agent_id == AGENTS[name[1]]
        lin = linearize(tree)
        assert len(lin.samples) == 3
        assert lin.exclusions == ()
        assert_engine_tokens_trained(stack, tree, lin)
        by_agent = {tree.turns[s.leaf_turn].meta.agent_id: s.trained_turns for s in lin.samples}
        assert set(by_agent) == set(AGENTS.values())
        for agent_id, turns in by_agent.items():
            assert len(turns) == 2
            assert {tree.turns[t].meta.agent_id for t in turns} == {agent_id}
        assert stack.renderer.stats.full_renders == 0
        assert session.in_flight == set()


async def test_twin_sub_agents_with_identical_first_requests_keep_their_own_branches(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    """Two sub-agents launched with the same prompt send the very same first request at once.
    Both are answered; each continues from its own reply, so neither first turn is mistaken for
    an abandoned retry."""
    answers = iter(["answer A", "answer B"])

    def script(input_ids: Sequence[int]) -> ScriptedReply:
        if "continue" in qwen_vocabulary.decode(list(input_ids)):
            return ScriptedReply(text="final")
        return ScriptedReply(text=next(answers))

    async def twin(api: anthropic.AsyncAnthropic) -> str:
        messages: list[Any] = [{"role": "user", "content": "same prompt"}]
        first = await api.messages.create(model="policy", max_tokens=64, messages=messages)
        messages.append({"role": "assistant", "content": [b.model_dump() for b in first.content]})
        messages.append({"role": "user", "content": "continue"})
        second = await api.messages.create(model="policy", max_tokens=64, messages=messages)
        assert second.content[0].text == "final"  # type: ignore[union-attr]
        return first.content[0].text  # type: ignore[union-attr]

    async with local_stack(
        script,
        tokenizer_cache=tokenizer_cache,
        vocabulary=qwen_vocabulary,
        faults=Faults(latency=0.05),
    ) as stack:
        session = stack.server.sessions.open("twins")
        async with anthropic.AsyncAnthropic(
            base_url=stack.server.url, api_key=session.token, max_retries=0
        ) as api:
            firsts = await asyncio.gather(twin(api), twin(api))
        assert sorted(firsts) == ["answer A", "answer B"]
        tree = session.tree
        assert len(tree.turns) == 4
        lin = linearize(tree)
        assert lin.exclusions == ()
        assert len(lin.samples) == 2
        assert_engine_tokens_trained(stack, tree, lin)
        for sample in lin.samples:
            first, second = (tree.turns[t] for t in sample.trained_turns)
            assert second.reply.plain_text == "final"
            assert tree.request_messages(second)[1] == first.reply
