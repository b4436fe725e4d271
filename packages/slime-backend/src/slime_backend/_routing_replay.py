"""Routing replay: the experts the engine routed each token to, as ``rollout_routed_experts``.

A mixture-of-experts policy trained on its own rollouts drifts unless Megatron routes every
token through the experts SGLang used when it computed the rollout's logprobs (slime's
``--use-rollout-routing-replay``). slime then wants, on every sample of the batch, an integer
array of shape ``(len(tokens) - 1, num_layers, moe_router_topk)``: it tensorizes all of them as
soon as the first sample has one, and refuses an empty capture or a MoE layer that is all zeros.

- A sample whose branch returned routing for every position gets it as trajectory-tree assembled
  it: a numpy int32 view of the packed rows, never Python lists (a 48-layer top-8 model at 100k
  tokens is 38M ids).
- A sample with no routing (the engine returned none), with gaps (positions no call on its
  branch returned), or of another shape than slime's args is refused: it is not trained, and the
  reason names the missing rows. Replaying invented experts would train a router other than the
  one that produced the logprobs.
- A sample slime trains nothing from (an untrainable episode's placeholder) still sits in the
  batch, so it carries filler rows (experts ``0 .. topk-1`` in every layer) of the right shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trajectory_tree import Sample

from ._typed_config import FieldError


@dataclass(frozen=True, slots=True)
class RoutingReplay:
    """slime's ``--num-layers`` and ``--moe-router-topk``, when ``--use-rollout-routing-replay``
    is on: the shape every sample's routing rows must have."""

    layers: int
    topk: int

    def __post_init__(self) -> None:
        for name, value in (("num_layers", self.layers), ("moe_router_topk", self.topk)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise FieldError(name, f"must be a positive int for routing replay, got {value!r}")


class RoutingRefused(ValueError):
    """A sample's routing cannot be replayed; the message says which rows are missing."""


def replay_rows(sample: Sample, replay: RoutingReplay) -> Any:
    """``sample``'s routing as a ``(len(tokens) - 1, layers, topk)`` int32 numpy array, or
    :class:`RoutingRefused`. A sample the length limit truncated has the rows of its kept
    tokens (trajectory-tree cuts them with the tokens)."""
    import numpy

    rows = len(sample.tokens) - 1
    routing = sample.routing
    if routing is None:
        raise RoutingRefused(
            f"no routing for any of its {rows} rows: the engine returned none (SGLang serves "
            "it with --enable-return-routed-experts)"
        )
    if (routing.layers, routing.topk) != (replay.layers, replay.topk):
        raise RoutingRefused(
            f"routing of {routing.layers} layers x top-{routing.topk}, but slime's args say "
            f"--num-layers {replay.layers} --moe-router-topk {replay.topk}"
        )
    if routing.gaps:
        ranges = ", ".join(f"{a}-{b - 1}" for a, b in routing.gaps[:8])
        more = f" and {len(routing.gaps) - 8} more ranges" if len(routing.gaps) > 8 else ""
        raise RoutingRefused(
            f"no routing for rows {ranges}{more} ({routing.missing_rows} of {rows} rows): "
            "no engine call on its branch returned them"
        )
    if routing.rows != rows:
        raise RoutingRefused(f"{routing.rows} routing rows for {len(sample.tokens)} tokens")
    experts = numpy.frombuffer(routing.experts, dtype=numpy.int32)
    return experts.reshape(rows, replay.layers, replay.topk)


def filler_rows(tokens: int, replay: RoutingReplay) -> Any:
    """Rows for a sample slime trains nothing from: experts ``0 .. topk-1`` in every layer, so
    slime's check (no all-zero MoE layer) passes and no expert is picked twice for a token."""
    import numpy

    row = numpy.arange(replay.topk, dtype=numpy.int32)
    return numpy.broadcast_to(row, (max(1, tokens - 1), replay.layers, replay.topk)).copy()
