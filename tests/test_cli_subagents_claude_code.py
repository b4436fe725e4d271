"""Real Claude Code sub-agents (its ``Agent`` tool) through the real adapter: one in the
foreground, two in parallel, one in the background.

A sub-agent's requests share the session token with the main agent's but start a conversation of
their own (another system prompt, fewer tools, no parent history) and carry the
``x-claude-code-agent-id`` header. Each agent must come out as a branch of its own: one chain of
its turns, trained once in a sample of its own, with every trained token exactly the engine's.
The CLI's event stream shows only some of a sub-agent's replies, so the harness counts the main
agent's turns from it and the adapter's tree counts the model calls.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from harness import ClaudeCode, InstalledCli
from protocol_adapters import Vocabulary
from trajectory_tree import summarize

from .cli_session import (
    POLICY_MODEL,
    assert_trained_once_as_generated,
    chain,
    explained,
    run_cli_session,
)
from .delegating_agent import TASK, DelegatingAgent, final_answer, marker, output

AGENT_ID = re.compile(r"a[0-9a-f]{16}")

CASES = {
    "foreground": (("alpha",), False),
    "parallel": (("alpha", "beta"), False),
    "background": (("alpha",), True),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_each_sub_agent_is_a_branch_of_its_own_trained_once(
    case: str, tmp_path: Path, claude_code_cli: InstalledCli, qwen_vocabulary: Vocabulary
) -> None:
    names, background = CASES[case]
    agent = DelegatingAgent(qwen_vocabulary, names=names, background=background)
    done = await run_cli_session(ClaudeCode(), claude_code_cli, agent, tmp_path, task=TASK)
    with explained(done):
        assert done.run.returncode == 0
        assert agent.problems == []
        assert done.proxy.refusals == []
        for name in names:
            assert (done.workdir / marker(name)).read_text().strip() == output(name)
        assert done.events.result_text == final_answer(names)

        tree = done.tree
        turns = tree.turns
        assert all(t.meta.extra["model"] == POLICY_MODEL for t in turns)
        main = [t for t in turns if t.meta.agent_id is None]
        by_agent: dict[str, list[int]] = {}
        for turn in turns:
            if turn.meta.agent_id is not None:
                assert AGENT_ID.fullmatch(turn.meta.agent_id), turn.meta.agent_id
                by_agent.setdefault(turn.meta.agent_id, []).append(turn.id)
        # One sub-agent per delegated part, each a tool call and a report; the main agent
        # delegates, (in the background) waits, and answers.
        assert len(by_agent) == len(names)
        assert all(len(ids) == 2 for ids in by_agent.values())
        assert len(main) == (3 if background else 2)
        reports = {t.reply.plain_text for t in turns if t.meta.agent_id is not None}
        assert {r for r in reports if r.startswith("REPORT")} == {
            f"REPORT {name}: {output(name)}" for name in names
        }

        # Each agent is one chain of exactly its own turns (so branches never mix agents)...
        assert chain(tree, main[-1]) == [t.id for t in main]
        for ids in by_agent.values():
            assert chain(tree, turns[ids[-1]]) == ids
        # ...in a conversation of its own: another system prompt than the main agent's.
        main_system = agent.system_prompts["main"]
        assert len(main_system) == 1
        for name in names:
            assert agent.system_prompts[name].isdisjoint(main_system)

        # One sample per agent, each training exactly that agent's turns, tokens the engine's.
        lin = assert_trained_once_as_generated(done)
        trained = sorted(tuple(s.trained_turns) for s in lin.samples)
        expected = [tuple(t.id for t in main), *(tuple(ids) for ids in by_agent.values())]
        assert trained == sorted(expected)

        # The main agent's calls to Agent came back as its tool results (the hand-back or the
        # launch notice), each answering its own call.
        delegation = main[0].reply.tool_calls
        assert [json.loads(c.arguments)["run_in_background"] for c in delegation] == [
            background
        ] * len(names)
        answered = {
            n.message.tool_call_id
            for n in tree.node(main[-1].node).path()
            if n.message is not None and n.message.role == "tool"
        }
        assert answered == {c.id for c in delegation}

        # The stream counts the main agent's turns; the model calls are the tree's.
        assert done.events.main_agent_turns == len(main)
        assert summarize(tree, lin).turns == len(turns) == len(main) + 2 * len(names)
        assert done.events.tool_calls == len(names) * 2
