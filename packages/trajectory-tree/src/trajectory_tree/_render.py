"""A readable text picture of a session tree.

Chains of single children are drawn flat; indentation grows only where the tree branches, so a
2,000-node session stays readable and the walk stays iterative.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ._messages import Message
from ._tree import Node, SessionTree

Decode = Callable[[Sequence[int]], str]


def _preview(message: Message, width: int) -> str:
    parts: list[str] = []
    if message.reasoning:
        parts.append("<think>" + " ".join(r.text for r in message.reasoning))
    if message.plain_text:
        parts.append(message.plain_text)
    parts.extend(f"{c.name}({c.arguments})" for c in message.tool_calls)
    text = " ".join(parts).replace("\n", "\\n")
    return text if len(text) <= width else text[: width - 1] + "…"


def _describe(node: Node, width: int, decode: Decode | None) -> str:
    if node.message is None:
        tools = len(node.context.tools) if node.context is not None else 0
        return f"#{node.id} context ({tools} tools)"
    tokens = "·" if node.delta is None else f"+{len(node.delta)} tok"
    label = f"#{node.id} {node.message.role:<9} {tokens:>10}"
    turn = node.turn
    if turn is not None:
        label += f"  turn {turn.id} out={turn.output_length} {turn.finish_reason}"
        if turn.meta.agent_id:
            label += f" agent={turn.meta.agent_id}"
        if turn.rerendered:
            label += f" [re-rendered: {turn.rerendered}]"
    if decode is not None and node.delta is not None:
        body = decode(node.delta).replace("\n", "\\n")
        return f"{label}  {body[:width]}"
    return f"{label}  {_preview(node.message, width)}"


def render_tree(tree: SessionTree, *, width: int = 72, decode: Decode | None = None) -> str:
    """One line per node; ``decode`` (ids → text) shows tokens instead of message text."""
    lines = [f"session {tree.session_id or '(unnamed)'}: {len(tree.turns)} turns"]
    stack: list[tuple[Node, str, bool]] = [
        (root, "", i == len(tree.roots) - 1) for i, root in reversed(list(enumerate(tree.roots)))
    ]
    while stack:
        node, indent, last = stack.pop()
        lines.append(f"{indent}{'└─' if last else '├─'} {_describe(node, width, decode)}")
        child_indent = indent + ("   " if last else "│  ")
        children = node.children
        while len(children) == 1:
            node = children[0]
            lines.append(f"{child_indent}   {_describe(node, width, decode)}")
            children = node.children
        stack.extend(
            (children[i], child_indent, i == len(children) - 1)
            for i in reversed(range(len(children)))
        )
    return "\n".join(lines)
