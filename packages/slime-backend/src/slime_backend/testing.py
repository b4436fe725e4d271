"""Stand-ins for slime's types where slime cannot be installed (no GPU, no torch): its ``Sample``
and its ``DynamicFilterOutput``; and slime's ``args`` and sampling dict for driving the generate
function without slime.

Same field names, order and defaults, and the same ``Status`` values, as slime's ``Sample`` at the
commit pinned in docs/slime-contract.md; fields that slime types as tensors are plain lists here.
It has none of slime's methods: code in this package only constructs samples and reads fields.
The opt-in test ``test_contract_checkout.py`` compares this class with a real slime checkout.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ._fan_out import GATE_HOOK, REWARD_HOOK
from ._settings import BackendSettings


@dataclass
class StandInSpecInfo:
    spec_accept_token_num: int = 0
    spec_draft_token_num: int = 0
    spec_verify_ct: int = 0
    completion_token_num: int = 0


@dataclass
class StandInPrefixCacheInfo:
    cached_tokens: int = 0
    total_prompt_tokens: int = 0


@dataclass
class StandInSample:
    """Test double of slime's ``Sample`` (a dataclass; this is one too)."""

    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    prompt: str | list[dict[str, str]] = ""
    tokens: list[int] = field(default_factory=list)
    multimodal_inputs: dict[str, Any] | None = None
    multimodal_train_inputs: dict[str, Any] | None = None
    multimodal_train_input_id: str | None = None
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    rollout_top_p_token_ids: list[int] | None = None
    rollout_top_p_token_offsets: list[int] | None = None
    rollout_routed_experts: Any = None
    """slime types it ``list[list[int]] | torch.Tensor``; ours are numpy int32 arrays."""
    remove_sample: bool = False
    teacher_log_probs: list[float] | None = None

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    status: Status = Status.PENDING
    metadata: dict[Any, Any] = field(default_factory=dict)
    generate_function_path: str | None = None
    custom_rm_path: str | None = None
    train_metadata: dict[str, Any] | None = None
    session_id: str | None = None
    non_generation_time: float = 0.0
    spec_info: StandInSpecInfo = field(default_factory=StandInSpecInfo)
    prefix_cache_info: StandInPrefixCacheInfo = field(default_factory=StandInPrefixCacheInfo)


@dataclass
class StandInFilterOutput:
    """Test double of slime's ``DynamicFilterOutput`` (same fields, order and defaults)."""

    keep: bool
    reason: str | None = None
    keep_when_insufficient: bool = False


def slime_args(
    router_url: str, checkpoint: Path, settings: BackendSettings, **overrides: object
) -> SimpleNamespace:
    """slime's parsed ``args`` as the generate function and our hooks see them, for driving the
    generate function without slime (tests, the CPU demo): the fields slime sets (names at the
    pinned commit), the hooks the launcher wires in (the generate function checks them), plus
    the custom config loaded as slime loads it, each top-level key an attribute (the config is
    JSON, so ``json.loads`` reads what ``yaml.safe_load`` would)."""
    host, _, port = router_url.removeprefix("http://").rpartition(":")
    values: dict[str, object] = {
        "hf_checkpoint": str(checkpoint),
        "sglang_router_ip": host,
        "sglang_router_port": int(port),
        "sglang_tool_call_parser": "qwen25",
        "sglang_reasoning_parser": "qwen3",
        "rollout_max_context_len": 16384,
        "rollout_max_response_len": 512,
        "rollout_temperature": 0.7,
        "n_samples_per_prompt": 4,
        "rollout_batch_size": 2,
        "advantage_estimator": "grpo",
        "rewards_normalization": True,
        "grpo_std_normalization": True,
        "router_policy": "consistent_hashing",
        "custom_generate_function_path": settings.episode.generate,
        "custom_reward_post_process_path": REWARD_HOOK,
        "rollout_sample_filter_path": GATE_HOOK,
        **json.loads(settings.custom_config()),
    }
    values.update(overrides)
    return SimpleNamespace(**values)


def slime_sampling_params(args: Any) -> dict[str, Any]:
    """The sampling dict slime's rollout builds for a training sample."""
    return {
        "temperature": args.rollout_temperature,
        "top_p": 1.0,
        "top_k": -1,
        "max_new_tokens": args.rollout_max_response_len,
        "stop": None,
        "stop_token_ids": None,
        "skip_special_tokens": False,
        "no_stop_trim": True,
        "spaces_between_special_tokens": False,
    }
