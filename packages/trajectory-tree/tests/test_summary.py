"""Session summary: the counts a researcher reads first."""

from __future__ import annotations

from invariants import check_session
from session_kit import ChatFormat, Session, call, prompt, reply, system, tool_result, user

from trajectory_tree import (
    FinishReason,
    LengthLimit,
    LossReason,
    SessionSummary,
    TurnMeta,
    summarize,
)


def test_summary_counts_a_busy_session() -> None:
    s = Session(fmt=ChatFormat(strip_history_reasoning=True))
    sys, task = system("agent"), user("task")
    two_calls = reply(
        "two", call("a", "bash", {"cmd": "x"}), call("b", "read", {"path": "y"}), reasoning="r"
    )
    s.turn(prompt(sys, task), two_calls, meta=TurnMeta(malformed_tool_calls=1))
    after = [sys, task, two_calls, tool_result("a", "1"), tool_result("b", "2")]
    s.turn(prompt(*after), reply("ok"), full="template drops reasoning")  # re-rendered
    s.turn(prompt(*after), reply("again"))  # retry of turn 1 on the new lineage
    s.turn(prompt(user("title?"), tools=()), reply("T"), meta=TurnMeta(side_request=True))
    s.turn(prompt(sys, user("cut")), reply("cut off mid"), finish=FinishReason.LENGTH)
    mismatch = TurnMeta(
        extra={
            "prompt_mismatch": "the template's text differs",
            "output_kept": "turn 0's output is kept verbatim",
        }
    )
    s.turn(
        prompt(sys, user("other")),
        reply("x"),
        output=[1, 2],
        finish=FinishReason.ABORT,
        meta=mismatch,
    )
    lin = check_session(s)
    summary = summarize(s.tree, lin)
    turns = s.tree.turns
    assert summary.turns == 6
    assert summary.branches == 6
    assert summary.samples == len(lin.samples) == 3
    assert summary.generated_tokens == sum(t.output_length for t in turns)
    assert summary.trained_tokens == sum(x.trained_tokens for x in lin.samples)
    assert summary.trained_tokens + sum(summary.excluded_tokens.values()) == (
        summary.generated_tokens
    )
    assert summary.excluded_tokens == {
        LossReason.ABANDONED_RETRY: turns[1].output_length,
        LossReason.SIDE_REQUEST: turns[3].output_length,
        LossReason.ABORTED: 2,
    }
    masked = sum(summary.masked_tokens.values())
    assert masked + summary.trained_tokens == sum(len(x.tokens) for x in lin.samples)
    assert summary.masked_tokens[LossReason.RERENDERED_HISTORY] > 0
    assert (summary.tool_calls, summary.malformed_tool_calls) == (2, 1)
    assert (summary.aborted_turns, summary.rerendered_turns) == (1, 1)
    assert summary.side_requests == 1
    assert summary.cut_replies == 1  # trained like any turn, and counted
    assert summary.max_prompt_tokens == max(t.prompt_length for t in turns)
    assert summary.prompt_mismatches == {"the template's text differs": 1}
    assert summary.outputs_kept == {"turn 0's output is kept verbatim": 1}  # not a fault
    as_dict = summary.as_dict()
    assert as_dict["excluded_tokens"] == {
        "aborted": 2,
        "abandoned_retry": turns[1].output_length,
        "side_request": turns[3].output_length,
    }
    assert list(as_dict) == [
        "turns",
        "branches",
        "samples",
        "generated_tokens",
        "trained_tokens",
        "masked_tokens",
        "excluded_tokens",
        "tool_calls",
        "malformed_tool_calls",
        "aborted_turns",
        "side_requests",
        "rerendered_turns",
        "max_prompt_tokens",
        "prompt_mismatches",
        "outputs_kept",
        "cut_replies",
        "history_dropped",
    ]
    assert as_dict["prompt_mismatches"] == {"the template's text differs": 1}
    assert as_dict["outputs_kept"] == {"turn 0's output is kept verbatim": 1}


def test_summary_counts_what_the_limited_linearization_trains() -> None:
    s = Session()
    s.turn(prompt(user("a")), reply("long answer " * 10))
    limit = LengthLimit(s.tree.turns[0].prompt_length + 4)
    summary = summarize(s.tree, check_session(s, limit=limit))
    assert summary.trained_tokens == 4
    assert summary.excluded_tokens == {LossReason.OVER_LENGTH: s.tree.turns[0].output_length - 4}
    assert summarize(s.tree).trained_tokens == s.tree.turns[0].output_length


def test_empty_session() -> None:
    s = Session()
    summary = summarize(s.tree)
    assert (summary.turns, summary.samples, summary.max_prompt_tokens) == (0, 0, 0)


def test_a_summary_built_without_the_later_counts_has_none_of_them() -> None:
    """``outputs_kept`` and ``cut_replies`` came after the other counts: a caller that builds a
    summary without them (an older producer) gets none, not a made-up count."""
    summary = SessionSummary(
        turns=0,
        branches=0,
        samples=0,
        generated_tokens=0,
        trained_tokens=0,
        masked_tokens={},
        excluded_tokens={},
        tool_calls=0,
        malformed_tool_calls=0,
        aborted_turns=0,
        side_requests=0,
        rerendered_turns=0,
        max_prompt_tokens=0,
        prompt_mismatches={},
    )
    assert (summary.outputs_kept, summary.cut_replies, summary.history_dropped) == ({}, 0, 0)
    assert summary == summarize(Session().tree)


def test_a_turn_resent_without_its_oldest_history_is_never_trained() -> None:
    """Claude Code and Codex shorten a compaction request refused as too long by dropping its
    oldest messages, the task among them: the summary it gets back was written without the
    task, so it is counted and excluded, not trained like any turn."""
    s = Session()
    sys, task = system("agent"), user("the task")
    s.turn(prompt(sys, task), reply("working"))
    dropped = TurnMeta(extra={"history_dropped": "2 of 5 messages, the first user message too"})
    s.turn(prompt(sys, user("summarize")), reply("a summary without the task"), meta=dropped)
    s.turn(prompt(sys, user("go on")), reply("done"))
    lin = check_session(s)
    summary = summarize(s.tree, lin)
    summarized = s.tree.turns[1]
    assert summary.history_dropped == 1
    assert summary.excluded_tokens == {LossReason.HISTORY_DROPPED: summarized.output_length}
    assert summary.trained_tokens == summary.generated_tokens - summarized.output_length
    assert summary.as_dict()["history_dropped"] == 1
