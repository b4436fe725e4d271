"""Real CLIs whose request for a summary is itself too long: they resend it without its oldest
messages, the task statement among them, and the summary the model writes then (without the
task) must never be trained.

On a 32k engine the scripted policy (``brink_agent.py``) steers the history to the limit:

- Claude Code: the first report step lands the history just under the adapter's limit and the
  next pushes it over. The adapter refuses the conversation's request, then Claude Code's request
  for a summary of the opening round (the task and that first step, plus a long instruction);
  Claude Code then asks for a summary of the conversation without its opening round, the task,
  behind a placeholder message. The request refused last still held the task.
- Codex: parallel steps bring the history past Codex's compaction threshold, then its compaction
  request over the limit; Codex resends it without its oldest item, again and again (the skills,
  the environment context, the task, the first call), until it fits. The request refused last
  had already lost the task.

The adapter notes the resend that was answered (``TurnMeta.extra["history_dropped"]``),
trajectory-tree excludes its output from training (``LossReason.HISTORY_DROPPED``) and counts it
(``summarize(tree).history_dropped``); every other engine token is trained exactly once. Which
turns were written without the task is read from their prompts, not from the note, so the note
is held to what the CLI really sent.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness import ClaudeCode, Codex, InstalledCli
from protocol_adapters import Vocabulary
from trajectory_tree import LossReason, Turn, summarize

from .brink_agent import STEP_LOG, BrinkAgent, ParallelBrinkAgent, final_answer, holds_task, task
from .cli_runs import WHERE, Where, run_one
from .cli_session import CliSession, ModelT, assert_trained_once_as_generated, explained
from .compacting_agent import is_compaction_request
from .reading import Prompt

SMALL_ENGINE = 32768
PROMPT_TOO_LONG = re.compile(r"prompt is too long: (\d+) tokens > (\d+) maximum")
HISTORY_DROPPED = "history_dropped"
"""The ``TurnMeta.extra`` key of the adapter's note."""
NOTE = re.compile(r"resent after a too-long refusal without (\d+) of its (\d+) messages, (.+)")
TASK_AMONG_THEM = "the task among them"
"""How the note ends when the request refused last held the task (Claude Code)."""
TASK_GONE_EARLIER = "its task gone in an earlier resend"
"""How it ends when that request had already lost it (Codex)."""


def prompt_of(done: CliSession[ModelT], turn: Turn) -> Prompt:
    return Prompt(done.agent.vocabulary.decode(list(done.tree.prompt_ids(turn))))


def assert_taskless_summaries_never_trained(
    done: CliSession[ModelT], *, steps: int, limit: int, path: str, task_went: str
) -> list[Turn]:
    """The CLI finished every step once; at least two of its requests were refused as too long
    (the conversation's, and one for a summary); some request for a summary went without the
    task statement, and exactly those turns are noted as such (``task_went`` saying where the
    task went), counted and never trained, while every other engine token is trained once.
    Returns the noted turns."""
    assert done.run.returncode == 0
    assert done.agent.problems == []
    log = sorted(int(k) for k in (done.workdir / STEP_LOG).read_text().split())
    assert log == list(range(1, steps + 1)), "each step ran once"
    assert done.events.result_text == final_answer(steps)

    refusals = done.proxy.refusals
    assert len(refusals) >= 2
    for refusal in refusals:
        assert (refusal.path, refusal.status) == (path, 400)
        found = PROMPT_TOO_LONG.fullmatch(refusal.error or "")
        assert found is not None, refusal
        assert int(found[1]) > int(found[2]) == limit
    tree = done.tree
    assert max(t.prompt_length for t in tree.turns) <= limit
    assert done.session.answered == len(tree.turns)

    # What the CLI sent: requests for a summary, one at least without the task statement.
    summaries = [t for t in tree.turns if is_compaction_request(prompt_of(done, t))]
    taskless = [t for t in summaries if not holds_task(prompt_of(done, t))]
    assert taskless, "every request for a summary still held the task statement"

    # What the adapter made of it: exactly those turns are noted, saying the task went...
    noted = [t for t in tree.turns if HISTORY_DROPPED in t.meta.extra]
    assert [t.id for t in noted] == [t.id for t in taskless], "the noted turns"
    for turn in noted:
        assert turn.reply.tool_calls == ()
        assert "<summary>" in turn.reply.plain_text
    # ...counted, and never trained; every other engine token is trained exactly once.
    assert summarize(tree).history_dropped == len(noted)
    lin = assert_trained_once_as_generated(
        done, excluded=dict.fromkeys((t.id for t in noted), LossReason.HISTORY_DROPPED)
    )
    assert {e.turn: e.tokens for e in lin.exclusions} == {t.id: t.output_length for t in noted}
    for turn in noted:
        note = turn.meta.extra[HISTORY_DROPPED]
        found = NOTE.fullmatch(note)
        assert found is not None, note
        assert 0 < int(found[1]) < int(found[2]), note
        assert found[3] == task_went, note
    return noted


@pytest.mark.parametrize("where", WHERE)
async def test_claude_code_summary_written_after_the_task_was_dropped_is_never_trained(
    where: Where, tmp_path: Path, claude_code_cli: InstalledCli, qwen_vocabulary: Vocabulary
) -> None:
    steps = 3  # lands the history, pushes it over, one small step after the summary
    agent = BrinkAgent(qwen_vocabulary, limit=SMALL_ENGINE - 2)
    done = await run_one(
        where,
        ClaudeCode(),
        claude_code_cli,
        agent,
        tmp_path,
        task=task(steps),
        context=SMALL_ENGINE,
    )
    with explained(done):
        assert agent.limit == done.session.max_prompt_tokens
        assert_taskless_summaries_never_trained(
            done, steps=steps, limit=agent.limit, path="/v1/messages", task_went=TASK_AMONG_THEM
        )


@pytest.mark.parametrize("where", WHERE)
async def test_codex_compaction_written_after_the_task_was_dropped_is_never_trained(
    where: Where, tmp_path: Path, codex_cli: InstalledCli, qwen_vocabulary: Vocabulary
) -> None:
    codex = Codex()
    compact_at, output_limit = codex.compaction_limits(SMALL_ENGINE)
    agent = ParallelBrinkAgent(
        qwen_vocabulary,
        limit=SMALL_ENGINE - 2,
        compact_at=compact_at,
        cap=output_limit * 4,  # Codex counts four bytes a token; a digit is one engine token
    )
    steps = 12  # more than the two replies before the compaction can run
    done = await run_one(
        where, codex, codex_cli, agent, tmp_path, task=task(steps), context=SMALL_ENGINE
    )
    with explained(done):
        assert agent.limit == done.session.max_prompt_tokens
        noted = assert_taskless_summaries_never_trained(
            done, steps=steps, limit=agent.limit, path="/v1/responses", task_went=TASK_GONE_EARLIER
        )
        for turn in noted:
            assert '"request_kind":"compaction"' in turn.meta.extra["x-codex-turn-metadata"]
