"""Where each turn goes in the branch diagram: one row per line of work, time from left to right.

A turn *continues* the nearest generated turn above it in the tree (its prompt holds that turn's
output). Each turn with continuations hands its row to one heir, the continuation with the most
turns after it (the later one on a tie), so the lineage the client kept runs straight, and every
other continuation (an aborted attempt, an abandoned retry, an edited history) starts a row of
its own. Turns that continue nothing start a new conversation at the tree's root: the first
turn, each sub-agent, each restart after a compaction. A new row reuses the lowest row whose
line ended before the previous turn, so the diagram stays about as tall as the number of lines
alive at once.

Each row start carries a factual label: what the tree says about it, never a guess about why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from trajectory_tree import SessionTree


@dataclass(frozen=True, slots=True)
class Place:
    """A turn's position: `lane` is its row, `parent` the turn it continues (if any), and
    `start` the label of the line it starts (None when it continues its parent's row)."""

    lane: int
    parent: int | None
    start: str | None


def continued_turns(tree: SessionTree) -> list[int | None]:
    """For each turn, the turn it continues: the nearest generated node above its own."""
    nearest: list[int | None] = []  # by node id: the nearest generated node at or above it
    for node in tree.nodes:  # parents precede children
        if node.turn is not None:
            nearest.append(node.id)
        else:
            nearest.append(None if node.parent is None else nearest[node.parent.id])
    parents: list[int | None] = []
    for turn in tree.turns:
        above = tree.node(turn.node).parent
        generated = None if above is None else nearest[above.id]
        parents.append(None if generated is None else _turn_of(tree, generated))
    return parents


def layout(tree: SessionTree) -> tuple[Place, ...]:
    """A place for every turn of `tree`, by turn id."""
    turns = tree.turns
    parents = continued_turns(tree)
    size = [1] * len(turns)
    heir: list[int | None] = [None] * len(turns)
    for turn in reversed(range(len(turns))):  # a continuation is recorded after its parent
        parent = parents[turn]
        if parent is not None:
            size[parent] += size[turn]
    for turn, parent in enumerate(parents):
        if parent is not None:
            best = heir[parent]
            if best is None or size[turn] >= size[best]:
                heir[parent] = turn
    line_end = list(range(len(turns)))
    for turn in reversed(range(len(turns))):
        child = heir[turn]
        if child is not None:
            line_end[turn] = line_end[child]

    busy_until: list[int] = []  # by lane: the last turn of the line that holds it
    places: list[Place] = []
    for turn, parent in enumerate(parents):
        if parent is not None and heir[parent] == turn:
            places.append(Place(places[parent].lane, parent, None))
            continue
        # A free row is taken only after a gap of one turn, so a new line never looks like
        # the continuation of the line that ended just before it.
        lane = next((i for i, end in enumerate(busy_until) if end < turn - 1), len(busy_until))
        if lane == len(busy_until):
            busy_until.append(line_end[turn])
        else:
            busy_until[lane] = line_end[turn]
        places.append(Place(lane, parent, _start_label(tree, turn, parent, parents)))
    return tuple(places)


def _start_label(
    tree: SessionTree, turn: int, parent: int | None, parents: Sequence[int | None]
) -> str:
    agent = tree.turns[turn].meta.agent_id
    if parent is None:
        # The adapter records an agent id only for sub-agents (the CLI's agent-id header).
        first_of_agent = all(tree.turns[t].meta.agent_id != agent for t in range(turn))
        if first_of_agent:
            return "main agent" if agent is None else f"sub-agent {agent}"
        return "new history" if agent is None else f"new history of {agent}"
    prompt_node = tree.node(tree.turns[turn].node).parent
    same_prompt = [
        t
        for t in range(len(parents))
        if t != turn
        and parents[t] == parent
        and tree.node(tree.turns[t].node).parent is prompt_node
    ]
    if same_prompt:
        return f"same prompt as turn {same_prompt[0]}"
    return f"fork from turn {parent}"


def _turn_of(tree: SessionTree, node_id: int) -> int:
    turn = tree.node(node_id).turn
    assert turn is not None
    return turn.id
