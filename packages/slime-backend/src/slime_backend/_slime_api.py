"""The little of slime this package touches, and the one place that imports it.

slime is not on PyPI: it is installed from source on GPU nodes, together with torch, Megatron and
SGLang. So nothing here imports it at module import time; :func:`sample_class` does, lazily, and
says clearly what is missing. Everything else reads samples through :class:`SlimeSample`, which
``slime.utils.types.Sample`` and :class:`slime_backend.testing.StandInSample` both satisfy.
"""

from __future__ import annotations

import enum
import importlib
from typing import Any, Protocol

NAMESPACE = "agent_rl"
"""Our key in ``Sample.metadata`` and in slime's ``args`` (via ``--custom-config-path``)."""


class SlimeNotInstalled(ImportError):
    """slime is not importable in this Python environment."""


def sample_class() -> type[Any]:
    """``slime.utils.types.Sample``, imported on first use."""
    try:
        module = importlib.import_module("slime.utils.types")
    except ImportError as exc:
        raise SlimeNotInstalled(
            "slime is not importable here: it is installed from source on the GPU nodes "
            "(https://github.com/THUDM/slime), not from PyPI. Pass a sample class explicitly "
            "(slime_backend.testing.StandInSample in tests)."
        ) from exc
    cls: type[Any] = module.Sample
    return cls


def filter_output_class() -> type[Any]:
    """slime's ``DynamicFilterOutput``, what a dynamic-sampling filter returns (a plain ``bool``
    is read as ``keep`` by slime, losing the reason). Where slime is not installed at all (tests,
    tools), :class:`slime_backend.testing.StandInFilterOutput`; a slime without the class
    raises: its contract moved."""
    try:
        module = importlib.import_module("slime.rollout.filter_hub.base_types")
    except ModuleNotFoundError as exc:
        if exc.name != "slime":
            raise
        from .testing import StandInFilterOutput

        return StandInFilterOutput
    cls: type[Any] = module.DynamicFilterOutput
    return cls


class SlimeSample(Protocol):
    """The fields of slime's ``Sample`` this package reads (see docs/slime-contract.md)."""

    @property
    def index(self) -> int | None: ...
    @property
    def group_index(self) -> int | None: ...
    @property
    def rollout_id(self) -> int | None: ...
    @property
    def reward(self) -> float | dict[str, Any] | None: ...
    @property
    def status(self) -> enum.Enum: ...
    @property
    def metadata(self) -> dict[Any, Any]: ...
    @property
    def loss_mask(self) -> list[int] | None: ...
    @property
    def response_length(self) -> int: ...


def episode_key(sample: SlimeSample) -> int:
    """The episode a sample belongs to: its ``rollout_id``, else its ``index``, as slime's own
    loss reducer and data-parallel schedule fall back."""
    key = sample.rollout_id if sample.rollout_id is not None else sample.index
    if key is None:
        raise ValueError("a sample has neither rollout_id nor index: slime always sets index")
    return key
