"""A real Claude Code sub-agent whose own context fills up and is compacted, through the real
adapter, on the host and in a local bubblewrap sandbox.

The main agent hands one part to a sub-agent (in the foreground) that runs four report steps of
about 8,400 tokens each on a 32k engine: its fourth request does not fit, the adapter refuses it
with "prompt is too long" and Claude Code compacts the sub-agent's history, not the main
agent's. The summarization request and the conversation that goes on from the summary carry
the sub-agent's agent id; each is a branch of its own, trained in samples of the sub-agent's,
and the main agent's turns stay one chain in one sample. Every engine token is trained once.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness import ClaudeCode, InstalledCli
from protocol_adapters import Vocabulary
from trajectory_tree import Turn

from .cli_runs import WHERE, Where, run_one
from .cli_session import ENGINE_CONTEXT, CliSession, chain, explained
from .compacting_agent import is_compaction_request
from .reading import Prompt
from .session_checks import assert_each_engine_token_trained_once, trained_by_agent, turns_by_agent
from .team_agent import TASK, Part, TeamAgent, directive, final_answer, output, steps_log

PROMPT_TOO_LONG = re.compile(r"prompt is too long: (\d+) tokens > (\d+) maximum")
STEPS = Part("alpha", "steps", steps=4, lines=1200)  # ~8.4k tokens of output per step


def summary_turns(done: CliSession[TeamAgent]) -> list[Turn]:
    """The turns that answered a request for a summary, read from their prompts."""
    decode = done.agent.vocabulary.decode
    return [
        t
        for t in done.tree.turns
        if is_compaction_request(Prompt(decode(list(done.tree.prompt_ids(t)))))
    ]


@pytest.mark.parametrize("where", WHERE)
async def test_a_sub_agent_compacts_its_own_history_and_trains_once(
    where: Where, tmp_path: Path, claude_code_cli: InstalledCli, qwen_vocabulary: Vocabulary
) -> None:
    agent = TeamAgent(qwen_vocabulary, parts=(STEPS,))
    done = await run_one(where, ClaudeCode(), claude_code_cli, agent, tmp_path, task=TASK)
    with explained(done):
        assert done.run.returncode == 0
        assert agent.problems == []
        assert done.events.result_text == final_answer({"alpha": [output("alpha")]})
        log = (done.workdir / steps_log("alpha")).read_text().split()
        assert log == ["1", "2", "3", "4"], "each step ran once, in order"

        # Only the adapter's refusal of the sub-agent's over-long prompt made it compact.
        assert done.proxy.refusals
        for refusal in done.proxy.refusals:
            found = PROMPT_TOO_LONG.fullmatch(refusal.error or "")
            assert found is not None, refusal
            assert int(found[1]) > int(found[2]) == ENGINE_CONTEXT - 2
        tree = done.tree
        assert max(t.prompt_length for t in tree.turns) <= ENGINE_CONTEXT - 2
        assert done.session.answered == len(tree.turns)

        by_agent = turns_by_agent(tree)
        main = by_agent.pop(None)
        (sub_agent,) = by_agent
        sub = by_agent[sub_agent]
        summaries = summary_turns(done)
        assert summaries, "the sub-agent never compacted"
        assert agent.summaries == ["alpha"] * len(summaries)
        # The compaction is the sub-agent's: its requests, agent id and all; the main
        # agent's history was never summarized and stays one chain.
        assert {t.meta.agent_id for t in summaries} == {sub_agent}
        assert chain(tree, main[-1]) == [t.id for t in main]
        assert len(main) == 3

        summary_ids = {t.id for t in summaries}
        for turn in sub:
            on_path = set(chain(tree, turn))
            assert {tree.turns[t].meta.agent_id for t in on_path} == {sub_agent}
            if turn.id in summary_ids:
                # A summary's branch holds no other summary; it carries the directive.
                assert on_path & summary_ids == {turn.id}
                assert turn.reply.tool_calls == ()
                assert "<summary>" in turn.reply.plain_text
                assert directive(STEPS) in turn.reply.plain_text
            else:
                # No conversation continues from a summary's tokens: it comes back as text.
                assert not on_path & summary_ids
        for summary in summaries:
            after = [t for t in sub if t.id > summary.id and t.id not in summary_ids]
            assert after, "the sub-agent went on after its summary"
            assert chain(tree, after[0])[0] > summary.id, "it goes on in a new branch"
            text = "\n".join(m.plain_text for m in tree.request_messages(after[0]))
            assert "Completed: STEP-" in text, "it goes on from the summary"

        # The main agent: one sample of its own turns; the sub-agent: the conversation before
        # each compaction, each summary, each conversation after one; all trained once.
        lin = assert_each_engine_token_trained_once(done)
        trained = trained_by_agent(tree, lin)
        assert trained[None] == [[t.id for t in main]]
        assert len(trained[sub_agent]) == 1 + 2 * len(summaries)
        assert sorted(t for ids in trained[sub_agent] for t in ids) == [t.id for t in sub]
