"""Shared fixtures: the real Qwen3 vocabulary, built once per machine into pytest's cache.

The tests live in one folder per area (``dialects/``, ``server/``, ``engine/``, ``template/``,
``parsing/``, ``cli/``); the modules they share (``server_clients``, ``template_session``, ...)
sit here, beside this file, which puts this folder on ``sys.path``: the workspace runs pytest with
``--import-mode=importlib``, which puts no test directory there, and test modules import their
helpers by plain name (``from server_clients import ...``). No test module imports relatively:
mypy then finds the helpers the same way (``MYPYPATH=tests``, as tools/ci.py sets it).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from protocol_adapters._tokenizer import Vocabulary
from protocol_adapters._tokenizer.qwen import QwenTokenizerConfig, load_qwen3_vocabulary

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


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
