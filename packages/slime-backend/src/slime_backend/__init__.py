"""slime-backend: the connection between agent episodes and slime (Megatron + SGLang + Ray).

The public API is what this module exports (the episode contract with the app, the settings of a
run, conversion of a session into slime samples, GRPO under fan-out, silent-failure gates, typed
configuration) and six public submodules, each named because slime or a user loads it by path:

- :mod:`slime_backend.generate`: ``make_generate(episode)``, the function slime calls per sample
  (``--custom-generate-function-path``); it starts the adapter in the rollout process, or sends
  episodes to Ray rollout workers. Imported on its own: it pulls in the adapters' server.
- :mod:`slime_backend.reward_hook`: GRPO baselines per episode under fan-out
  (``--custom-reward-post-process-path``).
- :mod:`slime_backend.gate_hook`: silent-failure gates per rollout batch
  (``--rollout-sample-filter-path``); a tripped gate stops the step by default.
- :mod:`slime_backend.dynamic_filter`: DAPO's dynamic sampling under fan-out
  (``--dynamic-sampling-filter-path``), each episode counted once.
- :mod:`slime_backend.launcher`: ``SlimeRunner``, TOML -> the slime command and its Ray job.
- :mod:`slime_backend.testing`: driving the generate function without slime (tests, demos).

Every module whose name starts with ``_`` is internal and may change in any release. slime is
never imported at import time.
"""

from typing import TYPE_CHECKING

from ._conversion import ConversionError, ConversionOptions, episode_samples
from ._episode import AdapterSession, Budgets, Episode, EpisodeOutcome, EpisodeStatus, JsonValue
from ._gates import EpisodeHealth, GateConfig, GateReport, SilentFailureAlarm, evaluate_gates
from ._grpo import EpisodeReward, Normalization, normalized_rewards
from ._settings import (
    AdapterSettings,
    AgentSettings,
    BackendSettings,
    EpisodeSettings,
    SandboxSettings,
    WorkerSettings,
)
from ._slime_api import NAMESPACE, SlimeNotInstalled, SlimeSample, sample_class
from ._staleness import StaleAction, StalenessPolicy
from ._typed_config import ConfigError, FieldError, from_mapping, to_mapping

__all__ = [
    "NAMESPACE",
    "AdapterSession",
    "AdapterSettings",
    "AgentSettings",
    "BackendSettings",
    "Budgets",
    "ConfigError",
    "ConversionError",
    "ConversionOptions",
    "Episode",
    "EpisodeHealth",
    "EpisodeOutcome",
    "EpisodeReward",
    "EpisodeSettings",
    "EpisodeStatus",
    "FieldError",
    "GateConfig",
    "GateReport",
    "JsonValue",
    "Normalization",
    "SandboxSettings",
    "SilentFailureAlarm",
    "SlimeNotInstalled",
    "SlimeSample",
    "StaleAction",
    "StalenessPolicy",
    "WorkerSettings",
    "episode_samples",
    "evaluate_gates",
    "from_mapping",
    "normalized_rewards",
    "sample_class",
    "to_mapping",
]


if TYPE_CHECKING:
    __version__: str
else:

    def __getattr__(name: str) -> str:
        # The version comes from the installed metadata (pyproject.toml is its one source), read
        # on first use: importing importlib.metadata costs more than importing this package.
        if name == "__version__":
            from importlib.metadata import version

            return version("agent-rl-slime-backend")
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
