"""Typed configuration of the adapter server. The library reads no environment variables."""

from __future__ import annotations

from dataclasses import dataclass, field

from .sessions import SessionLimits
from .side_requests import DEFAULT_RULES, SideRequestRule
from .workers import LargeBodies


@dataclass(frozen=True, slots=True)
class RolloutSampling:
    """The rollout's sampling settings: what the policy is trained under.

    ``min_p`` and ``stop`` always apply, whoever decides the rest: ``stop`` strings are sent
    with the client's own (a reply that ends on one keeps it in its recorded ids).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int | None = None
    """Cap on one reply; the client's ``max_tokens`` and the room left in the context cap it too."""
    min_p: float = 0.0
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p!r}")
        stop: object = self.stop  # a bare string would become one stop per character
        if not isinstance(stop, tuple) or not all(isinstance(s, str) and s for s in stop):
            raise ValueError(f"stop must be a tuple of non-empty strings, got {stop!r}")


@dataclass(frozen=True, slots=True)
class RoutingCapture:
    """Record which experts a MoE policy routed every token to, for routing replay in training.

    Every engine call then asks SGLang (started with ``--enable-return-routed-experts``) for its
    routing, from the first position its branch has no routing for yet. The engine does not say
    the shape of what it returns, so it is stated here: the model's MoE ``layers`` and experts
    per token (``topk``); every answer is checked against it.
    """

    layers: int
    topk: int

    def __post_init__(self) -> None:
        for name in ("layers", "topk"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")


@dataclass(frozen=True, slots=True)
class AdminConfig:
    """The session API (``/admin/sessions``) for callers in another process.

    It listens on its own address, never on the agent-facing one: a sandbox reaches only the
    forwarded agent port, so an agent can neither open nor read nor close sessions. Every call
    carries ``token`` as a bearer token; session tokens are refused there.
    """

    token: str
    host: str = "127.0.0.1"
    port: int = 0
    """0 picks a free port (read it back from the running server's ``admin_url``)."""

    def __post_init__(self) -> None:
        if not self.token.strip():
            raise ValueError("the admin token must not be empty")


@dataclass(frozen=True, slots=True)
class AdapterConfig:
    host: str = "127.0.0.1"
    port: int = 0
    """0 picks a free port (read it back from the running server)."""
    models: tuple[str, ...] = ("policy",)
    """Names listed by ``/v1/models``; any name is accepted in requests."""
    sampling: RolloutSampling = field(default_factory=RolloutSampling)
    client_sampling_wins: bool = False
    """Whether a client's temperature/top_p/top_k override the rollout's (recorded either way)."""
    limits: SessionLimits = field(default_factory=SessionLimits)
    max_body_bytes: int = 64 * 1024 * 1024
    large_bodies: LargeBodies = field(default_factory=LargeBodies)
    """Bodies decoded and rendered one at a time on a thread of their own (``workers.py``)."""
    admin: AdminConfig | None = None
    """Enables the session API for out-of-process callers, on its own listener."""
    replay_retries: bool = False
    """Answer a client's identical retry with the recorded reply instead of generating again."""
    side_requests: tuple[SideRequestRule, ...] = DEFAULT_RULES
    """Shapes of the CLIs' housekeeping calls: answered, recorded, never trained (``()``: none)."""
    routing: RoutingCapture | None = None
    """Capture MoE routing with every call (``None``: not asked for; a dense model has none)."""
