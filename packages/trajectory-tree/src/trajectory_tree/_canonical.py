"""Canonical message equality: when two differently formatted messages are the same message.

Clients echo our replies back, but not byte for byte: Claude Code re-serializes tool arguments
(schema key order, no whitespace), chat clients drop reasoning, Anthropic clients attach thinking
signatures. Routing must treat those echoes as the message the engine produced, or every turn
would fork. This module is the slow path behind the key comparison in :mod:`messages`.
"""

from __future__ import annotations

import json

from ._messages import Block, Message, Reasoning, ToolCall


def _number(text: str) -> int | float:
    # JavaScript clients (Claude Code) re-serialize 60000.0 as 60000: one JSON number either way.
    value = float(text)
    return int(value) if value.is_integer() and abs(value) < 2**53 else value


def canonical_json(text: str) -> str:
    """JSON text with sorted keys and no insignificant whitespace; the input if it is not JSON.

    Integral floats are written as integers, since a JavaScript client cannot tell them apart.
    """
    try:
        value = json.loads(text, parse_float=_number)
    except (ValueError, RecursionError):
        return text
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def same_arguments(a: str, b: str) -> bool:
    """Tool-call arguments equal as JSON values (key order and whitespace ignored)."""
    return a == b or canonical_json(a) == canonical_json(b)


def _same_block(a: Block, b: Block) -> bool:
    if isinstance(a, ToolCall) and isinstance(b, ToolCall):
        return a.id == b.id and a.name == b.name and same_arguments(a.arguments, b.arguments)
    return a == b


def same_message(a: Message, b: Message) -> bool:
    """Whether ``b`` is ``a`` up to formatting a client may legitimately change.

    Ignored: thinking signatures and encrypted reasoning, tool-argument key order and whitespace,
    and reasoning present on one side only (clients that do not echo reasoning). Everything else
    (text, tool names, call ids, tool results, roles, order of blocks) must match exactly.
    """
    if a.key == b.key:
        return True
    if (a.role, a.tool_call_id, a.is_error, a.name) != (b.role, b.tool_call_id, b.is_error, b.name):
        return False
    a_blocks = a.content
    b_blocks = b.content
    if a.role == "assistant" and (not a.reasoning or not b.reasoning):
        a_blocks = tuple(x for x in a_blocks if not isinstance(x, Reasoning))
        b_blocks = tuple(x for x in b_blocks if not isinstance(x, Reasoning))
    if len(a_blocks) != len(b_blocks):
        return False
    return all(_same_block(x, y) for x, y in zip(a_blocks, b_blocks, strict=True))
