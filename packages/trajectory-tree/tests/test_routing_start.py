"""Where a call asks routing from agrees with where the tree records it: a prompt the tree puts
below the route's anchor asks only past the branch's routed prefix, one it starts a lineage with
at the root asks from 0 (and the sample it ends then has no gap)."""

from __future__ import annotations

from array import array

import pytest

from trajectory_tree import (
    BridgedPrompt,
    Completion,
    FinishReason,
    FullPrompt,
    Message,
    Prompt,
    RoutedExperts,
    SessionTree,
    linearize,
)

USER = Message.text("user", "a")
REPLY = Message.text("assistant", "x")
MORE = Message.text("user", "b")


def first_turn() -> SessionTree:
    """One turn: prompt ``1 2 3 9`` (9 the generation prompt), output ``5 6``, routing for
    positions 0..4."""
    tree = SessionTree()
    route = tree.route(Prompt((USER,)))
    routing = RoutedExperts(0, 1, 1, array("i", [0, 1, 2, 3, 4]))
    completion = Completion([5, 6], [-0.1, -0.1], FinishReason.STOP, routed_experts=routing)
    tree.record(route, FullPrompt([1, 2, 3, 9], 1, "test"), completion, REPLY)
    return tree


@pytest.mark.parametrize(
    ("messages", "ids", "below_anchor"),
    [
        ((USER, REPLY, MORE), [1, 2, 3, 9, 5, 6, 7, 9], True),  # extends the path
        ((USER, REPLY, MORE), [1, 2, 4, 9, 5, 6, 7, 9], False),  # history re-rendered
        ((USER, REPLY), [1, 2, 3, 9, 5, 6, 9], True),  # the path itself, a new generation prompt
        ((USER, REPLY), [1, 2, 3, 9, 5, 6, 8, 9], False),  # longer, yet no new message
    ],
)
def test_a_full_prompt_asks_from_where_the_tree_will_attach_it(
    messages: tuple[Message, ...], ids: list[int], below_anchor: bool
) -> None:
    tree = first_turn()
    route = tree.route(Prompt(messages))
    prompt = FullPrompt(ids, 1, "test")
    start = tree.routing_start(route, prompt)
    assert start == (5 if below_anchor else 0)
    # One output token: the engine returns rows from ``start`` to the end of the prompt.
    routing = RoutedExperts(start, 1, 1, array("i", range(len(ids) - start)))
    completion = Completion([7], [-0.1], FinishReason.STOP, routed_experts=routing)
    turn = tree.record(route, prompt, completion, REPLY)
    assert (turn.rerendered is None) == below_anchor
    (sample,) = [s for s in linearize(tree).samples if s.leaf_turn == turn.id]
    assert sample.routing is not None
    assert sample.routing.gaps == ()


def test_a_bridged_prompt_asks_past_the_routed_prefix() -> None:
    tree = first_turn()
    route = tree.route(Prompt((USER, REPLY, MORE)))
    assert tree.routing_start(route, BridgedPrompt((), [9])) == 5
