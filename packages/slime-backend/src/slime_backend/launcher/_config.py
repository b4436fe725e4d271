"""The launcher's typed configuration: one TOML file describes a whole training run.

Tables map one to one onto the dataclasses below (``[slime]``, ``[ray]``, ``[run]``, ``[model]``,
``[data]``, ``[cluster]``, ``[rollout]``, ``[train]``, then the settings that travel into slime's
processes: ``[episode]``, ``[agent]``, ``[sandbox]``, ``[conversion]``, ``[gates]``,
``[adapter]``, ``[workers]``), plus
``extra_args``: slime / Megatron / SGLang flags passed through verbatim (model architecture flags
from slime's ``scripts/models/*.sh`` go there). Every check names the field it rejects.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from slime_backend._conversion import ConversionOptions
from slime_backend._gates import GateConfig
from slime_backend._grpo import MEAN_ESTIMATORS
from slime_backend._rollout_args import check_parsers
from slime_backend._settings import (
    AdapterSettings,
    AgentSettings,
    BackendSettings,
    EpisodeSettings,
    SandboxSettings,
    WorkerSettings,
)
from slime_backend._typed_config import FieldError

AdvantageEstimator = Literal[
    "grpo", "gspo", "cispo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo"
]
"""slime's ``--advantage-estimator`` choices at the pinned commit."""


def _positive(obj: object, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if value is not None and not (math.isfinite(value) and value > 0):
            raise FieldError(name, f"must be positive, got {value}")


def _absolute(obj: object, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if value is not None and not value.startswith("/"):
            raise FieldError(name, f"must be an absolute path on the cluster, got {value!r}")


@dataclass(frozen=True, slots=True)
class SlimeInstall:
    """Where slime and Megatron-LM are checked out on the cluster (both go on ``PYTHONPATH``)."""

    dir: str
    megatron_dir: str
    python: str = "python3"
    async_training: bool = False
    """``train_async.py`` (rollout n+1 overlaps training step n) instead of ``train.py``."""

    def __post_init__(self) -> None:
        _absolute(self, "dir", "megatron_dir")


@dataclass(frozen=True, slots=True)
class RayJob:
    """``ray job submit`` settings; ``env`` is added to the job's runtime environment.

    ``wheels``: a directory of this project's wheels (``uv build --all-packages --wheel
    --out-dir DIR``) on a file system every node mounts at that path. The job's runtime
    environment installs them (``pip``) on each node when the job starts, in a virtual
    environment layered over slime's, so nothing is installed by hand; their own dependencies
    come from the nodes' package index."""

    address: str = "http://127.0.0.1:8265"
    submission_id: str | None = None
    no_wait: bool = False
    env: dict[str, str] = field(default_factory=dict)
    wheels: str | None = None

    def __post_init__(self) -> None:
        _absolute(self, "wheels")
        if "PYTHONPATH" in self.env:
            raise FieldError("env", "PYTHONPATH is set from slime.dir and slime.megatron_dir")


@dataclass(frozen=True, slots=True)
class RunPaths:
    """``dir`` must be readable from the Ray head: the custom config is written there."""

    dir: str
    dump_rollouts: bool = False
    """Have slime save each rollout batch (samples, provenance, gate marks) under ``dir``."""

    def __post_init__(self) -> None:
        _absolute(self, "dir")


@dataclass(frozen=True, slots=True)
class ModelPaths:
    hf_checkpoint: str
    ref_load: str
    load: str | None = None
    save: str | None = None
    save_interval: int | None = None

    def __post_init__(self) -> None:
        _absolute(self, "hf_checkpoint", "ref_load", "load", "save")
        _positive(self, "save_interval")
        if self.save_interval is not None and self.save is None:
            raise FieldError("save_interval", "needs model.save")


@dataclass(frozen=True, slots=True)
class DataConfig:
    """The JSONL dataset; ``metadata_key`` holds each row's task payload."""

    prompt_data: str
    input_key: str = "prompt"
    label_key: str | None = "label"
    metadata_key: str = "metadata"
    shuffle: bool = True

    def __post_init__(self) -> None:
        _absolute(self, "prompt_data")


@dataclass(frozen=True, slots=True)
class ClusterShape:
    actor_num_nodes: int = 1
    actor_num_gpus_per_node: int = 8
    rollout_num_gpus: int | None = None
    """Required unless ``colocate`` (then training and rollout share the actor GPUs)."""
    rollout_num_gpus_per_engine: int = 1
    colocate: bool = True
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    context_parallel_size: int = 1
    expert_model_parallel_size: int = 1

    def __post_init__(self) -> None:
        _positive(
            self,
            "actor_num_nodes",
            "actor_num_gpus_per_node",
            "rollout_num_gpus",
            "rollout_num_gpus_per_engine",
            "tensor_model_parallel_size",
            "pipeline_model_parallel_size",
            "context_parallel_size",
            "expert_model_parallel_size",
        )
        if not self.colocate and self.rollout_num_gpus is None:
            raise FieldError("rollout_num_gpus", "required when colocate is false")
        engines_gpus = self.rollout_gpus
        if engines_gpus % self.rollout_num_gpus_per_engine:
            raise FieldError(
                "rollout_num_gpus_per_engine",
                f"must divide the {engines_gpus} rollout GPUs",
            )
        model_parallel = (
            self.tensor_model_parallel_size
            * self.pipeline_model_parallel_size
            * self.context_parallel_size
        )
        if self.actor_gpus % model_parallel:
            raise FieldError(
                "tensor_model_parallel_size",
                f"tensor x pipeline x context parallel sizes ({model_parallel}) must divide the "
                f"{self.actor_gpus} training GPUs",
            )

    @property
    def actor_gpus(self) -> int:
        return self.actor_num_nodes * self.actor_num_gpus_per_node

    @property
    def rollout_gpus(self) -> int:
        return self.actor_gpus if self.rollout_num_gpus is None else self.rollout_num_gpus


@dataclass(frozen=True, slots=True)
class RolloutConfig:
    """``batch_size`` prompts per step, ``n_samples_per_prompt`` episodes per prompt (the GRPO
    group); ``max_response_len`` is the per-call ``max_new_tokens``. ``top_k`` (-1: off) and
    ``stop`` strings are sampling settings like ``temperature`` (slime's top-p is not: below 1
    it asks for top-p replay, which the adapters cannot record). ``tool_call_parser`` and
    ``reasoning_parser`` are SGLang's parser names for the policy's output format; the adapters
    parse replies with them (:data:`slime_backend._rollout_args.TOOL_CALL_PARSERS`); a policy
    that does not reason has ``reasoning_parser = "none"`` (TOML has no null)."""

    num_rollout: int
    batch_size: int
    n_samples_per_prompt: int
    max_context_len: int
    max_response_len: int
    temperature: float = 1.0
    top_k: int = -1
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    tool_call_parser: str = "qwen25"
    reasoning_parser: str | None = "qwen3"

    def __post_init__(self) -> None:
        _positive(
            self,
            "num_rollout",
            "batch_size",
            "n_samples_per_prompt",
            "max_context_len",
            "max_response_len",
            "temperature",
        )
        if self.reasoning_parser == "none":
            object.__setattr__(self, "reasoning_parser", None)
        if self.top_k != -1 and self.top_k < 1:
            raise FieldError("top_k", f"must be -1 (off) or positive, got {self.top_k}")
        if not all(self.stop):
            raise FieldError("stop", "stop strings must not be empty")
        if self.max_response_len >= self.max_context_len:
            raise FieldError(
                "max_response_len", f"must be below max_context_len ({self.max_context_len})"
            )
        check_parsers(self.tool_call_parser, self.reasoning_parser)


@dataclass(frozen=True, slots=True)
class TrainConfig:
    """``max_tokens_per_gpu`` drives slime's dynamic batching, which is always on: uneven fan-out
    gives each step a varying number of samples, which static micro-batches cannot hold."""

    lr: float
    max_tokens_per_gpu: int
    advantage_estimator: AdvantageEstimator = "grpo"
    std_normalization: bool = True
    rewards_normalization: bool = True
    num_steps_per_rollout: int = 1
    eps_clip: float = 0.2
    eps_clip_high: float = 0.28
    kl_loss_coef: float = 0.0
    entropy_coef: float = 0.0

    def __post_init__(self) -> None:
        _positive(
            self, "lr", "max_tokens_per_gpu", "num_steps_per_rollout", "eps_clip", "eps_clip_high"
        )
        for name in ("kl_loss_coef", "entropy_coef"):
            if getattr(self, name) < 0:
                raise FieldError(name, f"must not be negative, got {getattr(self, name)}")


@dataclass(frozen=True, slots=True)
class RunnerConfig:
    slime: SlimeInstall
    run: RunPaths
    model: ModelPaths
    data: DataConfig
    rollout: RolloutConfig
    train: TrainConfig
    episode: EpisodeSettings
    agent: AgentSettings
    ray: RayJob = field(default_factory=RayJob)
    cluster: ClusterShape = field(default_factory=ClusterShape)
    sandbox: SandboxSettings = field(default_factory=SandboxSettings)
    conversion: ConversionOptions = field(default_factory=ConversionOptions)
    gates: GateConfig = field(default_factory=GateConfig)
    adapter: AdapterSettings = field(default_factory=AdapterSettings)
    workers: WorkerSettings = field(default_factory=WorkerSettings)
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.slime.async_training and self.cluster.colocate:
            raise FieldError(
                "slime.async_training", "slime's train_async.py refuses cluster.colocate = true"
            )
        episodes = self.rollout.batch_size * self.rollout.n_samples_per_prompt
        if episodes % self.train.num_steps_per_rollout:
            raise FieldError(
                "train.num_steps_per_rollout",
                f"must divide the {episodes} episodes of a rollout step "
                "(slime drops the episodes of an incomplete training step)",
            )
        train = self.train
        normalizing = train.rewards_normalization and train.advantage_estimator in MEAN_ESTIMATORS
        if normalizing and self.rollout.n_samples_per_prompt < 2:
            raise FieldError(
                "rollout.n_samples_per_prompt",
                f"{self.train.advantage_estimator} compares episodes of one prompt: "
                "with 1 per prompt every advantage is 0",
            )

    def backend_settings(self) -> BackendSettings:
        return BackendSettings(
            self.episode,
            self.agent,
            self.sandbox,
            self.conversion,
            self.gates,
            self.adapter,
            self.workers,
        )
