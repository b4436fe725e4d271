"""Shared fixtures: the real Qwen3 vocabulary, built once per machine into pytest's cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from protocol_adapters._tokenizer import Vocabulary
from protocol_adapters._tokenizer.qwen import QwenTokenizerConfig, load_qwen3_vocabulary


@pytest.fixture(scope="session")
def tokenizer_cache(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """pytest's cache dir, so the ~2 s build happens once per checkout; a temp dir without it."""
    cache = getattr(request.config, "cache", None)
    if cache is None:
        return tmp_path_factory.mktemp("qwen3-tokenizer")
    return Path(cache.mkdir("qwen3-tokenizer"))


@pytest.fixture(scope="session")
def qwen_vocabulary(tokenizer_cache: Path) -> Vocabulary:
    return load_qwen3_vocabulary(QwenTokenizerConfig(tokenizer_cache))
