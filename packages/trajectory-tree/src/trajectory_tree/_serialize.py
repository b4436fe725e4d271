"""A whole tree as JSON and back, losslessly: tokens, logprobs, messages, turns, routing order.

The format is a flat list of nodes in creation order (parents before children), so reading it
back needs no recursion and reproduces node and turn ids exactly. MoE routing, when turns hold
it, lives in a binary sidecar (:mod:`._routing_sidecar`) the JSON points into.
"""

from __future__ import annotations

import json
import math
from array import array
from collections.abc import Mapping
from typing import Any, cast

from ._errors import FormatError, InvalidTurn
from ._messages import Block, Media, Message, Prompt, Reasoning, Role, Text, ToolCall, ToolSpec
from ._reasons import FinishReason, LossReason
from ._routing_sidecar import routing_entry, routing_from_entry, routing_offsets
from ._tree import Node, SessionTree
from ._turns import LOGPROB_ROUNDING, Turn, TurnMeta, check_version_runs

FORMAT = "trajectory-tree/1"


def block_to_dict(block: Block) -> dict[str, Any]:
    if isinstance(block, Text):
        return {"type": "text", "text": block.text}
    if isinstance(block, ToolCall):
        return {
            "type": "tool_call",
            "id": block.id,
            "name": block.name,
            "arguments": block.arguments,
        }
    if isinstance(block, Reasoning):
        out: dict[str, Any] = {"type": "reasoning", "text": block.text}
        if block.signature is not None:
            out["signature"] = block.signature
        if block.encrypted is not None:
            out["encrypted"] = block.encrypted
        return out
    return {"type": "media", "media_type": block.media_type, "source": block.source}


def block_from_dict(data: Mapping[str, Any]) -> Block:
    kind = data.get("type")
    if kind == "text":
        return Text(data["text"])
    if kind == "tool_call":
        return ToolCall(data["id"], data["name"], data["arguments"])
    if kind == "reasoning":
        return Reasoning(data["text"], data.get("signature"), data.get("encrypted"))
    if kind == "media":
        return Media(data["media_type"], data["source"])
    raise FormatError(f"unknown block type {kind!r}")


def message_to_dict(message: Message) -> dict[str, Any]:
    out: dict[str, Any] = {
        "role": message.role,
        "content": [block_to_dict(b) for b in message.content],
    }
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.is_error:
        out["is_error"] = True
    if message.name is not None:
        out["name"] = message.name
    return out


def message_from_dict(data: Mapping[str, Any]) -> Message:
    return Message(
        role=cast(Role, data["role"]),
        content=tuple(block_from_dict(b) for b in data.get("content", ())),
        tool_call_id=data.get("tool_call_id"),
        is_error=bool(data.get("is_error", False)),
        name=data.get("name"),
    )


def _turn_to_dict(turn: Turn, routing_offset: int | None) -> dict[str, Any]:
    meta = turn.meta
    entry: dict[str, Any] = {
        "id": turn.id,
        "prompt_length": turn.prompt_length,
        "output_length": turn.output_length,
        "output_logprobs": turn.output_logprobs.tolist(),
        "finish_reason": str(turn.finish_reason),
        "weight_version": turn.weight_version,
        "rerendered": turn.rerendered,
        "meta": {
            "request_id": meta.request_id,
            "retry_count": meta.retry_count,
            "started_at": meta.started_at,
            "finished_at": meta.finished_at,
            "agent_id": meta.agent_id,
            "side_request": meta.side_request,
            "malformed_tool_calls": meta.malformed_tool_calls,
            "extra": dict(meta.extra),
        },
    }
    if turn.version_runs:
        entry["version_runs"] = [[start, version] for start, version in turn.version_runs]
    if turn.routed_experts is not None and routing_offset is not None:
        entry["routing"] = routing_entry(turn.routed_experts, routing_offset)
    return entry


def tree_to_dict(tree: SessionTree) -> dict[str, Any]:
    """A JSON-ready dict of the whole tree (routing as pointers into :func:`dump_routing`)."""
    offsets = routing_offsets(tree)
    nodes: list[dict[str, Any]] = []
    for node in tree.nodes:
        entry: dict[str, Any] = {
            "parent": None if node.parent is None else node.parent.id,
            "touched": node.touched,
        }
        if node.message is not None:
            entry["message"] = message_to_dict(node.message)
        if node.delta is not None:
            entry["tokens"] = node.delta.tolist()
            entry["spans"] = [[str(r), n] for r, n in node.spans]
        if node.context is not None:
            entry["tools"] = [
                {"name": t.name, "description": t.description, "parameters": t.parameters}
                for t in node.context.tools
            ]
            entry["options"] = dict(node.context.options)
        if node.turn is not None:
            entry["turn"] = _turn_to_dict(node.turn, offsets.get(node.turn.id))
        nodes.append(entry)
    return {"format": FORMAT, "session_id": tree.session_id, "nodes": nodes}


def tree_from_dict(data: Mapping[str, Any], routing: bytes | None = None) -> SessionTree:
    """Rebuild a tree written by :func:`tree_to_dict`; raises :class:`FormatError` if malformed.

    ``routing`` is the sidecar :func:`dump_routing` wrote with it; without one, turns that had
    routing come back without it (and samples name their positions as gaps).
    """
    if data.get("format") != FORMAT:
        raise FormatError(f"not a {FORMAT} document (format={data.get('format')!r})")
    try:
        return _rebuild(data, routing)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError) as exc:
        if isinstance(exc, FormatError):
            raise
        if isinstance(exc, InvalidTurn):
            raise FormatError(f"malformed tree document: {exc}") from exc
        raise FormatError(f"malformed tree document: {exc!r}") from exc


def _rebuild(data: Mapping[str, Any], routing: bytes | None) -> SessionTree:
    tree = SessionTree(str(data.get("session_id", "")))
    nodes: list[Node] = []
    turns: list[Turn] = []
    path_lengths: list[int] = []  # tokens from the root through each node
    clock = 0
    for index, entry in enumerate(data["nodes"]):
        parent_id = entry["parent"]
        if parent_id is not None and not 0 <= parent_id < index:
            raise FormatError(f"node {index} names parent {parent_id}, which does not precede it")
        parent = None if parent_id is None else nodes[parent_id]
        message = message_from_dict(entry["message"]) if "message" in entry else None
        delta = array("i", entry["tokens"]) if "tokens" in entry else None
        spans = tuple((LossReason(r), int(n)) for r, n in entry.get("spans", ()))
        if delta is not None and sum(n for _, n in spans) != len(delta):
            raise FormatError(f"node {index}: spans do not cover its {len(delta)} tokens")
        if delta and min(delta) < 0:
            raise FormatError(f"node {index}: negative token id {min(delta)}")
        path_lengths.append(
            (0 if parent_id is None else path_lengths[parent_id]) + len(delta or ())
        )
        generated = [n for r, n in spans if r is LossReason.GENERATED]
        node = Node(index, parent, message, delta, spans)
        node.touched = int(entry.get("touched", 0))
        clock = max(clock, node.touched)
        if parent is not None:
            parent.children.append(node)
        if parent is None:
            tools = tuple(ToolSpec(**t) for t in entry.get("tools", ()))
            node.context = Prompt((), tools, dict(entry.get("options", {})))
            tree._contexts.append((node.context.context_key(), node))
        if "turn" in entry:
            if message is None or delta is None:
                raise FormatError(f"node {index}: a turn needs a reply message and tokens")
            node.turn = _turn_from_dict(entry["turn"], index, message, routing)
            if len(node.turn.output_logprobs) != node.turn.output_length or (
                node.turn.output_length > len(delta)
            ):
                raise FormatError(f"node {index}: output length disagrees with tokens or logprobs")
            if node.turn.id != len(turns):
                raise FormatError(f"node {index}: turn ids must appear in order")
            turn = node.turn
            if turn.prompt_length + turn.output_length != path_lengths[index]:
                raise FormatError(f"node {index}: prompt and output lengths disagree with the path")
            check_version_runs(turn.version_runs, turn.output_length, turn.weight_version)
            if turn.routed_experts is not None:
                turn.routed_experts.check_fits(turn.prompt_length, turn.output_length)
            if generated != [turn.output_length] or spans[-1][0] is not LossReason.GENERATED:
                raise FormatError(f"node {index}: the output must be the one generated span")
            if any(math.isnan(lp) or lp > LOGPROB_ROUNDING for lp in turn.output_logprobs):
                raise FormatError(f"node {index}: logprobs must be log-probabilities")
            turns.append(node.turn)
        elif generated:
            raise FormatError(f"node {index}: generated tokens without a turn")
        nodes.append(node)
    tree._nodes = nodes
    tree._turns = turns
    tree._clock = clock
    return tree


def _turn_from_dict(
    data: Mapping[str, Any], node: int, reply: Message, routing: bytes | None
) -> Turn:
    meta = data.get("meta", {})
    entry = data.get("routing")
    routed = None
    if entry is not None and routing is not None:
        routed = routing_from_entry(entry, routing, f"node {node}")
    return Turn(
        id=int(data["id"]),
        node=node,
        prompt_length=int(data["prompt_length"]),
        output_length=int(data["output_length"]),
        reply=reply,
        output_logprobs=array("d", data["output_logprobs"]),
        finish_reason=FinishReason(data["finish_reason"]),
        weight_version=data.get("weight_version"),
        meta=TurnMeta(
            request_id=meta.get("request_id", ""),
            retry_count=int(meta.get("retry_count", 0)),
            started_at=float(meta.get("started_at", 0.0)),
            finished_at=float(meta.get("finished_at", 0.0)),
            agent_id=meta.get("agent_id"),
            side_request=bool(meta.get("side_request", False)),
            malformed_tool_calls=int(meta.get("malformed_tool_calls", 0)),
            extra=dict(meta.get("extra", {})),
        ),
        rerendered=data.get("rerendered"),
        version_runs=tuple((int(start), str(v)) for start, v in data.get("version_runs", ())),
        routed_experts=routed,
    )


def dumps(tree: SessionTree) -> str:
    """The tree as compact JSON text that always encodes to UTF-8.

    Text is written as itself, except when some of it is not valid Unicode (a lone surrogate,
    which a client can send as ``"\\ud800"``): then the whole document is written with ASCII
    escapes, which :func:`loads` reads back to the same strings. Serializing never fails on
    client data, so a session's tree cannot be lost at the moment it is saved.
    """
    document = tree_to_dict(tree)
    text = json.dumps(document, ensure_ascii=False, separators=(",", ":"))
    if text.isascii() or _utf8_encodable(text):
        return text
    return json.dumps(document, ensure_ascii=True, separators=(",", ":"))


def _utf8_encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def loads(text: str, routing: bytes | None = None) -> SessionTree:
    """Read :func:`dumps`'s text back (and the routing sidecar, see :func:`tree_from_dict`)."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise FormatError(f"not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise FormatError("a tree document is a JSON object")
    return tree_from_dict(data, routing)
