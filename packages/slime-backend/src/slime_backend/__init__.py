"""slime-backend: the connection between agent episodes and slime (Megatron + SGLang + Ray).

- :mod:`~slime_backend.episode`: the typed contract with the app (task + adapter session +
  budgets -> outcome).
- :mod:`~slime_backend.generate`: ``make_generate(episode)``, the function slime calls per sample
  (``--custom-generate-function-path``); it starts the adapter in the rollout process, or sends
  episodes to Ray rollout workers. Imported on its own: it pulls in the adapters' server.
- :mod:`~slime_backend.conversion`: a session tree and an outcome -> slime samples.
- :mod:`~slime_backend.reward_hook`: GRPO baselines per episode under fan-out
  (``--custom-reward-post-process-path``).
- :mod:`~slime_backend.gate_hook`: silent-failure gates per rollout batch
  (``--rollout-sample-filter-path``).
- :mod:`~slime_backend.launcher`: ``SlimeRunner``, TOML -> the slime command and its Ray job.

slime is never imported at import time; see :mod:`~slime_backend.slime_api`.
"""

from importlib.metadata import version as _distribution_version

from .conversion import ConversionError, ConversionOptions, episode_samples
from .episode import AdapterSession, Budgets, Episode, EpisodeOutcome, EpisodeStatus, JsonValue
from .gates import EpisodeHealth, GateConfig, GateReport, SilentFailureAlarm, evaluate_gates
from .grpo import EpisodeReward, Normalization, normalized_rewards
from .settings import AgentSettings, BackendSettings, EpisodeSettings, SandboxSettings
from .slime_api import NAMESPACE, SlimeNotInstalled, SlimeSample, sample_class
from .typed_config import ConfigError

__version__ = _distribution_version("agent-rl-slime-backend")  # pyproject.toml is the one source

__all__ = [
    "NAMESPACE",
    "AdapterSession",
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
    "GateConfig",
    "GateReport",
    "JsonValue",
    "Normalization",
    "SandboxSettings",
    "SilentFailureAlarm",
    "SlimeNotInstalled",
    "SlimeSample",
    "episode_samples",
    "evaluate_gates",
    "normalized_rewards",
    "sample_class",
]
