"""Shared fixtures of the app's tests: the real Qwen3 vocabulary and the npm install cache of
the real agent CLIs (the same per-user cache the harness and cross-package tests use)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import InstallConfig
from protocol_adapters import QwenTokenizerConfig, Vocabulary, load_qwen3_vocabulary

NPM_CACHE = Path.home() / ".cache" / "agent-rl" / "npm"


@pytest.fixture(scope="session")
def qwen_vocabulary(request: pytest.FixtureRequest) -> Vocabulary:
    cache = Path(request.config.cache.mkdir("qwen3-tokenizer"))
    return load_qwen3_vocabulary(QwenTokenizerConfig(cache))


@pytest.fixture(scope="session")
def install_config() -> InstallConfig:
    return InstallConfig(cache_dir=NPM_CACHE)


# The fixture tasks' own repositories (tests/fixtures/) hold tests of their own, run in their
# images by the grader, never by this session.
collect_ignore = ["fixtures"]
