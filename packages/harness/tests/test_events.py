"""Event-stream summaries on lines the real CLIs printed (tests/fixtures, captured from
Claude Code 2.1.330 and Codex 0.169.0 against a local endpoint), plus hostile input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness import ClaudeCode, ClaudeCodeTally, Codex, CodexTally, EventStats, summarize_lines

FIXTURES = Path(__file__).parent / "fixtures"


def fixture_lines(name: str) -> list[bytes]:
    return (FIXTURES / name).read_bytes().splitlines(keepends=True)


def test_claude_code_success_stream() -> None:
    stats = ClaudeCode().summarize(FIXTURES / "claude_code_success.jsonl")
    # init, text block, tool_use block (same message id), tool result, final text, result
    assert stats == EventStats(
        events=6,
        malformed_lines=0,
        main_agent_turns=2,
        tool_calls=1,
        result_text="Done: wrote hello.txt.",
        error=None,
    )


def test_claude_code_max_turns_is_an_error_without_result() -> None:
    stats = ClaudeCode().summarize(FIXTURES / "claude_code_max_turns.jsonl")
    assert (stats.main_agent_turns, stats.tool_calls) == (1, 1)
    assert stats.result_text is None
    assert stats.error == "Reached maximum number of turns (1)"


def test_claude_code_synthetic_error_message_is_not_a_model_turn() -> None:
    stats = ClaudeCode().summarize(FIXTURES / "claude_code_prompt_too_long.jsonl")
    assert stats.main_agent_turns == 0
    assert stats.error == "Prompt is too long"
    assert stats.result_text is None


@pytest.mark.parametrize(
    ("mode", "main_agent_turns", "answer"),
    [("foreground", 2, "main reply 4 after 1"), ("background", 3, "main reply 5 after 2")],
)
def test_claude_code_counts_the_main_agents_turns_not_the_sub_agents(
    mode: str, main_agent_turns: int, answer: str
) -> None:
    # Captured from the real CLI: the main agent starts a sub-agent (Agent tool), which runs
    # one Bash command and reports back. The stream shows the sub-agent's tool-call reply
    # (with a parent_tool_use_id) and, in the foreground, never its final reply: four model
    # calls (five in the background, where the main agent also answers while it waits).
    name = f"claude_code_subagent_{mode}.jsonl"
    stats = ClaudeCode().summarize(FIXTURES / name)
    events = [json.loads(line) for line in fixture_lines(name)]
    sub_agent_replies = {
        e["message"]["id"]
        for e in events
        if e["type"] == "assistant" and e["parent_tool_use_id"] is not None
    }
    assert len(sub_agent_replies) == (1 if mode == "foreground" else 2)
    assert stats.main_agent_turns == main_agent_turns
    assert stats.main_agent_turns == sum(e["num_turns"] for e in events if e["type"] == "result")
    assert stats.tool_calls == 2  # the Agent call and the sub-agent's Bash call
    assert stats.result_text == answer
    assert stats.error is None


def test_codex_success_stream() -> None:
    stats = Codex().summarize(FIXTURES / "codex_success.jsonl")
    # The model-metadata notice is an `error` item, not a run failure nor a tool call.
    assert stats == EventStats(
        events=7,
        malformed_lines=0,
        main_agent_turns=1,
        tool_calls=1,
        result_text="Done: wrote hello.txt.",
        error=None,
    )


def test_codex_failed_turn() -> None:
    stats = Codex().summarize(FIXTURES / "codex_context_exceeded.jsonl")
    assert stats.main_agent_turns == 1
    assert stats.tool_calls == 0
    assert stats.result_text is None
    assert stats.error is not None
    assert stats.error.startswith("Codex ran out of room in the model's context window")


@pytest.mark.parametrize(
    ("name", "tally"),
    [("claude_code_success.jsonl", ClaudeCodeTally), ("codex_success.jsonl", CodexTally)],
)
def test_a_stream_cut_by_a_kill_counts_the_torn_line(name: str, tally: type) -> None:
    lines = fixture_lines(name)
    torn = lines[-1][: len(lines[-1]) // 2]
    stats = summarize_lines([*lines[:-1], torn], tally())
    assert stats.malformed_lines == 1
    assert stats.events == len(lines) - 1


def test_junk_lines_are_counted_never_raised() -> None:
    lines = [
        b"not json at all\n",
        b"\xff\xfe invalid utf-8\n",
        b"[1, 2, 3]\n",
        b'"a string"\n',
        b"null\n",
        b"[" * 100_000 + b"\n",
        b"\n",
        b"   \n",
        b'{"type": "assistant", "message": "not an object"}\n',
        b'{"type": "assistant", "message": {"id": 5, "content": "x"}}\n',
        b'{"type": "result", "is_error": true, "errors": [1, null]}\n',
    ]
    stats = summarize_lines(lines, ClaudeCodeTally())
    assert stats.malformed_lines == 6
    assert stats.events == 3
    assert (stats.main_agent_turns, stats.tool_calls) == (0, 0)
    assert stats.error == "error"


def test_codex_counts_each_tool_item_once_across_its_updates() -> None:
    item = {"id": "item_3", "type": "file_change", "changes": []}
    events = [
        {"type": "turn.started"},
        {"type": "item.started", "item": item},
        {"type": "item.updated", "item": item},
        {"type": "item.completed", "item": item},
        {"type": "item.completed", "item": {"id": "item_4", "type": "agent_message", "text": "a"}},
        {"type": "item.completed", "item": {"id": "item_5", "type": "agent_message", "text": "b"}},
        {"type": "turn.completed", "usage": {}},
    ]
    stats = summarize_lines([json.dumps(e).encode() for e in events], CodexTally())
    assert (stats.main_agent_turns, stats.tool_calls, stats.result_text) == (1, 1, "b")


@settings(deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=30))
def test_any_bytes_summarize_without_raising(lines: list[bytes]) -> None:
    for tally in (ClaudeCodeTally(), CodexTally()):
        stats = summarize_lines(lines, tally)
        nonblank = [line for line in lines if line.strip()]
        assert stats.events + stats.malformed_lines == len(nonblank)


@settings(deadline=None)
@given(
    st.lists(
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=8),
            lambda inner: (
                st.lists(inner, max_size=3)
                | st.dictionaries(
                    st.sampled_from(
                        ["type", "message", "item", "id", "content", "result", "error"]
                    ),
                    inner,
                    max_size=4,
                )
            ),
            max_leaves=12,
        ),
        max_size=10,
    )
)
def test_any_json_shapes_summarize_without_raising(values: list[object]) -> None:
    lines = [json.dumps(value).encode() for value in values]
    for tally in (ClaudeCodeTally(), CodexTally()):
        summarize_lines(lines, tally)


def test_codex_transient_errors_before_a_completed_turn_are_not_a_failure() -> None:
    events = [
        {"type": "turn.started"},
        {"type": "error", "message": "Reconnecting... 1/5 (stream disconnected)"},
        {"type": "item.completed", "item": {"id": "item_1", "type": "agent_message", "text": "ok"}},
        {"type": "turn.completed", "usage": {}},
    ]
    stats = summarize_lines([json.dumps(e).encode() for e in events], CodexTally())
    assert (stats.error, stats.result_text) == (None, "ok")
    failed = [*events[:2], {"type": "turn.failed", "error": {"message": "stream disconnected"}}]
    stats = summarize_lines([json.dumps(e).encode() for e in failed], CodexTally())
    assert stats.error == "stream disconnected"
