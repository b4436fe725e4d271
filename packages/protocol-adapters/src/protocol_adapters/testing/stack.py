"""The whole adapter on one machine without a GPU: real tokenizer, real template, real server,
real SGLang client, and the SGLang-wire engine double in place of the engine.

For tests, demos and benchmarks only: the "model" replies from a script. Everything between the
agent and the engine's HTTP port is the production code path.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from protocol_adapters._bridge.renderer import Renderer, RendererConfig
from protocol_adapters._engine import SGLangConfig, SGLangEngine
from protocol_adapters._server.config import AdapterConfig
from protocol_adapters._server.ports import reply_parsers
from protocol_adapters._server.runner import AdapterServer
from protocol_adapters._template.template import qwen3_template
from protocol_adapters._tokenizer import Vocabulary
from protocol_adapters._tokenizer.qwen import QwenTokenizerConfig, load_qwen3_vocabulary

from .engine_double import EngineDouble, Faults, Logprob, Script


class VocabularyTokenizer:
    """A :class:`Vocabulary` with the Hugging Face-style surface the engine double expects."""

    def __init__(self, vocabulary: Vocabulary) -> None:
        self.vocabulary = vocabulary

    def encode(self, text: str, /, *, add_special_tokens: bool) -> list[int]:
        del add_special_tokens  # a Vocabulary never adds tokens
        return self.vocabulary.encode(text)

    def decode(self, token_ids: list[int], /, *, skip_special_tokens: bool) -> str:
        if skip_special_tokens:
            token_ids = [t for t in token_ids if not self.vocabulary.is_added(t)]
        return self.vocabulary.decode(token_ids)

    def convert_tokens_to_ids(self, tokens: str, /) -> int | list[int] | None:
        try:
            return self.vocabulary.token_id(tokens)
        except KeyError:
            return None


@dataclass(frozen=True, slots=True)
class LocalStack:
    server: AdapterServer
    double: EngineDouble
    vocabulary: Vocabulary
    renderer: Renderer


@asynccontextmanager
async def local_stack(
    script: Script,
    *,
    tokenizer_cache: Path,
    config: AdapterConfig | None = None,
    renderer_config: RendererConfig | None = None,
    logprob: Logprob = -0.125,
    faults: Faults | None = None,
    vocabulary: Vocabulary | None = None,
    engine_config: Callable[[str], SGLangConfig] | None = None,
    engine_context_length: int = 32768,
) -> AsyncIterator[LocalStack]:
    """Start the engine double and the adapter in front of it; stop both on exit."""
    vocab = vocabulary or load_qwen3_vocabulary(QwenTokenizerConfig(tokenizer_cache))
    renderer = Renderer(vocab, qwen3_template(), renderer_config or RendererConfig())
    tokenizer = VocabularyTokenizer(vocab)
    async with EngineDouble(
        tokenizer,
        script,
        logprob=logprob,
        faults=faults,
        context_length=engine_context_length,
        incremental_streaming=True,  # as SGLang should run (--incremental-streaming-output)
    ) as double:
        sglang = engine_config(double.url) if engine_config else SGLangConfig(base_url=double.url)
        async with SGLangEngine(sglang) as engine:
            server = AdapterServer(
                config or AdapterConfig(), engine, renderer, vocab, reply_parsers()
            )
            async with server:
                yield LocalStack(server, double, vocab, renderer)
