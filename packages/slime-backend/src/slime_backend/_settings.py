"""The settings code running inside slime needs, and how they get there.

slime runs our hooks in its own processes with its own ``args``. The launcher writes these settings
into the file given to ``--custom-config-path``; slime loads that file with ``yaml.safe_load`` and
sets each top-level key as an attribute of ``args``. We use one key, ``agent_rl``, so nothing of
slime's is overwritten, and read it back through :func:`typed_config.from_mapping` with the same
checks the launcher applied.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from protocol_adapters import SGLangConfig, TemplateMode

from ._conversion import ConversionOptions
from ._gates import GateConfig
from ._slime_api import NAMESPACE
from ._typed_config import FieldError, from_mapping, to_mapping

_ENGINE = SGLangConfig("http://router")
"""The SGLang client's defaults, which the adapter settings keep unless told otherwise."""
_DOTTED_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")


def check_dotted_path(name: str, value: str) -> None:
    """slime loads functions as ``module.attribute`` (split at the last dot)."""
    if not _DOTTED_PATH.fullmatch(value):
        raise FieldError(name, f"expected a dotted path like 'pkg.module.function', got {value!r}")


@dataclass(frozen=True, slots=True)
class EpisodeSettings:
    """The app's generate function and the budgets of its episodes.

    ``generate`` is the dotted path slime loads with ``--custom-generate-function-path``: the
    app's module attribute made by :func:`slime_backend.generate.make_generate` from its
    :class:`~slime_backend.Episode`. ``wall_clock_s`` and ``max_turns`` are the agent's
    budgets; an episode that has not returned ``grace_s`` after its wall clock (grading and
    cleanup included) is cancelled and aborted. ``max_episode_new_tokens`` caps the tokens the
    engine generates in one episode, every reply of every agent together (none: no cap): each
    reply's ``max_new_tokens`` is cut to what is left, and once nothing is left the agent's
    calls are refused as rate-limited, as past ``max_turns``.
    """

    generate: str
    wall_clock_s: float = 1800.0
    max_turns: int = 200
    grace_s: float = 600.0
    max_episode_new_tokens: int | None = None

    def __post_init__(self) -> None:
        check_dotted_path("generate", self.generate)
        for name in ("wall_clock_s", "grace_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise FieldError(name, f"must be a positive number of seconds, got {value}")
        if self.max_turns <= 0:
            raise FieldError("max_turns", f"must be positive, got {self.max_turns}")
        if self.max_episode_new_tokens is not None and self.max_episode_new_tokens <= 0:
            raise FieldError(
                "max_episode_new_tokens", f"must be positive, got {self.max_episode_new_tokens}"
            )

    @property
    def deadline_s(self) -> float:
        """How long the generate function waits for the episode's outcome."""
        return self.wall_clock_s + self.grace_s


@dataclass(frozen=True, slots=True)
class AgentSettings:
    """Which agent the app runs, and its options; the app interprets both."""

    name: str
    options: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name:
            raise FieldError("name", "must name the agent (e.g. 'claude-code')")


@dataclass(frozen=True, slots=True)
class SandboxSettings:
    """Which sandbox backend the app uses, and its options; the app interprets both."""

    backend: str = "local"
    options: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.backend:
            raise FieldError("backend", "must name the sandbox backend (e.g. 'local')")


@dataclass(frozen=True, slots=True)
class AdapterSettings:
    """The adapter the generate function starts in each rollout process.

    ``host`` / ``port``: where agents reach it (127.0.0.1 and a free port by default: local
    sandboxes forward that port; a fixed port serves one sampling configuration, so evaluation
    with other sampling settings needs port 0). ``check_sample_rate``: the share of bridged
    turns proven against a full render of the chat template. ``engine_connections``: pooled
    connections to slime's router, one per concurrently generating turn.
    ``engine_connect_timeout`` / ``engine_request_timeout`` / ``engine_stream_idle_timeout``:
    seconds to connect to the router (counted while the event loop runs), for a whole generation,
    and between two streamed chunks (protocol-adapters' ``SGLangConfig``). ``template_mode``: how
    to serve a checkpoint's chat template the bridge cannot reproduce exactly (``exact`` refuses
    it before any episode; ``accept-deviations`` and ``full-render`` serve it, recorded on every
    turn; see protocol-adapters' docs/chat-templates.md).
    """

    host: str = "127.0.0.1"
    port: int = 0
    check_sample_rate: float = 0.01
    engine_connections: int = 512
    engine_connect_timeout: float = _ENGINE.connect_timeout
    engine_request_timeout: float = _ENGINE.request_timeout
    engine_stream_idle_timeout: float = _ENGINE.stream_idle_timeout
    template_mode: TemplateMode = TemplateMode.EXACT

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise FieldError("port", f"must be a TCP port (0 picks a free one), got {self.port}")
        if not 0.0 <= self.check_sample_rate <= 1.0:
            raise FieldError(
                "check_sample_rate",
                f"must be a share between 0 and 1, got {self.check_sample_rate}",
            )
        if self.engine_connections < 1:
            raise FieldError(
                "engine_connections", f"must be positive, got {self.engine_connections}"
            )
        for name in (
            "engine_connect_timeout",
            "engine_request_timeout",
            "engine_stream_idle_timeout",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise FieldError(name, f"must be a positive number of seconds, got {value!r}")


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """Where episodes run.

    ``local``: in slime's rollout process (one node's CPUs run every agent). ``ray``: one rollout
    worker per node of the Ray cluster (only nodes holding ``node_resource``, when set), each with
    its own adapter and sandboxes; every episode goes to the least-loaded worker, which runs at
    most ``max_episodes_per_worker`` at once (unbounded when unset).
    """

    mode: Literal["local", "ray"] = "local"
    node_resource: str | None = None
    max_episodes_per_worker: int | None = None

    def __post_init__(self) -> None:
        if self.max_episodes_per_worker is not None and self.max_episodes_per_worker < 1:
            raise FieldError(
                "max_episodes_per_worker", f"must be positive, got {self.max_episodes_per_worker}"
            )
        if self.node_resource is not None and not self.node_resource:
            raise FieldError("node_resource", "must name a Ray resource")


@dataclass(frozen=True, slots=True)
class BackendSettings:
    episode: EpisodeSettings
    agent: AgentSettings
    sandbox: SandboxSettings = field(default_factory=SandboxSettings)
    conversion: ConversionOptions = field(default_factory=ConversionOptions)
    gates: GateConfig = field(default_factory=GateConfig)
    adapter: AdapterSettings = field(default_factory=AdapterSettings)
    workers: WorkerSettings = field(default_factory=WorkerSettings)

    def custom_config(self) -> str:
        """The ``--custom-config-path`` file's text: JSON, which is also YAML (slime reads YAML)."""
        return json.dumps({NAMESPACE: to_mapping(self)}, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_args(cls, args: Any) -> BackendSettings:
        """The settings as slime set them on ``args``."""
        return from_mapping(cls, getattr(args, NAMESPACE, None), NAMESPACE)
