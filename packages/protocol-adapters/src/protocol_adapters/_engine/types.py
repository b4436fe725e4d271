"""What we ask an engine for and what it gives back, independent of any wire format.

Output ids and logprobs are the engine's, in generation order; nothing here is ever derived from
text. A result converts to a :class:`trajectory_tree.Completion` for recording.
"""

from __future__ import annotations

import math
import sys
import uuid
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

from trajectory_tree import Completion, FinishReason, RoutedExperts, VersionRun

TopLogprobs = tuple[tuple[int, float], ...]
"""The most likely tokens at one output position, as ``(token_id, logprob)``, most likely first."""


def new_rid() -> str:
    """A fresh request id: one per engine call, so an abort can only ever hit that call."""
    return f"pa-{uuid.uuid4().hex}"


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to sample one reply.

    ``top_k = -1`` means no top-k cut (SGLang's convention). ``stop`` strings and
    ``stop_token_ids`` end generation; the stop token itself is always kept in the output so the
    recorded ids are exactly what was sampled. ``json_schema`` (a JSON schema as JSON text)
    constrains the reply to JSON matching it: the client asked for structured output.
    """

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    json_schema: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int):
            raise ValueError(f"max_new_tokens must be an int, got {self.max_new_tokens!r}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0.0):
            raise ValueError(f"temperature must be finite and >= 0, got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k != -1 and self.top_k < 1:
            raise ValueError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        if not (0.0 <= self.min_p <= 1.0):
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        stop: object = self.stop  # a bare string would silently become one stop per character
        if not isinstance(stop, tuple):
            raise ValueError(f"stop must be a tuple of strings, got {type(stop).__name__}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")
        if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be non-negative ints: {self.stop_token_ids!r}")


_NON_NEGATIVE = bytes(range(0x80))


def _check_token_ids(ids: Sequence[int]) -> None:
    """Every id a non-negative int, at C speed: a 1M-token prompt must not stall the loop. An
    ``array`` of signed ints (the adapter's own prompts) holds ints by construction; its signs are
    read from the raw bytes (one byte per id), not id by id."""
    if isinstance(ids, array) and ids.typecode in "bhilq":
        sign = ids.itemsize - 1 if sys.byteorder == "little" else 0
        signs = ids.tobytes()[sign :: ids.itemsize]  # bytes' strided copy: 7x a memoryview's
        if signs.translate(None, _NON_NEGATIVE):
            i = next(i for i, t in enumerate(ids) if t < 0)
            raise ValueError(f"input_ids[{i}] = {ids[i]!r} is not a token id")
        return
    try:
        packed = array("q", ids)
    except (TypeError, OverflowError):
        bad = next(
            (i, t) for i, t in enumerate(ids) if isinstance(t, bool) or not isinstance(t, int)
        )
        raise ValueError(f"input_ids[{bad[0]}] = {bad[1]!r} is not a token id") from None
    if min(packed) < 0 or any(type(t) is bool for t in ids[:1]):
        i = next(i for i, t in enumerate(ids) if t < 0 or type(t) is bool)
        raise ValueError(f"input_ids[{i}] = {ids[i]!r} is not a token id")


@dataclass(frozen=True, slots=True)
class RoutingAsk:
    """Ask the engine for the experts a MoE model routed each position to, from ``start`` on.

    The engine does not say how many layers and experts per token it returns, so the caller
    states them: every answer is checked against ``layers x topk`` ids per position.
    """

    start: int
    layers: int
    topk: int

    def __post_init__(self) -> None:
        for name in ("start", "layers", "topk"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an int, got {value!r}")
        if self.start < 0:
            raise ValueError(f"routing start must be >= 0, got {self.start}")
        if self.layers < 1 or self.topk < 1:
            raise ValueError(f"layers and topk must be >= 1, got {self.layers}x{self.topk}")


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    """One generation from prompt token ids.

    ``routing_key`` keeps a session on one engine replica (prefix-cache reuse); ``rid`` identifies
    this call to the engine and is what an abort names. ``top_logprobs`` asks the engine for that
    many most likely tokens at every output position (0: none). ``routed_experts`` asks for the
    MoE routing of positions ``start ..`` (``None``: routing is not captured).

    ``input_ids``: any sequence of ints, not copied. The adapter passes an ``array('i')``, whose
    check runs at C speed and whose JSON text the engine client extends from the session's
    previous prompt (compare with ``list(request.input_ids)``: an array never equals a list).
    """

    input_ids: Sequence[int]
    sampling: SamplingParams
    routing_key: str | None = None
    rid: str = field(default_factory=new_rid)
    top_logprobs: int = 0
    routed_experts: RoutingAsk | None = None

    def __post_init__(self) -> None:
        if not self.input_ids:
            raise ValueError("input_ids must not be empty")
        _check_token_ids(self.input_ids)
        if not self.rid:
            raise ValueError("rid must not be empty")
        if isinstance(self.top_logprobs, bool) or self.top_logprobs < 0:
            raise ValueError(f"top_logprobs must be a count >= 0, got {self.top_logprobs!r}")
        ask = self.routed_experts
        if ask is not None and ask.start > len(self.input_ids):
            raise ValueError(f"routing start {ask.start} is past the {len(self.input_ids)} ids")

    @property
    def routed_experts_start(self) -> int | None:
        """Where the engine starts returning routing, or ``None`` when it is not asked for."""
        return None if self.routed_experts is None else self.routed_experts.start


@dataclass(frozen=True, slots=True)
class GenerateChunk:
    """A piece of a streamed generation: only the tokens that are new since the previous chunk.

    ``completion_tokens`` counts all tokens generated so far. The last chunk carries
    ``finish_reason``; every earlier chunk has ``None`` there. ``top_logprobs`` has one entry per
    new token when the request asked for them, else it is empty. ``weight_version`` is the
    engine's version when it sent this chunk (an in-place weight update changes it mid-stream).
    ``routed_experts`` is the whole call's routing, on the last chunk only, when asked for.
    """

    output_ids: tuple[int, ...]
    output_logprobs: tuple[float, ...]
    completion_tokens: int
    prompt_tokens: int
    finish_reason: FinishReason | None = None
    matched_stop: int | str | None = None
    weight_version: str | None = None
    abort_message: str | None = None
    top_logprobs: tuple[TopLogprobs, ...] = ()
    routed_experts: RoutedExperts | None = None


@dataclass(frozen=True, slots=True)
class GenerateResult:
    """A finished generation.

    ``matched_stop`` is the stop token id or stop string that ended it (``None`` for the model's
    own end-of-sequence token reported without detail, for length and for abort).
    ``abort_message`` is the engine's reason when ``finish_reason`` is ``ABORT``.
    ``top_logprobs`` has one entry per output token when the request asked for them.
    ``routed_experts`` is the call's routing when asked for (an aborted call may have none).
    One answer has one weight version, so ``version_runs`` is one run or none.
    """

    rid: str
    output_ids: tuple[int, ...]
    output_logprobs: tuple[float, ...]
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    matched_stop: int | str | None = None
    weight_version: str | None = None
    abort_message: str | None = None
    top_logprobs: tuple[TopLogprobs, ...] = ()
    routed_experts: RoutedExperts | None = None

    @property
    def version_runs(self) -> tuple[VersionRun, ...]:
        if self.weight_version is None:
            return ()
        return ((0, self.weight_version),)

    def to_completion(self) -> Completion:
        return Completion(
            output_ids=self.output_ids,
            output_logprobs=self.output_logprobs,
            finish_reason=self.finish_reason,
            weight_version=self.weight_version,
            version_runs=self.version_runs,
            routed_experts=self.routed_experts,
        )
