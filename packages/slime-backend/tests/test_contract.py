"""Our side of slime's contract, pinned against the facts extracted at the pinned commit."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, get_args

import pytest

from slime_backend import SlimeNotInstalled, sample_class
from slime_backend._grpo import EPSILON, MEAN_ESTIMATORS, STD_ESTIMATORS
from slime_backend.launcher import GATE_HOOK, REWARD_HOOK, AdvantageEstimator
from slime_backend.testing import StandInSample

DATA = Path(__file__).resolve().parent / "data"
CONTRACT = json.loads((DATA / "slime_contract.json").read_text())


def slime_load_function(path: str) -> Any:
    """slime's ``load_function``: import the module before the last dot, take the attribute."""
    module, _, attribute = path.rpartition(".")
    return getattr(importlib.import_module(module), attribute)


def test_the_stand_in_has_slimes_sample_fields_in_order() -> None:
    assert [f.name for f in dataclasses.fields(StandInSample)] == CONTRACT["sample_fields"]
    assert [s.value for s in StandInSample.Status] == CONTRACT["sample_status"]


def test_our_normalization_constants_are_slimes() -> None:
    builtin = CONTRACT["normalization"]
    assert set(builtin["mean_estimators"]) == MEAN_ESTIMATORS
    assert set(builtin["std_estimators"]) == STD_ESTIMATORS
    assert builtin["std_epsilon"] == EPSILON
    assert list(get_args(AdvantageEstimator)) == CONTRACT["advantage_estimators"]


def test_the_reward_hook_loads_and_takes_what_slime_passes() -> None:
    hook = slime_load_function(REWARD_HOOK)
    inspect.signature(hook).bind(object(), [])  # custom_reward_post_process_func(args, samples)


def test_the_gate_hook_loads_and_takes_what_slime_passes() -> None:
    hook = slime_load_function(GATE_HOOK)
    inspect.signature(hook).bind(object(), [])  # filter_func(args, data)


def test_the_dynamic_filters_load_and_take_what_slime_passes() -> None:
    for name in ("check_reward_nonzero_std", "check_reward_nonzero_std_with_fallback"):
        hook = slime_load_function(f"slime_backend.dynamic_filter.{name}")
        inspect.signature(hook).bind(object(), [])  # dynamic_filter(args, group)


def test_slime_is_imported_only_when_asked_and_missing_it_says_what_to_do() -> None:
    with pytest.raises(SlimeNotInstalled, match="installed from source on the GPU nodes"):
        sample_class()


def test_importing_the_package_pulls_in_no_gpu_stack() -> None:
    modules = [
        "slime_backend",
        "slime_backend.launcher",
        "slime_backend.gate_hook",
        "slime_backend.reward_hook",
        "slime_backend.dynamic_filter",
        "slime_backend.testing",
        "slime_backend.generate",
    ]
    heavy = ("slime", "torch", "ray", "sglang", "megatron")
    probe = (
        f"import sys\nfor m in {modules!r}: __import__(m)\n"
        f"print(sorted(m for m in {heavy!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
