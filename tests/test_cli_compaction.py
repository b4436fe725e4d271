"""Real CLIs compacting their history through the real adapter, with the compaction settings
harness writes for the engine's context.

- Claude Code on a 32k engine: it cannot be told a window under 100k, so it compacts when the
  adapter refuses a prompt with 400 "prompt is too long" (its summarization request may be
  refused too; it retries it shorter).
- Claude Code on a 100k engine (the smallest window it honours): it compacts on the usage the
  adapter reports, before any refusal.
- Codex on a 32k engine: it compacts on the reported usage; harness's threshold and tool-output
  cap leave room for a large tool output and the summary, so it is never refused.

In every case each compaction starts a new branch: the summarization request is a branch of its
own whose summary is trained once, and the conversation that continues from the summary (which
it carries as context, never trained again) is another. Every trained token is the engine's.
"""

from __future__ import annotations

import re
from pathlib import Path

from harness import ClaudeCode, Codex, Harness, InstalledCli
from protocol_adapters import Vocabulary
from trajectory_tree import Turn

from .cli_session import CliSession, assert_trained_once_as_generated, chain, explained
from .cli_session import run_cli_session as run_session
from .compacting_agent import STEP_LOG, StepsAgent, final_answer, is_compaction_request, task
from .reading import Prompt

SMALL_ENGINE = 32768
CLAUDE_CODE_SMALLEST_WINDOW = 100_000
PROMPT_TOO_LONG = re.compile(r"prompt is too long: (\d+) tokens > (\d+) maximum")


async def run_steps(
    harness: Harness,
    installed: InstalledCli,
    vocabulary: Vocabulary,
    tmp_path: Path,
    *,
    steps: int,
    lines: int,
    context: int,
) -> CliSession[StepsAgent]:
    agent = StepsAgent(vocabulary, lines=lines)
    return await run_session(harness, installed, agent, tmp_path, task=task(steps), context=context)


def compaction_turns(done: CliSession[StepsAgent]) -> list[Turn]:
    """The turns that answered a request for a summary, read from their prompts."""
    decode = done.agent.vocabulary.decode
    return [
        t
        for t in done.tree.turns
        if is_compaction_request(Prompt(decode(list(done.tree.prompt_ids(t)))))
    ]


def assert_compacted_and_finished(done: CliSession[StepsAgent], steps: int) -> list[Turn]:
    """The CLI ran every step exactly once, in order, compacted at least once on the way and
    finished; each compaction is a branch of its own and starts a new one; the trust property
    holds over the whole tree. Returns the summarization turns."""
    assert done.run.returncode == 0
    assert done.agent.problems == []
    assert (done.workdir / STEP_LOG).read_text().split() == [str(k) for k in range(1, steps + 1)]
    assert done.events.result_text == final_answer(steps)

    tree = done.tree
    summaries = compaction_turns(done)
    assert summaries, "the CLI never compacted"
    # Each summary request still held the task statement.
    assert [r.task is not None for r in done.agent.summary_requests] == [True] * len(summaries)
    lin = assert_trained_once_as_generated(done)
    # Every branch is a sample: the conversation before each compaction, each summary on its
    # own, and each conversation that goes on from a summary.
    assert len(lin.samples) == 1 + 2 * len(summaries)
    summary_ids = {t.id for t in summaries}
    for turn in tree.turns:
        on_path = set(chain(tree, turn))
        if turn.id in summary_ids:
            # The summary's own branch holds no other summary...
            assert on_path & summary_ids == {turn.id}
            assert turn.reply.tool_calls == ()
            assert "<summary>" in turn.reply.plain_text
        else:
            # ...and no conversation continues from a summary's tokens: it comes back as text.
            assert not on_path & summary_ids
    for summary in summaries:
        after = [t for t in tree.turns if t.id > summary.id and t.id not in summary_ids]
        first = after[0]
        assert chain(tree, first)[0] > summary.id, "the conversation after it is a new branch"
        text = "\n".join(m.plain_text for m in tree.request_messages(first))
        assert "Completed: STEP-" in text, "it goes on from the summary"
    return summaries


async def test_claude_code_on_a_small_engine_compacts_when_the_adapter_refuses(
    tmp_path: Path, claude_code_cli: InstalledCli, qwen_vocabulary: Vocabulary
) -> None:
    # ~8.4k tokens per step: the fourth request would not fit in 32k.
    done = await run_steps(
        ClaudeCode(),
        claude_code_cli,
        qwen_vocabulary,
        tmp_path,
        steps=5,
        lines=1200,
        context=SMALL_ENGINE,
    )
    with explained(done):
        assert_compacted_and_finished(done, steps=5)
        refusals = done.proxy.refusals
        assert refusals, "on a 32k engine only the adapter's refusal makes Claude Code compact"
        for refusal in refusals:
            assert (refusal.path, refusal.status) == ("/v1/messages", 400)
            found = PROMPT_TOO_LONG.fullmatch(refusal.error or "")
            assert found is not None, refusal
            assert int(found[1]) > int(found[2]) == SMALL_ENGINE - 2
        assert max(t.prompt_length for t in done.tree.turns) <= SMALL_ENGINE - 2
        # A refused call is no model call: the session's turn cap counts the answered ones.
        assert done.session.answered == len(done.tree.turns)


async def test_claude_code_compacts_on_reported_usage_before_any_refusal(
    tmp_path: Path, claude_code_cli: InstalledCli, qwen_vocabulary: Vocabulary
) -> None:
    # ~24k tokens per step against the smallest window Claude Code accepts.
    done = await run_steps(
        ClaudeCode(),
        claude_code_cli,
        qwen_vocabulary,
        tmp_path,
        steps=4,
        lines=3400,
        context=CLAUDE_CODE_SMALLEST_WINDOW,
    )
    with explained(done):
        summaries = assert_compacted_and_finished(done, steps=4)
        assert done.proxy.refusals == []
        # It compacted while the history still fit: the usage it was told, not a refusal.
        assert all(t.prompt_length < CLAUDE_CODE_SMALLEST_WINDOW - 2 for t in summaries)


async def test_codex_compacts_on_usage_with_room_for_a_large_tool_output(
    tmp_path: Path, codex_cli: InstalledCli, qwen_vocabulary: Vocabulary
) -> None:
    # ~7k tokens of output per step (Codex keeps at most 1/8 of the window of it): with
    # Codex's own 0.9 threshold the step after 26k would be refused and the run would fail.
    done = await run_steps(
        Codex(),
        codex_cli,
        qwen_vocabulary,
        tmp_path,
        steps=6,
        lines=1000,
        context=SMALL_ENGINE,
    )
    with explained(done):
        summaries = assert_compacted_and_finished(done, steps=6)
        assert done.proxy.refusals == []
        for summary, seen in zip(summaries, done.agent.summary_requests, strict=True):
            assert '"request_kind":"compaction"' in summary.meta.extra["x-codex-turn-metadata"]
            # Nothing was dropped to make it fit: it carried every step run before it.
            run_before = sum(len(t.reply.tool_calls) for t in done.tree.turns[: summary.id])
            assert seen.steps_done == tuple(range(1, run_before + 1))
