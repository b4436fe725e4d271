"""The settings code running inside slime needs, and how they get there.

slime runs our hooks in its own processes with its own ``args``. The launcher writes these settings
into the file given to ``--custom-config-path``; slime loads that file with ``yaml.safe_load`` and
sets each top-level key as an attribute of ``args``. We use one key, ``agent_rl``, so nothing of
slime's is overwritten, and read it back through :func:`typed_config.from_mapping` with the same
checks the launcher applied.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from .conversion import ConversionOptions
from .gates import GateConfig
from .slime_api import NAMESPACE
from .typed_config import FieldError, from_mapping, to_mapping

_DOTTED_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")


def check_dotted_path(name: str, value: str) -> None:
    """slime loads functions as ``module.attribute`` (split at the last dot)."""
    if not _DOTTED_PATH.fullmatch(value):
        raise FieldError(name, f"expected a dotted path like 'pkg.module.function', got {value!r}")


@dataclass(frozen=True, slots=True)
class EpisodeSettings:
    """The app's :class:`~slime_backend.episode.Episode` and its budgets."""

    function: str
    wall_clock_s: float = 1800.0
    max_turns: int = 200

    def __post_init__(self) -> None:
        check_dotted_path("function", self.function)
        if self.wall_clock_s <= 0:
            raise FieldError("wall_clock_s", f"must be positive, got {self.wall_clock_s}")
        if self.max_turns <= 0:
            raise FieldError("max_turns", f"must be positive, got {self.max_turns}")


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
class BackendSettings:
    episode: EpisodeSettings
    agent: AgentSettings
    sandbox: SandboxSettings = field(default_factory=SandboxSettings)
    conversion: ConversionOptions = field(default_factory=ConversionOptions)
    gates: GateConfig = field(default_factory=GateConfig)

    def custom_config(self) -> str:
        """The ``--custom-config-path`` file's text: JSON, which is also YAML (slime reads YAML)."""
        return json.dumps({NAMESPACE: to_mapping(self)}, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_args(cls, args: Any) -> BackendSettings:
        """The settings as slime set them on ``args``."""
        return from_mapping(cls, getattr(args, NAMESPACE, None), NAMESPACE)
