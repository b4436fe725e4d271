"""The text picture of a tree: readable for branching trees and for very long sessions."""

from __future__ import annotations

import sys

from invariants import check_session
from session_kit import Session, call, decode, prompt, reply, system, tool_result, user

from trajectory_tree import (
    BridgedPrompt,
    Completion,
    FinishReason,
    LossReason,
    Message,
    Segment,
    SessionTree,
    TurnMeta,
    dumps,
    linearize,
    loads,
    render_tree,
)


def branching() -> Session:
    s = Session()
    s.tree.session_id = "ep-3"
    main = [system("main"), user("fix it")]
    ls = reply("look", call("c1", "bash", {"cmd": "ls"}))
    s.turn(prompt(*main), ls, meta=TurnMeta(agent_id="main"))
    s.turn(prompt(*main, ls, tool_result("c1", "a.py\nb.py")), reply("done"))
    s.turn(prompt(*main), reply("retry"))
    s.turn(prompt(system("sub"), user("help")), reply("x" * 200), meta=TurnMeta(agent_id="a1"))
    s.turn(prompt(*main), reply("ab"), output=[*b"ab"], finish=FinishReason.ABORT)
    return s


def test_branching_tree_picture() -> None:
    s = branching()
    text = render_tree(s.tree)
    lines = text.splitlines()
    assert lines[0] == "session ep-3: 5 turns"
    assert len(lines) == len(s.tree.nodes) + 1, "one line per node"
    for node in s.tree.nodes:
        assert sum(1 for line in lines if f"#{node.id} " in line) == 1
    assert "turn 0 out=" in text
    assert "agent=main" in text
    assert "agent=a1" in text
    assert "abort" in text
    assert "look bash(" in text
    assert "a.py\\nb.py" in text, "newlines are escaped"
    assert max(len(line) for line in lines) < 140, "long messages are cut"
    assert "├─" in text
    assert "└─" in text
    check_session(s)


def test_picture_with_decoded_tokens() -> None:
    s = branching()
    text = render_tree(s.tree, decode=decode, width=400)
    assert "<|im_start|>assistant\\n" in text
    assert "<|im_end|>" in text


def test_re_rendered_turns_are_marked() -> None:
    s = Session()
    s.turn(prompt(user("a")), reply("b"))
    s.turn(prompt(user("a"), reply("b"), user("c")), reply("d"), full="template")
    assert "[re-rendered: template]" not in render_tree(s.tree), "this full render extends"
    s2 = Session()
    s2.turn(prompt(user("a")), reply("b"), output=[1])
    s2.turn(prompt(user("a"), reply("b"), user("c")), reply("d"), full="template")
    assert "[re-rendered: template]" in render_tree(s2.tree)


def long_chain(turns: int) -> SessionTree:
    """``turns`` turns of one agent, recorded straight through the tree's API."""
    tree = SessionTree("long")
    messages: list[Message] = [system("s"), user("go")]
    for i in range(turns):
        route = tree.route(prompt(*messages))
        segments = [Segment(LossReason.TOOL_OUTPUT, [i % 256])] if route.new_messages else []
        answer = reply(f"r{i}")
        tree.record(
            route,
            BridgedPrompt(segments, [1, 2]),
            Completion([3, i % 256], [-0.5, -0.25], FinishReason.STOP),
            answer,
        )
        messages += [answer, tool_result(f"t{i}", str(i))]
    return tree


def test_a_2000_turn_chain_stays_flat_and_readable() -> None:
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(200)  # anything recursive over the chain would now fail
    try:
        tree = long_chain(2000)
        text = render_tree(tree)
        lin = linearize(tree)
        again = loads(dumps(tree))
    finally:
        sys.setrecursionlimit(limit)
    lines = text.splitlines()
    assert len(lines) == len(tree.nodes) + 1
    assert max(len(line) - len(line.lstrip(" │├└─")) for line in lines) <= 6, "no staircase"
    assert lines[-1].lstrip().startswith(f"#{len(tree.nodes) - 1} assistant")
    assert [x.trained_turns for x in lin.samples] == [tuple(range(2000))]
    assert dumps(again) == dumps(tree)
