"""From a session tree to loss-masked training samples.

One sample per leaf: its tokens are exactly the leaf turn's prompt ids followed by its output ids.
Every generated span on the way is trained in exactly one sample and masked with
``trained_in_other_sample`` everywhere else: the sample of the first leaf, in turn order, of the
same agent as the turn that generated it (a sub-agent that starts from a copy of its parent's
history, as a fork does, never takes the parent's turns, so a reward per sample credits each
agent with its own work), or, where no leaf of that agent reaches it, of the first leaf that does.
Output the trainer must not learn from (aborted generations, abandoned retries, side requests,
tokens past the length limit) is never trained and is listed in
:attr:`Linearization.exclusions` with its reason, so the token accounting of a session always
adds up.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from ._reasons import FinishReason, LossReason
from ._routing import SampleRouting, assemble
from ._tree import Node, SessionTree
from ._turns import HISTORY_DROPPED


class LengthMode(StrEnum):
    TRUNCATE = "truncate"
    """Keep the first ``max_tokens`` tokens; generated tokens past them are excluded."""
    DROP = "drop"
    """Drop the whole sample; the generated tokens it would have trained are excluded, unless a
    shorter branch through the same turns fits and trains them."""


@dataclass(frozen=True, slots=True)
class LengthLimit:
    max_tokens: int
    mode: LengthMode = LengthMode.TRUNCATE

    def __post_init__(self) -> None:
        if self.max_tokens <= 0:
            raise ValueError("max_tokens must be positive")
        object.__setattr__(self, "mode", LengthMode(self.mode))  # a plain "drop" means DROP


@dataclass(frozen=True, slots=True)
class Span:
    """``tokens[start:end]`` of a sample share one reason; ``turn`` is set on generated spans."""

    start: int
    end: int
    reason: LossReason
    node: int
    turn: int | None = None

    @property
    def trained(self) -> bool:
        return self.reason is LossReason.GENERATED

    def __len__(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class Sample:
    """One training sequence with its loss mask and logprobs aligned token for token.

    ``prompt_length`` is the index of the first trained token; ``logprobs`` is the engine's
    logprob wherever the engine generated the token and 0.0 elsewhere.
    """

    index: int
    tokens: array[int]
    loss_mask: array[int]
    logprobs: array[float]
    prompt_length: int
    spans: tuple[Span, ...]
    leaf_turn: int
    trained_turns: tuple[int, ...]
    truncated: bool = False
    reward: float | None = None
    rollout_id: str | None = None
    routing: SampleRouting | None = None
    """The experts each token but the last was routed to, when the engine captured routing."""

    @property
    def response_length(self) -> int:
        return len(self.tokens) - self.prompt_length

    @property
    def trained_tokens(self) -> int:
        return sum(len(s) for s in self.spans if s.trained)

    def masked_tokens(self) -> dict[LossReason, int]:
        counts: dict[LossReason, int] = {}
        for span in self.spans:
            if not span.trained:
                counts[span.reason] = counts.get(span.reason, 0) + len(span)
        return counts


@dataclass(frozen=True, slots=True)
class Exclusion:
    """Generated tokens of ``turn`` that no sample trains, and why."""

    turn: int
    reason: LossReason
    tokens: int


@dataclass(frozen=True, slots=True)
class Linearization:
    samples: tuple[Sample, ...]
    exclusions: tuple[Exclusion, ...] = field(default=())

    def excluded_tokens(self) -> dict[LossReason, int]:
        counts: dict[LossReason, int] = {}
        for ex in self.exclusions:
            counts[ex.reason] = counts.get(ex.reason, 0) + ex.tokens
        return counts


def turn_exclusions(tree: SessionTree) -> dict[int, LossReason]:
    """Turns whose whole output is never trained, by turn id.

    A generated leaf is an abandoned retry when another answer to the very same prompt (a sibling
    under the same parent, from the same agent) was touched later: recorded later, or continued
    later by the client. The order in which the answers arrived does not matter (a client may
    retry and then continue the first answer, and concurrent identical requests finish in any
    order): whichever answer the client used last is the lineage it kept.
    """
    excluded: dict[int, LossReason] = {}
    for turn in tree.turns:
        if turn.finish_reason is FinishReason.ABORT:
            excluded[turn.id] = LossReason.ABORTED
        elif turn.meta.side_request:
            excluded[turn.id] = LossReason.SIDE_REQUEST
        elif HISTORY_DROPPED in turn.meta.extra:
            excluded[turn.id] = LossReason.HISTORY_DROPPED
    for node in tree.nodes:
        answers = [(child, child.turn) for child in node.children if child.turn is not None]
        for leaf, turn in answers:
            if leaf.children or turn.id in excluded:
                continue
            # Only the same agent asking again is a retry: two sub-agents may send identical
            # first requests, and each answer is that agent's own work.
            if any(
                other.touched > leaf.touched and answer.meta.agent_id == turn.meta.agent_id
                for other, answer in answers
            ):
                excluded[turn.id] = LossReason.ABANDONED_RETRY
    return excluded


def linearize(tree: SessionTree, *, limit: LengthLimit | None = None) -> Linearization:
    """Turn every branch of ``tree`` into a sample; see the module docstring for the rules."""
    excluded = turn_exclusions(tree)
    leaves = [n for n in tree.leaves() if n.turn is not None]
    # Live leaves claim shared generated spans first; excluded leaves only pick up what no live
    # branch reaches (a session whose last turn was aborted still trains its earlier turns).
    leaves.sort(key=lambda n: (_turn_id(n) in excluded, _turn_id(n)))

    paths = [leaf.path() for leaf in leaves]
    # Leaves not yet processed that are of the agent whose turn generated a node, by node.
    own_agent: dict[int, set[int]] = {}
    for index, (leaf, path) in enumerate(zip(leaves, paths, strict=True)):
        agent = _agent(leaf)
        for node in path:
            if node.turn is not None and node.turn.meta.agent_id == agent:
                own_agent.setdefault(node.id, set()).add(index)
    claimed: set[int] = set()
    dropped: dict[int, Exclusion] = {}  # by turn: over-length output no kept sample trained yet
    samples: list[Sample] = []
    exclusions = [
        Exclusion(turn.id, excluded[turn.id], turn.output_length)
        for turn in tree.turns
        if turn.id in excluded and turn.output_length
    ]
    for index, (leaf, path) in enumerate(zip(leaves, paths, strict=True)):
        agent = _agent(leaf)
        owned = [
            n.id
            for n in path
            if n.turn is not None
            and n.turn.id not in excluded
            and n.id not in claimed
            and n.turn.output_length
            and (n.turn.meta.agent_id == agent or not own_agent.get(n.id))
        ]
        for node in path:
            own_agent.get(node.id, set()).discard(index)
        if not owned:
            continue
        sample = _build(tree, len(samples), path, set(owned), excluded, _turn_id(leaf))
        if limit is not None and len(sample.tokens) > limit.max_tokens:
            kept, lost = _apply_limit(sample, limit)
            if kept is None and limit.mode is LengthMode.DROP:
                # Left unclaimed: a shorter branch through the same turns may still train them.
                dropped.update((ex.turn, ex) for ex in lost)
                continue
            claimed.update(owned)
            exclusions.extend(lost)
            if kept is None:
                continue
            sample = kept
        claimed.update(owned)
        samples.append(sample)
    exclusions.extend(ex for ex in dropped.values() if tree.turns[ex.turn].node not in claimed)
    return Linearization(tuple(samples), tuple(exclusions))


def _agent(leaf: Node) -> str | None:
    assert leaf.turn is not None
    return leaf.turn.meta.agent_id


def _turn_id(node: Node) -> int:
    assert node.turn is not None
    return node.turn.id


def _build(
    tree: SessionTree,
    index: int,
    path: Sequence[Node],
    owned: set[int],
    excluded: dict[int, LossReason],
    leaf_turn: int,
) -> Sample:
    tokens: array[int] = array("i")
    mask: array[int] = array("B")
    logprobs: array[float] = array("d")
    spans: list[Span] = []
    trained_turns: list[int] = []
    for node in path:
        delta = node.delta
        if delta is None:
            continue
        start = len(tokens)
        tokens.extend(delta)
        turn = node.turn
        for reason, length in node.spans:
            if not length:
                continue
            end = start + length
            if reason is LossReason.GENERATED and turn is not None:
                why: LossReason = reason
                if node.id in owned:
                    mask.frombytes(b"\x01" * length)
                    trained_turns.append(turn.id)
                else:
                    mask.frombytes(bytes(length))
                    why = excluded.get(turn.id, LossReason.TRAINED_IN_OTHER_SAMPLE)
                logprobs.extend(turn.output_logprobs)
                spans.append(Span(start, end, why, node.id, turn.id))
            else:
                mask.frombytes(bytes(length))
                logprobs.frombytes(bytes(8 * length))
                spans.append(Span(start, end, reason, node.id))
            start = end
    prompt_length = next(s.start for s in spans if s.trained)
    routing = assemble([n.turn.routed_experts for n in path if n.turn is not None], len(tokens))
    return Sample(
        index=index,
        tokens=tokens,
        loss_mask=mask,
        logprobs=logprobs,
        prompt_length=prompt_length,
        spans=tuple(spans),
        leaf_turn=leaf_turn,
        trained_turns=tuple(trained_turns),
        routing=routing,
    )


def _apply_limit(sample: Sample, limit: LengthLimit) -> tuple[Sample | None, list[Exclusion]]:
    cut = limit.max_tokens
    if limit.mode is LengthMode.DROP:
        return None, [Exclusion(s.turn, LossReason.OVER_LENGTH, len(s)) for s in _trained(sample)]
    lost = [
        Exclusion(s.turn, LossReason.OVER_LENGTH, s.end - max(s.start, cut))
        for s in _trained(sample)
        if s.end > cut
    ]
    spans = tuple(
        Span(s.start, min(s.end, cut), s.reason, s.node, s.turn)
        for s in sample.spans
        if s.start < cut
    )
    if not any(s.trained for s in spans):
        return None, lost
    kept = Sample(
        index=sample.index,
        tokens=sample.tokens[:cut],
        loss_mask=sample.loss_mask[:cut],
        logprobs=sample.logprobs[:cut],
        prompt_length=sample.prompt_length,
        spans=spans,
        leaf_turn=sample.leaf_turn,
        trained_turns=tuple(
            dict.fromkeys(s.turn for s in spans if s.trained and s.turn is not None)
        ),
        truncated=True,
        routing=None if sample.routing is None else sample.routing.truncated(cut),
    )
    return kept, lost


def _trained(sample: Sample) -> Iterable[_TrainedSpan]:
    for span in sample.spans:
        if span.trained and span.turn is not None:
            yield _TrainedSpan(span.start, span.end, span.turn)


@dataclass(frozen=True, slots=True)
class _TrainedSpan:
    start: int
    end: int
    turn: int

    def __len__(self) -> int:
        return self.end - self.start
