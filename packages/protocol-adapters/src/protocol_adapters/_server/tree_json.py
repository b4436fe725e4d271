"""A session tree's JSON for the admin API, written without holding the event loop.

A 200-turn Claude Code session holds about a million tokens; its JSON is ~10 MB and
``json.dumps`` writes it in one C call that keeps the GIL for a third of a second, on a worker
thread as much as on the loop, while every other session's tokens wait. So the loop takes only
a snapshot of the tree (:meth:`~trajectory_tree.SessionTree.snapshot`: the links, O(nodes); the
loop may record new turns right after), and a thread turns it into plain data (the token lists,
tens of ms for a million tokens) and writes the text one node at a time: the loop gets the GIL
back between nodes.

The text is the same document :func:`trajectory_tree.dumps` writes, with every non-ASCII
character escaped, so it is valid UTF-8 whatever the client sent (a lone surrogate included);
:func:`trajectory_tree.loads` reads it back to the same tree.
"""

from __future__ import annotations

import asyncio
import json

from trajectory_tree import SessionTree, dump_routing, tree_to_dict


async def tree_json(tree: SessionTree) -> str:
    """The tree's JSON document (see the module docstring)."""
    return await asyncio.to_thread(_write, tree.snapshot())


async def tree_with_routing(tree: SessionTree) -> tuple[bytes, bytes]:
    """The JSON document as UTF-8 and the MoE routing sidecar it points into, of one snapshot
    (hundreds of MB for a long MoE session: copied and hashed on a worker thread)."""
    snapshot = tree.snapshot()
    return await asyncio.to_thread(lambda: (_write(snapshot).encode(), dump_routing(snapshot)))


def _write(snapshot: SessionTree) -> str:
    document = tree_to_dict(snapshot)
    nodes = document.pop("nodes")
    head = _encode(document)[:-1]  # the other fields, without the closing brace
    separator = "," if document else ""
    return f'{head}{separator}"nodes":[{",".join(map(_encode, nodes))}]}}'


def _encode(value: object) -> str:
    return json.dumps(value, ensure_ascii=True, separators=(",", ":"))
