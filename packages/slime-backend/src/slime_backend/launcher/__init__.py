"""Launch slime with this package wired in: typed TOML config -> exact command -> Ray job.

The public API is what this module exports; its modules (``_config``, ...) are internal.
"""

from slime_backend._fan_out import GATE_HOOK, REWARD_HOOK

from ._command import (
    REFUSED_FLAGS,
    ROUTER_POLICY,
    ray_submit_command,
    survives_ray_entrypoint,
    train_args,
    train_command,
)
from ._config import (
    AdvantageEstimator,
    ClusterShape,
    DataConfig,
    ModelPaths,
    RayJob,
    RolloutConfig,
    RunnerConfig,
    RunPaths,
    SlimeInstall,
    TrainConfig,
)
from ._runner import LaunchPlan, SlimeRunner

__all__ = [
    "GATE_HOOK",
    "REFUSED_FLAGS",
    "REWARD_HOOK",
    "ROUTER_POLICY",
    "AdvantageEstimator",
    "ClusterShape",
    "DataConfig",
    "LaunchPlan",
    "ModelPaths",
    "RayJob",
    "RolloutConfig",
    "RunPaths",
    "RunnerConfig",
    "SlimeInstall",
    "SlimeRunner",
    "TrainConfig",
    "ray_submit_command",
    "survives_ray_entrypoint",
    "train_args",
    "train_command",
]
