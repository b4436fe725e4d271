"""The generate function slime loads, and `swe-rl rollout`.

slime imports `swe_rl.rollout.generate` (`--custom-generate-function-path`) in its rollout
process, before any of the run's settings exist in code: the episode it runs is built on first
use from `args.agent_rl` (slime-backend calls `configure(settings)`): the agent by name, the
sandbox backend by name, and their options:

    agent:   name "claude-code" | "codex"; options {"model": <name the CLI sends>}
    sandbox: backend "local" | "e2b"; options {"artifacts_root": dir, "cache_dir": dir,
             "isolation": "bwrap" | "none" (refused unless "allow_unsandboxed": "true"),
             "image_cache": dir (default $SWE_RL_IMAGE_CACHE, else ~/.cache/agent-rl/images),
             "registry_plain_http": "host:port,..." , "registry_credentials": JSON file,
             "e2b_template": ... (E2B, with E2B_API_KEY in the environment)}

`swe-rl rollout` drives the same generate function against a real SGLang server, exactly as
slime's rollout would, and writes a run directory (see swe_rl/run.py).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness import InstallConfig
from sandbox import E2BBackend, E2BConfig, LocalBackend, LocalConfig, SandboxBackend
from slime_backend import AdapterSession, BackendSettings, Budgets, EpisodeOutcome, JsonValue
from slime_backend.generate import make_generate
from swe_rl.agents import harness_for
from swe_rl.environment import image_cache_config
from swe_rl.episode import EpisodeConfig, SweEpisode
from trajectory_tree import SessionTree

DEFAULT_ROOT = Path(tempfile.gettempdir()) / "swe-rl"


class ConfigurationError(ValueError):
    """Settings the app cannot run episodes with (named in the message)."""


def build_episode(settings: BackendSettings) -> SweEpisode:
    """The episode a run's settings describe (see the module docstring for the options)."""
    options = dict(settings.sandbox.options)
    root = Path(options.get("artifacts_root", str(DEFAULT_ROOT / "episodes")))
    cache = Path(options.get("cache_dir", str(Path.home() / ".cache" / "agent-rl")))
    try:
        agent = harness_for(settings.agent.name)
    except ValueError as error:
        raise ConfigurationError(f"agent.name: {error}") from None
    config = EpisodeConfig(
        artifacts_root=root,
        install=InstallConfig(cache_dir=cache / "npm"),
        sources_cache=cache / "sources",
        model_name=settings.agent.options.get("model", "policy-under-training"),
        on_budget="grade" if options.get("on_budget") == "grade" else "abort",
    )
    return SweEpisode(config, agent, sandbox_backend(settings.sandbox.backend, options))


def sandbox_backend(name: str, options: Mapping[str, str]) -> SandboxBackend:
    """The backend a worker runs episodes in, from the run's sandbox settings."""
    if name == "local":
        isolation = options.get("isolation", "bwrap")
        if isolation == "none" and options.get("allow_unsandboxed") != "true":
            raise ConfigurationError(
                "sandbox.options.isolation: 'none' runs model-written code on the host; "
                "refused unless sandbox.options.allow_unsandboxed is 'true'"
            )
        if isolation not in ("bwrap", "none"):
            raise ConfigurationError(f"sandbox.options.isolation: unknown {isolation!r}")
        cache = options.get("image_cache")
        credentials = options.get("registry_credentials")
        try:
            images = image_cache_config(
                Path(cache) if cache else None,
                plain_http=options.get("registry_plain_http", "").split(","),
                credentials=Path(credentials) if credentials else None,
            )
        except ValueError as error:
            raise ConfigurationError(f"sandbox.options.registry_credentials: {error}") from None
        if isolation == "none":
            return LocalBackend(LocalConfig(isolation="none"))  # refuses images anyway
        return LocalBackend(LocalConfig(isolation="bwrap", images=images))
    if name == "e2b":
        key = os.environ.get("E2B_API_KEY")
        if not key:
            raise ConfigurationError("sandbox.backend 'e2b' needs E2B_API_KEY in the environment")
        template = options.get("e2b_template", "base")
        return E2BBackend(E2BConfig(api_key=key, template=template))
    raise ConfigurationError(f"sandbox.backend: unknown {name!r} (use 'local' or 'e2b')")


class ConfiguredEpisode:
    """The episode slime runs, built from the run's settings on first use in each process."""

    def __init__(self) -> None:
        self._episode: SweEpisode | None = None

    def configure(self, settings: BackendSettings) -> None:
        if self._episode is None:
            self._episode = build_episode(settings)

    async def __call__(
        self,
        task: Mapping[str, JsonValue],
        session: AdapterSession,
        budgets: Budgets,
        *,
        evaluation: bool,
    ) -> EpisodeOutcome:
        if self._episode is None:
            return EpisodeOutcome.aborted("the episode was never configured with the settings")
        return await self._episode(task, session, budgets, evaluation=evaluation)

    def finished(self, tree: SessionTree, outcome: EpisodeOutcome) -> None:
        if self._episode is not None:
            self._episode.finished(tree, outcome)

    def __getstate__(self) -> dict[str, Any]:
        return {}  # Ray ships it to each worker unbuilt; each builds its own there

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._episode = None


generate = make_generate(ConfiguredEpisode())
"""What `--custom-generate-function-path swe_rl.rollout.generate` loads."""
