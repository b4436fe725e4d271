"""A real Claude Code reply cut at ``max_new_tokens`` through the real adapter, on the host and
in a local bubblewrap sandbox, and Claude Code's continuation after it.

The rollout caps every reply at 128 new tokens (``RolloutSampling.max_new_tokens``); the
session's long answer is longer. The engine stops it at the cap (finish reason ``length``), the
adapter tells Claude Code ``stop_reason: "max_tokens"``, and Claude Code asks the model to go
on ("Output token limit hit…", and asks for more room: ``max_tokens`` 128000 instead of 32000);
the model answers with a short answer that fits. The continuation is a turn of its own,
continuing the cut one in the same branch; the cut reply is trained like any other (it is what
the engine generated), counted by ``summarize(...).cut_replies``; every engine token is trained
exactly once.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import ClaudeCode, InstalledCli
from protocol_adapters import AdapterConfig, RolloutSampling, SessionLimits, Vocabulary
from protocol_adapters.testing import ScriptedReply
from trajectory_tree import FinishReason, summarize

from .cli_runs import WHERE, Where, run_one
from .cli_session import ENGINE_CONTEXT, chain, explained
from .long_reply_agent import (
    COMMAND_OUTPUT,
    CONTINUE_REQUEST,
    LONG_ANSWER,
    SHORT_ANSWER,
    TASK,
    LongReplyAgent,
)
from .session_checks import assert_each_engine_token_trained_once

MAX_NEW_TOKENS = 128


@pytest.mark.parametrize("where", WHERE)
async def test_a_cut_reply_is_continued_in_a_turn_of_its_own_and_trained_once(
    where: Where, tmp_path: Path, claude_code_cli: InstalledCli, qwen_vocabulary: Vocabulary
) -> None:
    agent = LongReplyAgent(qwen_vocabulary)
    config = AdapterConfig(
        limits=SessionLimits(context_tokens=ENGINE_CONTEXT),
        sampling=RolloutSampling(max_new_tokens=MAX_NEW_TOKENS),
    )
    done = await run_one(
        where, ClaudeCode(), claude_code_cli, agent, tmp_path, task=TASK, config=config
    )
    with explained(done):
        assert done.run.returncode == 0
        assert agent.problems == []
        assert done.proxy.refusals == []
        assert (done.workdir / "marker").read_text().strip() == COMMAND_OUTPUT
        assert done.events.result_text == SHORT_ANSWER

        tree = done.tree
        command, cut, continuation = tree.turns
        whole = done.stack.double.reply_ids(ScriptedReply(text=LONG_ANSWER))
        assert len(whole) > MAX_NEW_TOKENS
        # The engine stopped the long answer at the cap...
        assert cut.finish_reason is FinishReason.LENGTH
        assert cut.output_length == MAX_NEW_TOKENS
        assert list(tree.output_ids(cut)) == whole[:MAX_NEW_TOKENS]
        assert LONG_ANSWER.startswith(cut.reply.plain_text)
        assert cut.meta.extra["max_new_tokens"] == str(MAX_NEW_TOKENS)
        # ...Claude Code asked to go on, once, with more room, in a turn of its own that
        # continues the cut reply as the engine generated it.
        assert agent.continuations == 1
        assert continuation.finish_reason is FinishReason.STOP
        assert continuation.reply.plain_text == SHORT_ANSWER
        assert chain(tree, continuation) == [command.id, cut.id, continuation.id]
        asked = tree.request_messages(continuation)
        assert [m.role for m in asked[-2:]] == ["assistant", "user"]
        assert asked[-2].plain_text == cut.reply.plain_text
        assert CONTINUE_REQUEST in asked[-1].plain_text
        assert cut.meta.extra["client_max_tokens"] == "32000"
        assert continuation.meta.extra["client_max_tokens"] == "128000"

        lin = assert_each_engine_token_trained_once(done)
        assert [s.trained_turns for s in lin.samples] == [(command.id, cut.id, continuation.id)]
        summary = summarize(tree, lin)
        assert summary.cut_replies == 1
        assert summary.excluded_tokens == {}
        assert summary.trained_tokens == summary.generated_tokens
        assert done.events.main_agent_turns == len(tree.turns)
