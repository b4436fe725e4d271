"""Tokenizers that work offline: the real Qwen3 vocabulary, and any ``tokenizer.json``."""

from .qwen import QwenTokenizerConfig, bundled_tiktoken_file, load_qwen3_vocabulary
from .special_tokens import QWEN3_ADDED_TOKENS, AddedTokenSpec
from .vocabulary import TooManyTokens, Vocabulary

__all__ = [
    "QWEN3_ADDED_TOKENS",
    "AddedTokenSpec",
    "QwenTokenizerConfig",
    "TooManyTokens",
    "Vocabulary",
    "bundled_tiktoken_file",
    "load_qwen3_vocabulary",
]
