"""The per-session tree: requests routed by message, tokens stored as deltas.

Nodes are messages. A request walks from a context root (one per distinct tool set and rendering
options) matching each of its messages against a child; the engine's reply becomes a *generated*
node holding the generation prompt and the output ids verbatim. Whatever stops matching starts a
branch: sub-agents, compaction restarts, edited histories and retries all fall out of that one rule.

Each node stores only the tokens it adds. A node whose ``delta`` is ``None`` is a routing-only step
inside a multi-message chunk (its tokens are part of the chunk's last node), so token prefixes are
defined only at *boundary* nodes; routing returns the deepest one. The tree is append-only: a
:class:`Route` stays valid while other turns of the same session are recorded, which is what lets a
main agent and its sub-agents interleave without a session lock. It is not thread-safe: use it from
one thread (an event loop).
"""

from __future__ import annotations

import dataclasses
import sys
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from ._bridge import BridgedPrompt, FullPrompt
from ._canonical import same_message
from ._errors import ForeignRoute, InvalidTurn
from ._messages import Message, Prompt
from ._reasons import FinishReason, LossReason
from ._turns import Completion, Turn, TurnMeta

_MAX_ALIASES = 4


class Node:
    """One message in the tree (or a context root, whose ``message`` is ``None``)."""

    __slots__ = (
        "aliases",
        "children",
        "context",
        "delta",
        "id",
        "message",
        "parent",
        "spans",
        "touched",
        "turn",
    )

    def __init__(
        self,
        id: int,
        parent: Node | None,
        message: Message | None,
        delta: array[int] | None,
        spans: tuple[tuple[LossReason, int], ...],
    ) -> None:
        self.id = id
        self.parent = parent
        self.message = message
        self.delta = delta
        self.spans = spans
        self.children: list[Node] = []
        self.touched = 0
        self.turn: Turn | None = None
        self.context: Prompt | None = None
        self.aliases: list[tuple[str, ...]] = []

    @property
    def is_boundary(self) -> bool:
        """Whether the token prefix is known here (the end of a rendered chunk or a reply)."""
        return self.delta is not None

    @property
    def generated(self) -> bool:
        return self.turn is not None

    def path(self) -> list[Node]:
        """Nodes from the context root down to this one (iterative: trees get deep)."""
        nodes: list[Node] = []
        node: Node | None = self
        while node is not None:
            nodes.append(node)
            node = node.parent
        nodes.reverse()
        return nodes

    def matches(self, message: Message) -> bool:
        own = self.message
        if own is None:
            return False
        key = message.key
        if (self.aliases and key in self.aliases) or own.key == key:
            return True
        if same_message(own, message):
            if len(self.aliases) < _MAX_ALIASES:
                self.aliases.append(key)
            return True
        return False

    def __repr__(self) -> str:
        role = "root" if self.message is None else self.message.role
        size = "-" if self.delta is None else len(self.delta)
        return f"Node({self.id}, {role}, tokens={size}, turn={self.turn.id if self.turn else None})"


@dataclass(frozen=True, slots=True)
class Route:
    """Where a request lands: the deepest boundary node its messages reach.

    The renderer renders ``new_messages`` (those after ``anchor``) onto ``prefix_ids()``; the
    message just before them, ``previous``, decides how the template joins the two.
    """

    tree: SessionTree
    prompt: Prompt
    anchor: Node
    matched: int
    prefix_length: int

    @property
    def new_messages(self) -> Sequence[Message]:
        return self.prompt.messages[self.matched :]

    @property
    def previous(self) -> Message | None:
        return self.anchor.message

    @property
    def previous_generated(self) -> Turn | None:
        """The turn whose output ends the prefix, when the prefix ends on engine output."""
        return self.anchor.turn

    @property
    def recorded(self) -> tuple[Turn, ...]:
        """Turns already answered for this exact prompt (a client retry), oldest first."""
        if self.new_messages:
            return ()
        return tuple(c.turn for c in self.anchor.children if c.turn is not None)

    def prefix_ids(self) -> array[int]:
        """The token ids of the matched path, engine output included verbatim."""
        return self.tree.path_ids(self.anchor)


class SessionTree:
    """All turns of one agent session (main agent, sub-agents, compactions, retries)."""

    def __init__(self, session_id: str = "") -> None:
        self.session_id = session_id
        self._nodes: list[Node] = []
        self._contexts: list[tuple[tuple[str, ...], Node]] = []
        self._turns: list[Turn] = []
        self._clock = 0

    # -- reading -------------------------------------------------------------------------------

    @property
    def nodes(self) -> Sequence[Node]:
        return self._nodes

    @property
    def turns(self) -> Sequence[Turn]:
        return self._turns

    @property
    def roots(self) -> list[Node]:
        return [node for _, node in self._contexts]

    def node(self, node_id: int) -> Node:
        return self._nodes[node_id]

    def snapshot(self) -> SessionTree:
        """A copy that later recording leaves as it is, made in O(nodes), not O(tokens).

        Messages, token arrays, prompts and turns never change once recorded, so the copy shares
        them and builds only the links. A live session's tree (a million tokens) can then be
        serialized on a worker thread while the event loop goes on recording turns in it.
        """
        copy = SessionTree(self.session_id)
        twins = copy._nodes
        for node in self._nodes:
            parent = None if node.parent is None else twins[node.parent.id]
            twin = Node(node.id, parent, node.message, node.delta, node.spans)
            twin.touched, twin.turn, twin.context = node.touched, node.turn, node.context
            twin.aliases = list(node.aliases)
            twins.append(twin)
        for node, twin in zip(self._nodes, twins, strict=True):
            twin.children = [twins[child.id] for child in node.children]
        copy._contexts = [(key, twins[root.id]) for key, root in self._contexts]
        copy._turns = list(self._turns)
        copy._clock = self._clock
        return copy

    def leaves(self) -> Iterator[Node]:
        return (n for n in self._nodes if not n.children and n.parent is not None)

    def path_ids(self, node: Node) -> array[int]:
        """Concatenated deltas from the root to ``node``."""
        ids: array[int] = array("i")
        for step in node.path():
            if step.delta is not None:
                ids.extend(step.delta)
        return ids

    def routing_start(self, route: Route, prompt: BridgedPrompt | FullPrompt) -> int:
        """Where the engine call for ``prompt`` should start returning routing: the end of the
        rows its branch already holds, or 0 for a full prompt that does not extend the routed
        path (it is recorded on a branch of its own, from the root)."""
        if isinstance(prompt, BridgedPrompt):
            return min(self.routed_prefix(route.anchor), route.prefix_length + prompt.new_length)
        ids = _as_ids(prompt.ids, "prompt ids")
        history = ids[: len(ids) - prompt.generation_prompt_length]
        if _extends(route, history) is None:
            return 0
        return min(self.routed_prefix(route.anchor), len(ids))

    def routed_prefix(self, node: Node) -> int:
        """How many leading positions of ``node``'s path the calls on it returned routing for,
        without a gap: where the next call on this branch asks the engine to start returning
        routing (SGLang's ``routed_experts_start_len``), so no position is computed twice."""
        covered = sorted(
            (turn.routed_experts.start, turn.routed_experts.end)
            for step in node.path()
            if (turn := step.turn) is not None and turn.routed_experts is not None
        )
        reached = 0
        for start, end in covered:
            if start > reached:
                break
            reached = max(reached, end)
        return reached

    def prompt_ids(self, turn: Turn) -> array[int]:
        """Exactly the ids sent to the engine for ``turn``."""
        node = self._nodes[turn.node]
        ids = self.path_ids(node)
        del ids[turn.prompt_length :]
        return ids

    def output_ids(self, turn: Turn) -> array[int]:
        """Exactly the ids the engine returned for ``turn``."""
        delta = self._nodes[turn.node].delta
        assert delta is not None
        return delta[len(delta) - turn.output_length :]

    def request_messages(self, turn: Turn) -> list[Message]:
        """The conversation the client sent for ``turn`` (as routed; echoes matched canonically)."""
        return [n.message for n in self._nodes[turn.node].path()[1:-1] if n.message is not None]

    def request_context(self, turn: Turn) -> Prompt:
        """Tools and options of ``turn``'s request."""
        root = self._nodes[turn.node].path()[0]
        assert root.context is not None
        return root.context

    # -- routing -------------------------------------------------------------------------------

    def route(self, prompt: Prompt) -> Route:
        """Find the deepest boundary node ``prompt``'s messages reach.

        Where several children match (a retry, a re-rendered lineage), the most recently extended
        one wins: that is the lineage the client is continuing.
        """
        root = self._find_context(prompt)
        matched = 0
        prefix_length = 0
        if root is None:
            anchor = _detached_context(prompt)
        else:
            anchor = node = root
            length = 0
            for index, message in enumerate(prompt.messages):
                # The common case, inlined: one child whose key (or a key already proven to be an
                # echo of it, such as re-serialized tool arguments) is the message's key.
                children = node.children
                key = message.key
                if (
                    len(children) == 1
                    and (only := children[0]).message is not None
                    and (only.message.key == key or (only.aliases and key in only.aliases))
                ):
                    child: Node | None = only
                else:
                    child = _best_child(node, message)
                if child is None:
                    break
                node = child
                if node.delta is not None:
                    length += len(node.delta)
                    anchor, matched, prefix_length = node, index + 1, length
        return Route(self, prompt, anchor, matched, prefix_length)

    def _find_context(self, prompt: Prompt) -> Node | None:
        key = prompt.context_key()
        for existing, node in self._contexts:
            if existing == key:
                return node
        return None

    def _register_context(self, route: Route) -> tuple[Route, bool]:
        """A route that found no context root gets one now, at its first record (or reuses the
        one a concurrent turn registered since); routing alone leaves the tree unchanged."""
        if route.anchor.id >= 0:
            return route, False
        existing = self._find_context(route.prompt)
        if existing is not None:
            return dataclasses.replace(route, anchor=existing), False
        root = self._add(None, None, array("i"), ())
        root.context = route.anchor.context
        self._contexts.append((route.prompt.context_key(), root))
        return dataclasses.replace(route, anchor=root), True

    # -- recording -----------------------------------------------------------------------------

    def record(
        self,
        route: Route,
        prompt: BridgedPrompt | FullPrompt,
        completion: Completion,
        reply: Message,
        meta: TurnMeta | None = None,
    ) -> Turn:
        """Record one model call: what was sent (``prompt``), what came back, what the client saw.

        Returns the new :class:`Turn`. Raises :class:`InvalidTurn` for inconsistent input, in which
        case the tree is unchanged.
        """
        if route.tree is not self:
            raise ForeignRoute("route does not belong to this tree")
        if reply.role != "assistant":
            raise InvalidTurn(f"reply must be an assistant message, got {reply.role!r}")
        try:
            finish_reason = FinishReason(completion.finish_reason)
        except ValueError:
            raise InvalidTurn(f"unknown finish reason {completion.finish_reason!r}") from None
        meta = meta or TurnMeta()
        output = _as_ids(completion.output_ids, "output ids")

        if isinstance(prompt, BridgedPrompt):
            prompt_length = route.prefix_length + prompt.new_length
        else:
            prompt_length = len(prompt.ids)
        if completion.routed_experts is not None:
            completion.routed_experts.check_fits(prompt_length, len(output))

        route, new_root = self._register_context(route)
        try:
            if isinstance(prompt, BridgedPrompt):
                parent, gen_prompt, rerendered = self._attach_bridged(route, prompt)
            else:
                parent, gen_prompt, rerendered = self._attach_full(route, prompt)
        except InvalidTurn:
            if new_root:  # validation precedes every other mutation: only the root to undo
                self._nodes.pop()
                self._contexts.pop()
            raise

        delta = array("i", gen_prompt)
        delta.extend(output)
        spans = (
            (LossReason.TEMPLATE_SCAFFOLD, len(gen_prompt)),
            (LossReason.GENERATED, len(output)),
        )
        node = self._add(parent, reply, delta, spans)
        turn = Turn(
            id=len(self._turns),
            node=node.id,
            prompt_length=prompt_length,
            output_length=len(output),
            reply=reply,
            output_logprobs=array("d", completion.output_logprobs),
            finish_reason=finish_reason,
            weight_version=completion.weight_version,
            meta=meta,
            rerendered=rerendered,
            version_runs=tuple(completion.version_runs),
            routed_experts=completion.routed_experts,
        )
        node.turn = turn
        self._turns.append(turn)
        self._touch(node)
        return turn

    def _attach_bridged(
        self, route: Route, prompt: BridgedPrompt
    ) -> tuple[Node, array[int], str | None]:
        new = route.new_messages
        gen_prompt = _as_ids(prompt.generation_prompt, "generation prompt")
        delta: array[int] = array("i")
        spans: list[tuple[LossReason, int]] = []
        for segment in prompt.segments:
            ids = _as_ids(segment.ids, f"{segment.reason} segment")
            delta.extend(ids)
            if ids:
                spans.append((segment.reason, len(ids)))
        if not new and delta:
            raise InvalidTurn("segments given but the route has no new messages to attach them to")
        parent = self._attach_chunk(route.anchor, new, delta, tuple(spans)) if new else route.anchor
        return parent, gen_prompt, None

    def _attach_full(self, route: Route, prompt: FullPrompt) -> tuple[Node, array[int], str | None]:
        ids = _as_ids(prompt.ids, "prompt ids")
        split = len(ids) - prompt.generation_prompt_length
        history, gen_prompt = ids[:split], ids[split:]
        messages = route.prompt.messages
        if not messages:
            raise InvalidTurn("a prompt needs at least one message")
        rest = _extends(route, history)
        if rest is not None and route.new_messages:
            spans = ((LossReason.CONTEXT, len(rest)),) if rest else ()
            return (
                self._attach_chunk(route.anchor, route.new_messages, rest, spans),
                gen_prompt,
                None,
            )
        if rest is not None:
            return route.anchor, gen_prompt, None
        root = route.anchor.path()[0]
        spans = ((LossReason.RERENDERED_HISTORY, len(history)),) if history else ()
        parent = self._attach_chunk(root, messages, history, spans, reuse=False)
        return parent, gen_prompt, prompt.reason or "prompt ids do not extend the path's tokens"

    def _attach_chunk(
        self,
        at: Node,
        messages: Sequence[Message],
        delta: array[int],
        spans: tuple[tuple[LossReason, int], ...],
        *,
        reuse: bool = True,
    ) -> Node:
        """Add ``messages`` under ``at``; the last one holds the chunk's tokens.

        Routing-only nodes that another turn created concurrently for the same messages are
        reused; a boundary node is reused only when its tokens are the same, otherwise the chunk
        becomes a sibling lineage.
        """
        node = at
        last = len(messages) - 1
        for index, message in enumerate(messages):
            found = None
            if reuse:
                for child in node.children:
                    if child.turn is not None or not child.matches(message):
                        continue
                    if (index < last and child.delta is None) or (
                        index == last and child.delta == delta and child.spans == spans
                    ):
                        found = child
            if found is None:
                if index < last:
                    found = self._add(node, message, None, ())
                else:
                    found = self._add(node, message, delta, spans)
            node = found
        return node

    def _add(
        self,
        parent: Node | None,
        message: Message | None,
        delta: array[int] | None,
        spans: tuple[tuple[LossReason, int], ...],
    ) -> Node:
        node = Node(len(self._nodes), parent, message, delta, spans)
        if parent is not None:
            parent.children.append(node)
        self._nodes.append(node)
        return node

    def _touch(self, node: Node) -> None:
        self._clock += 1
        step: Node | None = node
        while step is not None:
            step.touched = self._clock
            step = step.parent


def _detached_context(prompt: Prompt) -> Node:
    """A stand-in root for a context the tree has not seen (id -1, not part of the tree)."""
    root = Node(-1, None, None, array("i"), ())
    root.context = Prompt((), tuple(prompt.tools), dict(prompt.options))
    return root


def _best_child(node: Node, message: Message) -> Node | None:
    children = node.children
    if len(children) == 1:
        child = children[0]
        return child if child.matches(message) else None
    best: Node | None = None
    for child in children:
        if child.matches(message) and (best is None or child.touched > best.touched):
            best = child
    return best


def _as_ids(values: Sequence[int], what: str) -> array[int]:
    """Token ids as a compact int32 array, rejecting anything that is not a valid id."""
    try:
        ids = values if isinstance(values, array) and values.typecode == "i" else array("i", values)
    except (TypeError, OverflowError) as exc:
        raise InvalidTurn(f"{what}: token ids must be int32 integers ({exc})") from None
    # A negative int32 has its sign bit set: test the top byte of every id at C speed.
    if ids and not ids.tobytes()[_SIGN_BYTE::4].isascii():
        raise InvalidTurn(f"{what}: negative token id {min(ids)}")
    return ids


if array("i").itemsize != 4:  # pragma: no cover - every supported platform has a 32-bit int
    raise ImportError("trajectory-tree stores token ids as 32-bit C ints; this platform has none")
_SIGN_BYTE = 3 if sys.byteorder == "little" else 0


def _extends(route: Route, history: array[int]) -> array[int] | None:
    """What a full prompt's ``history`` adds to the route's path, or ``None`` when it does not
    extend the path (with no new messages it must equal the path exactly)."""
    prefix = route.prefix_ids()
    if route.new_messages:
        if len(prefix) <= len(history) and history[: len(prefix)] == prefix:
            return history[len(prefix) :]
        return None
    return array("i") if history == prefix else None
