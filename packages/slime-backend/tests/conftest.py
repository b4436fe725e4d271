"""Makes this directory's test-support modules (``episode_kit``, ``rollout_kit``) importable by
plain name, and builds the real Qwen3 tokenizer and a checkpoint directory holding it.

The workspace runs pytest with ``--import-mode=importlib``, which puts no test directory on
``sys.path``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from protocol_adapters import QwenTokenizerConfig, Vocabulary, load_qwen3_vocabulary
from protocol_adapters.testing.checkpoint import write_checkpoint

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "slime_checkout: compares pinned facts with a real slime checkout "
        "(set AGENT_RL_SLIME_CHECKOUT to a work tree or bare git dir; skipped otherwise)",
    )


@pytest.fixture(scope="session")
def qwen_vocabulary(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Vocabulary:
    """The real Qwen3 tokenizer, built offline once per checkout into pytest's cache."""
    cache = getattr(request.config, "cache", None)
    where = (
        Path(cache.mkdir("qwen3-tokenizer"))
        if cache is not None
        else tmp_path_factory.mktemp("qwen3-tokenizer")
    )
    return load_qwen3_vocabulary(QwenTokenizerConfig(where))


@pytest.fixture(scope="session")
def qwen_checkpoint(qwen_vocabulary: Vocabulary, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Hugging Face checkpoint directory (tokenizer and chat template) for ``--hf-checkpoint``."""
    return write_checkpoint(tmp_path_factory.mktemp("checkpoint") / "Qwen3-Test", qwen_vocabulary)
