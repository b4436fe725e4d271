"""Which experts a mixture-of-experts engine routed each token to, kept for routing replay.

Training a MoE policy on its own rollouts drifts unless the trainer routes each token through
the experts the engine used when it computed the rollout's logprobs ("routing replay"). An
engine that captures routing returns, per call, one row of ``layers x topk`` expert ids for
every position it ran the model on, from a start position it was asked for up to the last
token, which no forward pass ever reads (SGLang: ``meta_info.routed_experts`` for positions
``[routed_experts_start_len, prompt + output - 1)``).

A turn keeps its call's rows as one packed ``array('i')`` (a 64-layer top-8 model at 100k tokens
is 51M ids: never Python lists). A sample's rows, one per token but the last, come for each
position from the first call on the sample's branch that returned it, the call that computed
it: later calls read those positions from the engine's cache. Positions no call on the branch
returned (a cache hit the engine did not report, a turn recorded without capture) are named in
:attr:`SampleRouting.gaps`, never filled with invented experts.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from ._errors import InvalidTurn, TrajectoryError


@dataclass(frozen=True, slots=True)
class RoutedExperts:
    """One engine call's routing: rows for positions ``start .. start + rows - 1`` of its
    prompt-plus-output sequence, row-major ``layers x topk`` expert ids each."""

    start: int
    layers: int
    topk: int
    experts: array[int]

    def __post_init__(self) -> None:
        if self.layers < 1 or self.topk < 1:
            raise InvalidTurn(f"routing needs layers and topk >= 1, got {self.layers}x{self.topk}")
        if self.start < 0:
            raise InvalidTurn(f"routing start {self.start} is negative")
        if self.experts.typecode != "i":
            raise InvalidTurn("routing experts must be array('i') (int32)")
        if len(self.experts) % self.row_size:
            raise InvalidTurn(
                f"{len(self.experts)} expert ids are not whole rows of "
                f"{self.layers} layers x {self.topk}"
            )
        if not _non_negative(self.experts):
            raise InvalidTurn("routing holds a negative expert id")

    @property
    def row_size(self) -> int:
        return self.layers * self.topk

    @property
    def rows(self) -> int:
        return len(self.experts) // self.row_size

    @property
    def end(self) -> int:
        """One past the last position covered."""
        return self.start + self.rows

    def check_fits(self, prompt_length: int, output_length: int) -> None:
        """Raise :class:`InvalidTurn` unless the rows lie within the call's sequence: from at
        most the prompt's end up to, at most, the position before its last token."""
        last = max(0, prompt_length + output_length - 1)
        if self.start > prompt_length:
            raise InvalidTurn(
                f"routing starts at {self.start}, past the prompt's {prompt_length} tokens"
            )
        if self.end > last:
            raise InvalidTurn(
                f"routing covers positions up to {self.end}, past the {last} positions a call of "
                f"{prompt_length} prompt and {output_length} output tokens computes"
            )


@dataclass(frozen=True, slots=True)
class SampleRouting:
    """A sample's routing: one row per token but the last (``len(tokens) - 1`` rows), as slime's
    ``rollout_routed_experts`` wants them. ``gaps`` are ``[start, end)`` position ranges no call
    returned; their rows are zeros and must not be replayed."""

    layers: int
    topk: int
    experts: array[int]
    gaps: tuple[tuple[int, int], ...] = ()

    @property
    def rows(self) -> int:
        return len(self.experts) // (self.layers * self.topk)

    @property
    def complete(self) -> bool:
        return not self.gaps

    @property
    def missing_rows(self) -> int:
        return sum(end - start for start, end in self.gaps)

    def truncated(self, tokens: int) -> SampleRouting:
        """The routing of the sample's first ``tokens`` tokens."""
        rows = max(0, tokens - 1)
        gaps = tuple((a, min(b, rows)) for a, b in self.gaps if a < rows)
        return SampleRouting(
            self.layers, self.topk, self.experts[: rows * self.layers * self.topk], gaps
        )


def assemble(routings: Sequence[RoutedExperts | None], length: int) -> SampleRouting | None:
    """The rows of a ``length``-token sample from its branch's calls, root first (see the
    module docstring); ``None`` when no call on the branch captured routing."""
    captured = [r for r in routings if r is not None]
    if not captured:
        return None
    layers, topk = captured[0].layers, captured[0].topk
    for other in captured[1:]:
        if (other.layers, other.topk) != (layers, topk):
            raise TrajectoryError(
                f"one branch holds routing of {layers}x{topk} and {other.layers}x{other.topk}"
            )
    row = layers * topk
    rows = max(0, length - 1)
    experts = zeros(rows * row)
    uncovered = [(0, rows)]
    for routing in captured:
        still: list[tuple[int, int]] = []
        for start, end in uncovered:
            lo, hi = max(start, routing.start), min(end, routing.end)
            if lo >= hi:
                still.append((start, end))
                continue
            first = (lo - routing.start) * row
            experts[lo * row : hi * row] = routing.experts[first : first + (hi - lo) * row]
            if start < lo:
                still.append((start, lo))
            if hi < end:
                still.append((hi, end))
        uncovered = still
        if not uncovered:
            break
    return SampleRouting(layers, topk, experts, tuple(sorted(uncovered)))


def zeros(count: int) -> array[int]:
    """``count`` int32 zeros, allocated exactly (``frombytes`` would over-allocate by 1/16)."""
    return array("i", [0]) * count


def _non_negative(experts: array[int]) -> bool:
    """No id below 0, at C speed: the sign byte of every int32 is ASCII (below 0x80). A copy
    sliced as bytes is 6x faster than a strided memoryview's ``tobytes``."""
    sign = 3 if sys.byteorder == "little" else 0
    return experts.tobytes()[sign::4].isascii()
