"""One episode as the page shows it: a card (always in the page's index) and its detail (parsed
only when the card is opened).

The detail keeps the tree's own economy: every node's tokens appear once, and a sample is the
list of nodes on its branch plus its spans, exactly as trajectory-tree linearized it (with the
run's conversion options, so the masks shown are the masks trained). Before anything is written
the branch's tokens are checked against the sample's, so the page can never show a token the
sample does not hold. Token ids are decoded once per distinct id.
"""

from __future__ import annotations

import itertools
import json
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slime_backend import ConversionOptions, EpisodeHealth, EpisodeStatus, to_mapping
from swe_rl.run_record import EpisodeEntry, Grading
from trajectory_tree import (
    Linearization,
    Node,
    Sample,
    SessionTree,
    assign_reward,
    linearize,
    loads,
    message_to_dict,
    summarize,
)

from .branches import layout
from .embed import script_json
from .run_dir import TREE_FILE, RunDirError, episode_dir

Decode = Callable[[int], str]

ARTIFACT_BYTES = 256 * 1024
"""How much of each text artifact (diff, grading log, summary) the page embeds."""

ARTIFACTS = (("summary", "summary.json"), ("diff", "diff.patch"), ("grading_log", "grading.log"))

GRADING_SHOWN = ("verdict", "reason", "timed_out", "refused_paths", "tests", "tests_passing")
"""What a card carries of the episode's grading (run.json keeps more: reward, score, ...)."""


class ViewerError(ValueError):
    """An episode the viewer cannot show faithfully; its card shows this message instead."""


@dataclass(frozen=True, slots=True)
class EpisodeView:
    card: dict[str, Any]
    """Header facts for the run's index: identity, outcome, token accounting, alarm flags."""
    detail: str
    """Tree, turns, samples, token texts and artifacts as embeddable JSON (`script_json`),
    parsed by the page only when the card is opened."""


def episode_view(
    entry: EpisodeEntry, run_dir: Path, decode: Decode, options: ConversionOptions
) -> EpisodeView:
    """The card and detail of one episode. Problems with its files become the card's `error`
    (the rest of the run is still shown)."""
    card: dict[str, Any] = {
        "episode_id": entry.episode_id,
        "instance_id": entry.instance_id,
        "group": entry.group,
        "reward": entry.reward,
        "advantage": entry.advantage,
        "status": str(entry.status),
        "reason": entry.reason,
        "grading": _grading_shown(entry.grading),
        "error": None,
        "stats": None,
        "flags": [],
        "stopped": entry.stopped,
    }
    artifacts: dict[str, Any] = {}
    if entry.stopped and not entry.dir:  # the interrupt came first: nothing to show, no alarm
        return EpisodeView(card, script_json({"artifacts": artifacts}))
    try:
        directory = episode_dir(run_dir, entry)
        artifacts = _artifacts(directory)
        tree = _read_tree(directory / TREE_FILE)
        detail = script_json(
            {"artifacts": artifacts, **_tree_detail(tree, entry, decode, options, card)}
        )
    except ValueError as error:  # RunDirError, ViewerError, or a number JSON cannot carry
        known = isinstance(error, RunDirError | ViewerError)
        card.update(error=str(error) if known else f"cannot embed: {error}", stats=None)
        card["flags"] = [_flag("zero_trainable", "trains no token (no readable session tree)")]
        detail = script_json({"artifacts": artifacts})
    return EpisodeView(card, detail)


def _read_tree(path: Path) -> SessionTree:
    try:
        return loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ViewerError(f"{path.name}: missing, so there is nothing to show") from None
    except (OSError, ValueError) as error:  # FormatError and UnicodeDecodeError are ValueErrors
        raise ViewerError(f"{path.name}: {error}") from None


def _tree_detail(
    tree: SessionTree,
    entry: EpisodeEntry,
    decode: Decode,
    options: ConversionOptions,
    card: dict[str, Any],
) -> dict[str, Any]:
    linearization = assign_reward(
        linearize(tree, limit=options.limit),
        entry.reward,
        rollout_id=entry.episode_id,
        policy=options.reward_policy,
    )
    trains = entry.status is not EpisodeStatus.ABORTED  # slime gets a placeholder otherwise
    summary = summarize(tree, linearization)
    trained = sum(s.trained_tokens for s in linearization.samples) if trains else 0
    card["stats"] = {**summary.as_dict(), "trained_tokens": trained}
    card["flags"] = _flags(
        EpisodeHealth(
            entry.status,
            trained,
            summary.tool_calls,
            summary.malformed_tool_calls,
            entry.reason,
            entry.routing_refused,
        )
    )
    samples = [_sample(tree, s) for s in linearization.samples]
    return {
        "trains": trains,
        "tokens": _token_texts(tree, decode),
        "nodes": [_node(node) for node in tree.nodes],
        "turns": _turns(tree, linearization),
        "samples": samples,
        "exclusions": [
            {"turn": e.turn, "reason": str(e.reason), "tokens": e.tokens}
            for e in linearization.exclusions
        ],
        "tools": [t.name for root in tree.roots if root.context for t in root.context.tools],
    }


def _node(node: Node) -> dict[str, Any]:
    return {
        "parent": None if node.parent is None else node.parent.id,
        "message": None if node.message is None else message_to_dict(node.message),
        "tokens": None if node.delta is None else node.delta.tolist(),
        "turn": None if node.turn is None else node.turn.id,
    }


def _turns(tree: SessionTree, linearization: Linearization) -> list[dict[str, Any]]:
    trained_in: dict[int, int] = {}
    context_in: dict[int, list[int]] = {}
    for sample in linearization.samples:
        for span in sample.spans:
            if span.turn is None:
                continue
            if span.trained:
                trained_in[span.turn] = sample.index
            elif sample.index not in context_in.setdefault(span.turn, []):
                context_in[span.turn].append(sample.index)
    excluded: dict[int, list[list[Any]]] = {}
    for exclusion in linearization.exclusions:
        excluded.setdefault(exclusion.turn, []).append([str(exclusion.reason), exclusion.tokens])
    places = layout(tree)
    rows = []
    for turn, place in zip(tree.turns, places, strict=True):
        meta = turn.meta
        rows.append(
            {
                "id": turn.id,
                "node": turn.node,
                "prompt_tokens": turn.prompt_length,
                "output_tokens": turn.output_length,
                "finish": str(turn.finish_reason),
                "agent": meta.agent_id,
                "request_id": meta.request_id,
                "retry_count": meta.retry_count,
                "side_request": meta.side_request,
                "malformed_tool_calls": meta.malformed_tool_calls,
                "started_at": meta.started_at,
                "finished_at": meta.finished_at,
                "weight_version": turn.weight_version,
                "rerendered": turn.rerendered,
                "logprobs": [lp if math.isfinite(lp) else None for lp in turn.output_logprobs],
                "lane": place.lane,
                "parent": place.parent,
                "start": place.start,
                "trained_in": trained_in.get(turn.id),
                "context_in": context_in.get(turn.id, []),
                "excluded": excluded.get(turn.id, []),
                "results": _tool_results(tree, turn.node),
            }
        )
    return rows


def _tool_results(tree: SessionTree, node_id: int) -> dict[str, int]:
    """The node holding each tool call's result: the tool messages that follow the reply (on
    any branch; the first one found for a call id wins)."""
    reply = tree.node(node_id)
    assert reply.message is not None
    wanted = {call.id for call in reply.message.tool_calls}
    found: dict[str, int] = {}
    frontier = deque(reply.children)
    while frontier and len(found) < len(wanted):
        node = frontier.popleft()
        message = node.message
        if message is None or message.role != "tool":
            continue
        call_id = message.tool_call_id
        if call_id in wanted and call_id not in found:
            found[call_id] = node.id
        frontier.extend(node.children)
    return found


def _sample(tree: SessionTree, sample: Sample) -> dict[str, Any]:
    leaf = tree.node(tree.turns[sample.leaf_turn].node)
    path = [node for node in leaf.path() if node.delta is not None]
    branch = itertools.chain.from_iterable(node.delta or () for node in path)
    if list(itertools.islice(branch, len(sample.tokens))) != sample.tokens.tolist():
        raise ViewerError(f"sample {sample.index}: its tokens are not its branch's tokens")
    return {
        "index": sample.index,
        "leaf_turn": sample.leaf_turn,
        "path": [node.id for node in path],
        "length": len(sample.tokens),
        "prompt_length": sample.prompt_length,
        "truncated": sample.truncated,
        "trained_turns": list(sample.trained_turns),
        "trained_tokens": sample.trained_tokens,
        "masked_tokens": {str(r): n for r, n in sorted(sample.masked_tokens().items())},
        "spans": [[s.start, s.end, str(s.reason), s.node, s.turn] for s in sample.spans],
    }


def _token_texts(tree: SessionTree, decode: Decode) -> dict[str, str]:
    ids = set(itertools.chain.from_iterable(n.delta for n in tree.nodes if n.delta is not None))
    texts: dict[str, str] = {}
    for token in sorted(ids):
        text = decode(token)
        if not isinstance(text, str):
            raise ViewerError(f"decode({token}) returned {type(text).__name__}, not text")
        texts[str(token)] = text
    return texts


def _artifacts(directory: Path) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, name in ARTIFACTS:
        path = directory / name
        try:
            with path.open("rb") as file:
                data = file.read(ARTIFACT_BYTES + 1)
                size = path.stat().st_size
        except OSError:
            continue
        text = data[:ARTIFACT_BYTES].decode("utf-8", errors="replace")
        if key == "summary" and len(data) <= ARTIFACT_BYTES:
            text = _pretty_json(text)
        found[key] = {"name": name, "text": text, "bytes": size}
    return found


def _pretty_json(text: str) -> str:
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except ValueError:
        return text


def _flags(health: EpisodeHealth) -> list[dict[str, str]]:
    """This episode's part in each silent-failure gate (the gates' own names)."""
    flags = []
    if health.trained_tokens == 0:
        flags.append(_flag("zero_trainable", "trains no token"))
    if health.ran and health.tool_calls == 0:
        flags.append(_flag("zero_tool_calls", "no well-formed tool call"))
    if health.ran and health.malformed_tool_calls:
        attempts = health.tool_calls + health.malformed_tool_calls
        flags.append(
            _flag(
                "tool_call_parse_failures",
                f"{health.malformed_tool_calls} of {attempts} tool calls malformed",
            )
        )
    if health.aborted:
        flags.append(_flag("aborts", f"aborted ({health.abort_cause}): no reward"))
    if health.environment_failed:
        flags.append(_flag("environment_aborts", "aborted: its task's environment failed"))
    if health.length_dropped:
        flags.append(_flag("length_drops", "every sample dropped by the length limit"))
    if health.routing_refused:
        flags.append(
            _flag(
                "routing_missing",
                f"{health.routing_refused} sample(s) not trained: MoE routing missing for replay",
            )
        )
    return flags


def _flag(gate: str, text: str) -> dict[str, str]:
    return {"gate": gate, "text": text}


def _grading_shown(grading: Grading | None) -> dict[str, Any] | None:
    if grading is None:
        return None
    return {name: to_mapping(getattr(grading, name)) for name in GRADING_SHOWN}
