"""Fixtures of the cross-package tests: the real Qwen3 vocabulary and the real agent CLIs.

The CLIs come from harness's pinned installer, cached per user in ~/.cache/agent-rl/npm (the
same cache harness's own tests use), so a warm machine pays no download. Only a missing npm
skips the tests that run a CLI, and it says so where nobody can miss it.
"""

from __future__ import annotations

import asyncio
import shutil
import warnings
from pathlib import Path

import pytest

from harness import CLAUDE_CODE_CLI, CODEX_CLI, InstallConfig, InstalledCli, install_cli
from protocol_adapters import QwenTokenizerConfig, Vocabulary, load_qwen3_vocabulary

# The shared assertions live in helper modules: let pytest explain their failures too.
pytest.register_assert_rewrite("tests.cli_session", "tests.trust_checks")

NPM_CACHE = Path.home() / ".cache" / "agent-rl" / "npm"


@pytest.fixture(scope="session")
def tokenizer_cache(request: pytest.FixtureRequest) -> Path:
    return Path(request.config.cache.mkdir("qwen3-tokenizer"))


@pytest.fixture(scope="session")
def qwen_vocabulary(tokenizer_cache: Path) -> Vocabulary:
    return load_qwen3_vocabulary(QwenTokenizerConfig(tokenizer_cache))


@pytest.fixture(scope="session")
def npm_install_config() -> InstallConfig:
    if shutil.which("npm") is None:
        reason = (
            "!!! NPM IS NOT AVAILABLE: the real Claude Code and Codex CLIs cannot be installed, "
            "so the CLI-through-adapter tests are SKIPPED. Install Node.js + npm to run them. !!!"
        )
        warnings.warn(reason, stacklevel=2)
        pytest.skip(reason)
    return InstallConfig(cache_dir=NPM_CACHE)


@pytest.fixture(scope="session")
def claude_code_cli(npm_install_config: InstallConfig) -> InstalledCli:
    return asyncio.run(install_cli(CLAUDE_CODE_CLI, npm_install_config))


@pytest.fixture(scope="session")
def codex_cli(npm_install_config: InstallConfig) -> InstalledCli:
    return asyncio.run(install_cli(CODEX_CLI, npm_install_config))
