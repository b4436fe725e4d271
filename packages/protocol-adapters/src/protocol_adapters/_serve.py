"""The adapter in-process in one call: engine client, renderer, parsers and server, closed together.

Every part stays available on its own (``AdapterServer`` takes any :class:`Engine`, renderer and
parsers); this is the way for the common case, the SGLang engine at a URL.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from protocol_adapters._bridge.renderer import Renderer, RendererConfig
from protocol_adapters._engine import SGLangConfig, SGLangEngine
from protocol_adapters._parsing.config import ParserConfig
from protocol_adapters._server.config import AdapterConfig
from protocol_adapters._server.ports import reply_parsers
from protocol_adapters._server.runner import AdapterServer
from protocol_adapters._template.template import ChatTemplate, qwen3_template
from protocol_adapters._tokenizer import Vocabulary


@asynccontextmanager
async def serve(
    engine: SGLangConfig,
    vocabulary: Vocabulary,
    template: ChatTemplate | None = None,
    config: AdapterConfig | None = None,
    *,
    renderer: RendererConfig | None = None,
    parsers: ParserConfig | None = None,
) -> AsyncIterator[AdapterServer]:
    """Serve the three dialects in front of the SGLang engine at ``engine.base_url``.

    ``vocabulary`` and ``template`` are the policy's tokenizer and chat template (a checkpoint's
    come from :func:`load_checkpoint`; ``template`` defaults to our Qwen3 template). Yields the
    started server (``server.url``, ``server.sessions``); leaving the block stops it, aborting
    what is still generating, then closes the engine client. Starting raises
    :class:`ContextTooLarge` when ``config`` asks for more context than the engine has, and
    :class:`AdapterError` when the engine cannot be asked.
    """
    prompts = Renderer(vocabulary, template or qwen3_template(), renderer)
    async with (
        SGLangEngine(engine) as client,
        AdapterServer(
            config or AdapterConfig(), client, prompts, vocabulary, reply_parsers(parsers)
        ) as server,
    ):
        yield server
