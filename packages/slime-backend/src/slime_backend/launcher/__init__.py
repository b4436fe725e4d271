"""Launch slime with this package wired in: typed TOML config -> exact command -> Ray job."""

from .command import (
    GATE_HOOK,
    REFUSED_FLAGS,
    REWARD_HOOK,
    ROUTER_POLICY,
    ray_submit_command,
    survives_ray_entrypoint,
    train_args,
    train_command,
)
from .config import (
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
from .runner import LaunchPlan, SlimeRunner

__all__ = [
    "GATE_HOOK",
    "REFUSED_FLAGS",
    "REWARD_HOOK",
    "ROUTER_POLICY",
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
