"""Typed configuration of the adapter server. The library reads no environment variables."""

from __future__ import annotations

from dataclasses import dataclass, field

from .sessions import SessionLimits


@dataclass(frozen=True, slots=True)
class RolloutSampling:
    """The rollout's sampling settings: what the policy is trained under."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int | None = None
    """Cap on one reply; the client's ``max_tokens`` and the room left in the context cap it too."""


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
    admin_token: str | None = None
    """Enables the ``/admin/sessions`` API for out-of-process callers, guarded by this token."""
    replay_retries: bool = False
    """Answer a client's identical retry with the recorded reply instead of generating again."""
