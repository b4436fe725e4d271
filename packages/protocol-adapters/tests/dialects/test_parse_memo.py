"""A session's earlier parse, reused for the messages a request re-sends: never a different parse.

Every case compares the memo's parse with a fresh one of the same body (equal, or the same
error), and counts what was reused, so a memo that reuses too much fails as surely as one that
reuses nothing.
"""

from __future__ import annotations

import copy
import json
import marshal
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol_adapters._dialects import anthropic, openai_chat, parse_memo
from protocol_adapters._dialects.parse_memo import ParseMemo
from protocol_adapters._server.workers import INLINE_BYTES, LargeBodies, Workers
from protocol_adapters._types import AdapterError, NeutralRequest


def call(call_id: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": "Bash", "input": arguments}


def result(call_id: str, text: str) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": call_id, "content": text}


def conversation(turns: int) -> dict[str, Any]:
    """An Anthropic body: a task, then ``turns`` calls and their results."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the failing test."}]
    for i in range(turns):
        arguments = {"command": f"cat file_{i}.py", "timeout": 1}
        messages.append({"role": "assistant", "content": [call(f"toolu_{i}", arguments)]})
        messages.append({"role": "user", "content": [result(f"toolu_{i}", f"line {i}\n" * 20)]})
    return {"model": "m", "max_tokens": 64, "system": "You fix bugs.", "messages": messages}


def parsed_with(memo: ParseMemo, body: dict[str, Any]) -> NeutralRequest | AdapterError:
    """The parse with the memo, which must be the fresh parse (or raise what it raises)."""
    fresh: NeutralRequest | AdapterError
    try:
        fresh = anthropic.parse_request(copy.deepcopy(body))
    except AdapterError as refused:
        fresh = refused
    if isinstance(fresh, NeutralRequest):
        mine = anthropic.parse_request(body, memo)
        assert mine == fresh
        return mine
    with pytest.raises(AdapterError) as again:
        anthropic.parse_request(body, memo)
    assert (again.value.message, again.value.param) == (fresh.message, fresh.param)
    return fresh


def test_a_resent_conversation_reuses_every_message_it_sent_before() -> None:
    memo = ParseMemo()
    first = conversation(3)
    before = anthropic.parse_request(first, memo)
    assert memo.reused == 0
    second = conversation(4)  # the same conversation, one call and result longer
    after = anthropic.parse_request(second, memo)
    assert memo.reused == len(first["messages"])
    assert after == anthropic.parse_request(conversation(4))
    kept = len(before.prompt.messages)
    reused = zip(after.prompt.messages[1:kept], before.prompt.messages[1:], strict=True)
    assert all(a is b for a, b in reused)


def counting_marshal(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """What the memo marshals from now on, in order."""
    dumped: list[object] = []

    def counted(value: Any, version: int) -> bytes:
        dumped.append(value)
        return marshal.dumps(value, version)

    monkeypatch.setattr(parse_memo, "marshal", SimpleNamespace(dumps=counted))
    return dumped


def test_a_conversation_resent_whole_costs_one_marshal_not_one_per_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The usual request (every earlier message unchanged, a few new) is recognized with one
    marshal of the whole list; only the new messages are marshalled and parsed one by one."""
    memo = ParseMemo()
    anthropic.parse_request(conversation(5), memo)
    dumped = counting_marshal(monkeypatch)
    body = conversation(6)
    assert parsed_with(memo, body) == anthropic.parse_request(conversation(6))
    new = body["messages"][len(conversation(5)["messages"]) :]
    assert len(dumped) == 1 + len(new)
    assert dumped[0] == body["messages"]
    assert dumped[1:] == new


@pytest.mark.parametrize("changed", [8, 7, 3, 1, 0])
def test_a_request_that_changes_one_message_reuses_every_other(
    monkeypatch: pytest.MonkeyPatch, changed: int
) -> None:
    """A sibling of the last request (its last message another) or an edit further back: the
    messages before the change are found with the one marshal of the list, those after it one by
    one at their positions; only the changed one is parsed."""
    memo = ParseMemo()
    body = conversation(4)
    anthropic.parse_request(body, memo)
    dumped = counting_marshal(monkeypatch)
    edited = copy.deepcopy(body)
    target = edited["messages"][changed]
    if isinstance(target["content"], str):
        target["content"] = "Another task."
    elif target["role"] == "user":
        target["content"][0]["content"] = "other output\n"
    else:
        target["content"][0]["input"]["command"] = "ls"
    assert isinstance(parsed_with(memo, edited), NeutralRequest)
    assert memo.reused == len(body["messages"]) - 1
    assert len(dumped) == 1 + len(body["messages"]) - changed


def test_a_message_after_the_resent_ones_is_read_in_the_state_they_left() -> None:
    """A request ending with the agent's tool call, then the next with its result: the result
    is checked against that call although the call's message came from the memo."""
    memo = ParseMemo()
    first = conversation(2)
    arguments = {"command": "ls"}
    first["messages"].append({"role": "assistant", "content": [call("toolu_last", arguments)]})
    anthropic.parse_request(first, memo)
    answered = copy.deepcopy(first)
    answered["messages"].append({"role": "user", "content": [result("toolu_last", "a\n")]})
    assert isinstance(parsed_with(memo, answered), NeutralRequest)
    assert memo.reused == len(first["messages"])
    stray = copy.deepcopy(answered)
    stray["messages"].append({"role": "assistant", "content": "Done."})
    stray["messages"].append({"role": "user", "content": [result("toolu_last", "again\n")]})
    refused = parsed_with(memo, stray)
    assert isinstance(refused, AdapterError)
    assert "unexpected `tool_use_id`" in refused.message


def test_the_same_request_sent_again_reuses_all_of_it() -> None:
    memo = ParseMemo()
    body = conversation(3)
    anthropic.parse_request(body, memo)
    again = anthropic.parse_request(copy.deepcopy(body), memo)
    assert memo.reused == len(body["messages"])
    assert again == anthropic.parse_request(conversation(3))


def test_a_value_of_another_type_or_keys_in_another_order_are_parsed_again() -> None:
    """Decoded JSON compares ``1 == true`` and ignores key order; the memo does neither."""
    memo = ParseMemo()
    body = conversation(2)
    anthropic.parse_request(body, memo)
    retyped = copy.deepcopy(body)
    retyped["messages"][1]["content"][0]["input"]["timeout"] = True
    assert retyped["messages"][1] == body["messages"][1]  # what plain equality would reuse
    reparsed = parsed_with(memo, retyped)
    assert memo.reused == len(body["messages"]) - 1
    assert isinstance(reparsed, NeutralRequest)
    assert '"timeout":true' in reparsed.prompt.messages[2].tool_calls[0].arguments
    memo = ParseMemo()
    anthropic.parse_request(body, memo)
    reordered = copy.deepcopy(body)
    reordered["messages"][1]["content"][0]["input"] = {"timeout": 1, "command": "cat file_0.py"}
    assert reordered["messages"][1] == body["messages"][1]
    reused = memo.reused
    reordered_parse = parsed_with(memo, reordered)
    assert isinstance(reordered_parse, NeutralRequest)
    arguments = reordered_parse.prompt.messages[2].tool_calls[0].arguments
    assert arguments.index("timeout") < arguments.index("command")
    assert memo.reused == reused + len(body["messages"]) - 1


def test_a_message_read_in_another_state_is_parsed_again_and_refused() -> None:
    """A tool result is checked against the call before it: the same result after another call
    is refused, although its own JSON is the one that parsed before."""
    memo = ParseMemo()
    body = conversation(1)
    anthropic.parse_request(body, memo)
    other_call = copy.deepcopy(body)
    other_call["messages"][1]["content"][0]["id"] = "toolu_other"
    refused = parsed_with(memo, other_call)
    assert isinstance(refused, AdapterError)
    assert refused.message.startswith("messages.2.content.0: unexpected `tool_use_id`")


def test_a_refused_request_leaves_the_memo_as_it_was() -> None:
    memo = ParseMemo()
    anthropic.parse_request(conversation(2), memo)
    broken = conversation(3)
    broken["messages"][0]["content"] = "Another task."  # would displace the memo's first message
    broken["messages"][-1]["content"][0]["tool_use_id"] = "toolu_nobody"
    with pytest.raises(AdapterError):
        anthropic.parse_request(broken, memo)
    reused = memo.reused
    anthropic.parse_request(conversation(3), memo)
    assert memo.reused - reused == len(conversation(2)["messages"])


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(1, 4),  # turns
            st.integers(0, 8),  # which message to touch
            st.sampled_from(["none", "retype", "reorder", "rename_call", "text", "drop"]),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_any_sequence_of_requests_parses_as_a_fresh_parse_would(
    steps: list[tuple[int, int, str]],
) -> None:
    memo = ParseMemo()
    for turns, index, edit in steps:
        body = conversation(turns)
        messages = body["messages"]
        target = messages[index % len(messages)]
        content = target["content"]
        if edit == "retype" and isinstance(content, list) and content[0]["type"] == "tool_use":
            content[0]["input"]["timeout"] = 1.0
        elif edit == "reorder" and isinstance(content, list) and content[0]["type"] == "tool_use":
            content[0]["input"] = dict(reversed(list(content[0]["input"].items())))
        elif edit == "rename_call" and isinstance(content, list) and "id" in content[0]:
            content[0]["id"] += "x"
        elif edit == "text":
            target["content"] = "changed" if isinstance(content, str) else content
        elif edit == "drop" and len(messages) > 2:
            del messages[index % len(messages)]
        parsed_with(memo, body)


def test_chat_completions_reuses_a_resent_conversation_too() -> None:
    def chat(turns: int) -> dict[str, Any]:
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix it."}]
        for i in range(turns):
            function = {"name": "bash", "arguments": json.dumps({"cmd": f"ls {i}"})}
            messages.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": f"c{i}", "type": "function", "function": function}],
                }
            )
            messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": f"out {i}"})
        return {"model": "m", "messages": messages}

    memo = ParseMemo()
    openai_chat.parse_request(chat(2), memo)
    again = openai_chat.parse_request(chat(3), memo)
    assert memo.reused == len(chat(2)["messages"])
    assert again == openai_chat.parse_request(chat(3))


async def test_a_large_body_is_parsed_without_the_memo_and_leaves_it_as_it_was() -> None:
    """Past the large-body threshold the memo would hold as much again as the body: not used."""
    workers = Workers(LargeBodies(threshold=INLINE_BYTES), threads=2)
    try:
        memo = ParseMemo()
        small = json.dumps(conversation(2)).encode()
        await workers.decode("anthropic", small, memo)
        big = conversation(3)
        big["messages"][-1]["content"][0]["content"] = "x" * (INLINE_BYTES + 1)
        parsed = await workers.decode("anthropic", json.dumps(big).encode(), memo)
        assert parsed.prompt == anthropic.parse_request(big).prompt
        assert memo.reused == 0
        await workers.decode("anthropic", json.dumps(conversation(3)).encode(), memo)
        assert memo.reused == len(conversation(2)["messages"])  # the small request's memo
    finally:
        workers.close()
