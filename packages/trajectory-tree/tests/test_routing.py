"""Routing: which part of a request the tree already holds as tokens."""

from __future__ import annotations

import dataclasses

import pytest
from invariants import check_session
from session_kit import (
    TOOLS_A,
    TOOLS_B,
    Session,
    call,
    prompt,
    reply,
    reserialized,
    system,
    tool_result,
    user,
    without_reasoning,
)

from trajectory_tree import (
    Media,
    Message,
    Reasoning,
    Text,
    ToolCall,
    ToolSpec,
    canonical_json,
    same_message,
)

SYS = system("You are a coding agent.")
TASK = user("Fix the failing test in calc.py")
LS = reply("Let me look.", call("c1", "bash", {"cmd": "ls -la", "timeout": 10}), reasoning="ls")


def test_bridge_sends_what_a_full_render_would_when_outputs_follow_the_template() -> None:
    """The kit's bridge is honest: with template-faithful outputs it equals a full render."""
    s = Session()
    history = [SYS, TASK]
    replies = [LS, reply("", call("c2", "read", {"path": "calc.py"})), reply("Done.")]
    for index, answer in enumerate(replies):
        p = prompt(*history)
        s.turn(p, answer)
        assert s.calls[index].input_ids == list(s.fmt.full(p, "check").ids)
        history += [answer, tool_result(f"c{index + 1}", f"output {index}")]
    check_session(s)


def test_first_request_starts_at_a_new_context_root() -> None:
    s = Session()
    route = s.tree.route(prompt(SYS, TASK))
    assert route.anchor.parent is None
    assert (route.matched, route.prefix_length, len(route.prefix_ids())) == (0, 0, 0)
    assert list(route.new_messages) == [SYS, TASK]
    assert route.previous is None
    assert route.previous_generated is None
    assert route.recorded == ()


def test_continuation_routes_onto_the_generated_reply() -> None:
    s = Session()
    first = s.turn(prompt(SYS, TASK), LS)
    route = s.tree.route(prompt(SYS, TASK, LS, tool_result("c1", "calc.py")))
    assert route.previous_generated is first
    assert route.previous is first.reply
    assert route.matched == 3
    assert route.prefix_ids().tolist() == s.calls[0].input_ids + s.calls[0].output_ids
    assert route.prefix_length == len(route.prefix_ids())


@pytest.mark.parametrize(
    "echo",
    [
        pytest.param(reserialized, id="reserialized-arguments-and-signature"),
        pytest.param(without_reasoning, id="reasoning-dropped-by-client"),
        pytest.param(lambda m: reserialized(without_reasoning(m)), id="both"),
    ],
)
def test_client_echo_of_a_reply_routes_as_the_reply(echo: object) -> None:
    assert callable(echo)
    s = Session()
    first = s.turn(prompt(SYS, TASK), LS)
    echoed = echo(LS)
    assert isinstance(echoed, Message)
    assert echoed.key != LS.key, "the echo must really differ byte-wise"
    route = s.tree.route(prompt(SYS, TASK, echoed, tool_result("c1", "calc.py")))
    assert route.previous_generated is first
    assert route.previous is first.reply, "the reply as generated, not its echo"
    s.turn(route.prompt, reply("Found it."))
    assert len(s.tree.leaves().__next__().path()) == 6  # root, sys, task, LS, tool, reply
    assert sum(1 for _ in s.tree.leaves()) == 1, "an echo must not branch"
    check_session(s)


def test_tool_argument_key_order_and_whitespace_do_not_matter() -> None:
    a = ToolCall("c1", "bash", '{"cmd": "ls", "env": {"A": 1, "B": [1, 2]}}')
    b = ToolCall("c1", "bash", '{"env":{"B":[1,2],"A":1},"cmd":"ls"}')
    assert canonical_json(a.arguments) == canonical_json(b.arguments)
    assert same_message(Message("assistant", (a,)), Message("assistant", (b,)))


def test_canonical_json_is_compact_sorted_json_that_writes_text_as_itself() -> None:
    assert canonical_json('{"path": "ü/🦜.txt", "a": [1, 2]}') == '{"a":[1,2],"path":"ü/🦜.txt"}'
    assert canonical_json("not json") == "not json"


def test_thinking_signatures_never_take_part_in_equality() -> None:
    signed = Message("assistant", (Reasoning("plan", signature="s1", encrypted="e1"), Text("x")))
    other = Message("assistant", (Reasoning("plan", signature="s2"), Text("x")))
    assert signed == other
    assert signed.key == other.key


def test_reasoning_on_one_side_only_is_ignored_either_way() -> None:
    """A client that drops reasoning echoes a reply without it; a reply recorded without
    reasoning may come back with some. Either way round it is the same message."""
    thought = reply("x", call("c1", "bash", {"cmd": "ls"}), reasoning="plan")
    plain = reply("x", call("c1", "bash", {"cmd": "ls"}))
    assert same_message(thought, plain)
    assert same_message(plain, thought)


def test_messages_with_equal_keys_are_the_same_message() -> None:
    """Routing compares keys first and calls same_message only on a miss: the two must agree,
    or a route would depend on how many children a node has. A key writes no name as "", so
    an empty name is no name."""
    named = dataclasses.replace(tool_result("c1", "ok"), name="")
    assert named.key == tool_result("c1", "ok").key
    assert same_message(named, tool_result("c1", "ok"))
    assert same_message(tool_result("c1", "ok"), named)


def test_a_message_is_no_error_result_unless_flagged() -> None:
    """Adapters build most messages without naming ``is_error``: only a flagged tool result
    is an error."""
    unflagged = Message("tool", (Text("ok"),), tool_call_id="c1")
    assert not unflagged.is_error
    assert unflagged == tool_result("c1", "ok") != tool_result("c1", "ok", error=True)


def test_cache_control_is_absent_from_the_neutral_model() -> None:
    """Adapters drop cache markers while normalizing; nothing in the model can carry one."""
    for cls in (Message, Text, Reasoning, ToolCall, Media):
        names = {f.name for f in dataclasses.fields(cls)}
        assert not any("cache" in name for name in names), cls


@pytest.mark.parametrize(
    ("a", "b"),
    [
        pytest.param(reply("fixed"), reply("fixed."), id="text"),
        pytest.param(
            reply("", call("c1", "bash", {"cmd": "ls"})),
            reply("", call("c9", "bash", {"cmd": "ls"})),
            id="call-id",
        ),
        pytest.param(
            reply("", call("c1", "bash", {"cmd": "ls"})),
            reply("", call("c1", "shell", {"cmd": "ls"})),
            id="tool-name",
        ),
        pytest.param(
            reply("", call("c1", "bash", {"cmd": "ls"})),
            reply("", call("c1", "bash", {"cmd": "ls -a"})),
            id="argument-value",
        ),
        pytest.param(
            reply("", ToolCall("c1", "bash", "{not json")),
            reply("", ToolCall("c1", "bash", "{not  json")),
            id="non-json-arguments-compared-verbatim",
        ),
        pytest.param(reply("x", reasoning="a"), reply("x", reasoning="b"), id="reasoning-text"),
        pytest.param(
            reply("a", call("c1", "bash", {})),
            Message("assistant", (ToolCall("c1", "bash", "{}"), Text("a"))),
            id="block-order",
        ),
        pytest.param(tool_result("c1", "ok"), tool_result("c1", "ok", error=True), id="is-error"),
        pytest.param(tool_result("c1", "ok"), tool_result("c2", "ok"), id="tool-call-id"),
        pytest.param(
            dataclasses.replace(tool_result("c1", "ok"), name="ls"),
            dataclasses.replace(tool_result("c1", "ok"), name="cat"),
            id="tool-result-name",
        ),
        pytest.param(user("hi"), system("hi"), id="role"),
        pytest.param(
            Message("user", (Reasoning("r"), Text("hi"))), user("hi"), id="user-reasoning-counts"
        ),
        pytest.param(
            Message("user", (Text("see"), Media("image/png", "aGk="))),
            Message("user", (Text("see"), Media("image/png", "aG8="))),
            id="media-source",
        ),
        pytest.param(
            Message("user", (Text("see"), Media("image/png", "aGk="))),
            Message("user", (Text("see"), Media("image/jpeg", "aGk="))),
            id="media-type",
        ),
    ],
)
def test_real_differences_are_different_messages(a: Message, b: Message) -> None:
    assert not same_message(a, b)
    assert not same_message(b, a)
    s = Session()
    s.turn(prompt(SYS, TASK), LS)
    s.turn(prompt(SYS, TASK, LS, tool_result("c1", "."), user("?"), a), reply("A"))
    route = s.tree.route(prompt(SYS, TASK, LS, tool_result("c1", "."), user("?"), b))
    assert route.matched == 3, "the last boundary before the difference is the reply"
    s.finish(s.start(route.prompt, reply("B")))
    question = s.tree.node(s.tree.turns[1].node).parent.parent  # type: ignore[union-attr]
    assert question is not None
    assert question.message == user("?")
    assert [c.message for c in question.children] == [a, b], "the difference is a branch"
    check_session(s)


def test_deepest_boundary_skips_routing_only_nodes() -> None:
    """Inside a multi-message chunk only the chunk's last node knows its token prefix."""
    s = Session()
    s.turn(prompt(SYS, TASK), reply("ok"))
    route = s.tree.route(prompt(SYS, user("another task")))
    assert route.anchor.parent is None, "SYS alone has no token boundary"
    assert route.matched == 0
    s.finish(s.start(route.prompt, reply("ok too")))
    root = s.tree.roots[0]
    assert len(root.children) == 1, "the routing-only SYS node is shared, not duplicated"
    assert len(root.children[0].children) == 2
    check_session(s)


def test_route_stops_at_the_last_boundary_before_a_mismatch() -> None:
    s = Session()
    s.turn(prompt(SYS, TASK), LS)
    note = user("note")
    s.turn(prompt(SYS, TASK, LS, tool_result("c1", "a.py"), note), reply("next"))
    route = s.tree.route(prompt(SYS, TASK, LS, tool_result("c1", "a.py"), user("other")))
    assert route.matched == 3, "the tool result was routing-only inside [tool, note]"
    assert route.previous_generated is s.tree.turns[0]
    check_session(s)


def test_most_recently_touched_child_wins() -> None:
    """Two children matching the same message: the lineage extended last is the live one."""
    s = Session()
    answer = reply("same text")
    s.turn(prompt(SYS, TASK), answer)
    # A retry that produced the very same message but different ids (another sampling path).
    retried = s.turn(prompt(SYS, TASK), answer, output=[*b"same", *b" text", 257, 257])
    follow = prompt(SYS, TASK, answer, user("go on"))
    assert s.tree.route(follow).previous_generated is retried
    check_session(s)


def test_touching_through_record_moves_routing_to_that_lineage() -> None:
    s = Session()
    answer = reply("same text")
    s.turn(prompt(SYS, TASK), answer)
    on_first = s.start(prompt(SYS, TASK, answer, user("a")), reply("on the first lineage"))
    s.turn(prompt(SYS, TASK), answer, output=[*b"same text", 257, 257])
    follow = prompt(SYS, TASK, answer, user("b"))
    assert s.tree.route(follow).previous_generated is s.tree.turns[1]
    s.finish(on_first)  # routed before the retry existed: extends the first lineage
    assert s.tree.route(follow).previous_generated is s.tree.turns[0]
    check_session(s)


@pytest.mark.parametrize(
    "other",
    [
        pytest.param(prompt(SYS, TASK, tools=TOOLS_B), id="fewer-tools"),
        pytest.param(prompt(SYS, TASK, tools=tuple(reversed(TOOLS_A))), id="tool-order"),
        pytest.param(prompt(SYS, TASK, tools=()), id="no-tools"),
        pytest.param(prompt(SYS, TASK, enable_thinking="false"), id="options"),
    ],
)
def test_tools_and_options_choose_the_context_root(other: object) -> None:
    s = Session()
    s.turn(prompt(SYS, TASK), LS)
    route = s.tree.route(other)  # type: ignore[arg-type]
    assert route.matched == 0
    assert route.anchor is not s.tree.roots[0]
    assert route.anchor.parent is None
    s.finish(s.start(route.prompt, reply("other context")))
    assert len(s.tree.roots) == 2
    assert s.calls[1].input_ids == list(s.fmt.full(route.prompt, "check").ids)
    check_session(s)


def test_option_order_does_not_matter() -> None:
    s = Session()
    s.turn(prompt(SYS, TASK, a="1", b="2"), reply("x"))
    route = s.tree.route(prompt(SYS, TASK, b="2", a="1"))
    assert route.matched == 2
    assert len(s.tree.roots) == 1


@pytest.mark.parametrize("siblings", [1, 2], ids=["only-child", "among-siblings"])
def test_a_different_message_still_branches_where_an_echo_matched(siblings: int) -> None:
    """Matching an echo remembers its key on the node, so the next echo is a key hit; a message
    that is not the reply (another call at that position) must still branch there, both when
    the node is its parent's only child (the inlined fast path) and among siblings."""
    s = Session()
    for _ in range(siblings):  # a second answer to the same request makes a sibling
        s.turn(prompt(SYS, TASK), LS)
    echo = reserialized(LS)
    for _ in range(2):  # the first routing matches canonically, the second by the kept key
        route = s.tree.route(prompt(SYS, TASK, echo, tool_result("c1", "calc.py")))
        assert route.matched == 3
        assert route.previous_generated is s.tree.turns[-1]
    other = reply("Let me look.", call("c1", "bash", {"cmd": "rm -rf /", "timeout": 10}))
    assert not same_message(LS, other)
    route = s.tree.route(prompt(SYS, TASK, other, tool_result("c1", "calc.py")))
    assert route.matched == 2, "the other call is not the recorded reply"
    assert route.previous_generated is None
    s.finish(s.start(route.prompt, reply("Found it.")))
    task = s.tree.node(s.tree.turns[0].node).parent
    assert task is not None
    assert [c.message for c in task.children] == [LS] * siblings + [other]
    check_session(s)


def test_boundary_and_generated_nodes() -> None:
    """Token prefixes exist at boundary nodes only: the root, a chunk's last message, a reply."""
    s = Session()
    first = s.turn(prompt(SYS, TASK), LS)
    root = s.tree.roots[0]
    sys_node, task_node, reply_node = s.tree.node(first.node).path()[1:]
    assert (root.is_boundary, root.generated) == (True, False)
    assert (sys_node.is_boundary, sys_node.generated) == (False, False)
    assert (task_node.is_boundary, task_node.generated) == (True, False)
    assert (reply_node.is_boundary, reply_node.generated) == (True, True)
    assert reply_node.turn is first
    assert repr(root) == "Node(0, root, tokens=0, turn=None)"
    assert repr(sys_node) == "Node(1, system, tokens=-, turn=None)"
    assert repr(task_node) == f"Node(2, user, tokens={len(task_node.delta or ())}, turn=None)"
    assert repr(reply_node) == f"Node(3, assistant, tokens={len(reply_node.delta or ())}, turn=0)"


def test_tools_and_options_that_flatten_alike_are_different_contexts() -> None:
    """The context key separates tools from options: tools ("a", "1", "b"), ("2", "c", "3")
    and options a=1, b=2, c=3 hold the same six strings in the same order."""
    tools = (ToolSpec("a", "1", "b"), ToolSpec("2", "c", "3"))
    as_tools = prompt(SYS, TASK, tools=tools)
    as_options = prompt(SYS, TASK, tools=(), a="1", b="2", c="3")
    assert as_tools.context_key() != as_options.context_key()
    s = Session()
    s.turn(as_tools, reply("x"))
    route = s.tree.route(as_options)
    assert route.matched == 0
    assert route.anchor.id < 0, "a context the tree has not seen"
