"""The engine's timeouts are adapter settings: they travel in slime's custom config and reach the
SGLang client the generate function's adapter uses."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from protocol_adapters import SGLangConfig
from slime_backend import AgentSettings, BackendSettings, EpisodeSettings
from slime_backend._rollout_args import RolloutArgs
from slime_backend._runtime import engine_config
from slime_backend._settings import AdapterSettings
from slime_backend._typed_config import ConfigError
from slime_backend.testing import slime_args

EPISODE = EpisodeSettings("swe_rl.rollout.generate")
AGENT = AgentSettings("claude-code")


def settings_in_slime(settings: BackendSettings) -> BackendSettings:
    """The settings as slime hands them back: written by the launcher, read from ``args``."""
    return BackendSettings.from_args(SimpleNamespace(**json.loads(settings.custom_config())))


def test_the_timeouts_reach_the_routers_client() -> None:
    adapter = AdapterSettings(
        engine_connections=64,
        engine_connect_timeout=1.5,
        engine_request_timeout=300.0,
        engine_stream_idle_timeout=30.0,
    )
    settings = settings_in_slime(BackendSettings(EPISODE, AGENT, adapter=adapter))
    args = RolloutArgs.from_args(slime_args("http://10.0.0.2:30000", Path("/ckpt"), settings))
    config = engine_config(args, settings)
    assert config == SGLangConfig(
        "http://10.0.0.2:30000",
        connect_timeout=1.5,
        request_timeout=300.0,
        stream_idle_timeout=30.0,
        max_connections=64,
    )


def test_by_default_the_client_keeps_its_own_defaults() -> None:
    settings = BackendSettings(EPISODE, AGENT)
    args = RolloutArgs.from_args(slime_args("http://10.0.0.2:30000", Path("/ckpt"), settings))
    assert engine_config(args, settings) == SGLangConfig(
        "http://10.0.0.2:30000", max_connections=settings.adapter.engine_connections
    )


@pytest.mark.parametrize(
    "field", ["engine_connect_timeout", "engine_request_timeout", "engine_stream_idle_timeout"]
)
@pytest.mark.parametrize("value", [0, -1.0, float("inf")])
def test_a_timeout_that_is_not_a_positive_number_is_refused_by_name(
    field: str, value: float
) -> None:
    mapping: dict[str, Any] = {
        "agent_rl": {
            "episode": {"generate": EPISODE.generate},
            "agent": {"name": "x"},
            "adapter": {field: value},
        }
    }
    with pytest.raises(ConfigError, match=f"agent_rl.adapter.{field}"):
        BackendSettings.from_args(SimpleNamespace(**mapping))
