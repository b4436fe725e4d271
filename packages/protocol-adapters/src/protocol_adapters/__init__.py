"""Anthropic, OpenAI Chat Completions and OpenAI Responses over SGLang /generate.

    from protocol_adapters import AdapterConfig, SGLangConfig, load_checkpoint, serve

    checkpoint = load_checkpoint(Path("/ckpt"))
    async with serve(
        SGLangConfig(base_url="http://engine:30000"), checkpoint.vocabulary, checkpoint.template
    ) as server:
        session = server.sessions.open("episode-17")   # the agent's API key: session.token
        ...
        tree = (await server.close_session(session.token)).tree

The public API is what this module exports, plus :mod:`protocol_adapters.testing` (an engine
double speaking SGLang's wire, for tests and demos). Every module behind it is private (a
leading underscore) and may change in any release. Names load on first use, so importing one
part never starts the whole server stack.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from protocol_adapters._audit.verdict import TemplateMode, TemplateRefused
    from protocol_adapters._bridge.renderer import Renderer, RendererConfig
    from protocol_adapters._checkpoint import Checkpoint, CheckpointError, load_checkpoint
    from protocol_adapters._engine import (
        Engine,
        GenerateChunk,
        GenerateRequest,
        GenerateResult,
        SamplingParams,
        SGLangConfig,
        SGLangEngine,
    )
    from protocol_adapters._parsing.config import ParserConfig, ToolCallFormat
    from protocol_adapters._serve import serve
    from protocol_adapters._server.config import (
        AdapterConfig,
        AdminConfig,
        RolloutSampling,
        RoutingCapture,
    )
    from protocol_adapters._server.ports import reply_parsers
    from protocol_adapters._server.runner import AdapterServer
    from protocol_adapters._server.sessions import ContextTooLarge, Session, SessionLimits
    from protocol_adapters._server.side_requests import SideRequestRule
    from protocol_adapters._server.timing import TurnTiming, TurnTimings
    from protocol_adapters._template.template import ChatTemplate, qwen3_template
    from protocol_adapters._tokenizer import QwenTokenizerConfig, Vocabulary, load_qwen3_vocabulary
    from protocol_adapters._types import AdapterError, ErrorKind

    __version__: str

__all__ = [
    "AdapterConfig",
    "AdapterError",
    "AdapterServer",
    "AdminConfig",
    "ChatTemplate",
    "Checkpoint",
    "CheckpointError",
    "ContextTooLarge",
    "Engine",
    "ErrorKind",
    "GenerateChunk",
    "GenerateRequest",
    "GenerateResult",
    "ParserConfig",
    "QwenTokenizerConfig",
    "Renderer",
    "RendererConfig",
    "RolloutSampling",
    "RoutingCapture",
    "SGLangConfig",
    "SGLangEngine",
    "SamplingParams",
    "Session",
    "SessionLimits",
    "SideRequestRule",
    "TemplateMode",
    "TemplateRefused",
    "ToolCallFormat",
    "TurnTiming",
    "TurnTimings",
    "Vocabulary",
    "load_checkpoint",
    "load_qwen3_vocabulary",
    "qwen3_template",
    "reply_parsers",
    "serve",
]

# Where each exported name lives; the TYPE_CHECKING imports above say the same to type checkers.
_HOMES = {
    "protocol_adapters._serve": ("serve",),
    "protocol_adapters._engine": (
        "Engine",
        "GenerateChunk",
        "GenerateRequest",
        "GenerateResult",
        "SGLangConfig",
        "SGLangEngine",
        "SamplingParams",
    ),
    "protocol_adapters._parsing.config": ("ParserConfig", "ToolCallFormat"),
    "protocol_adapters._bridge.renderer": ("Renderer", "RendererConfig"),
    "protocol_adapters._template.template": ("ChatTemplate", "qwen3_template"),
    "protocol_adapters._audit.verdict": ("TemplateMode", "TemplateRefused"),
    "protocol_adapters._server.config": (
        "AdapterConfig",
        "AdminConfig",
        "RolloutSampling",
        "RoutingCapture",
    ),
    "protocol_adapters._server.ports": ("reply_parsers",),
    "protocol_adapters._server.runner": ("AdapterServer",),
    "protocol_adapters._server.sessions": ("ContextTooLarge", "Session", "SessionLimits"),
    "protocol_adapters._server.side_requests": ("SideRequestRule",),
    "protocol_adapters._server.timing": ("TurnTiming", "TurnTimings"),
    "protocol_adapters._tokenizer": ("QwenTokenizerConfig", "Vocabulary", "load_qwen3_vocabulary"),
    "protocol_adapters._checkpoint": ("Checkpoint", "CheckpointError", "load_checkpoint"),
    "protocol_adapters._types": ("AdapterError", "ErrorKind"),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}

if not TYPE_CHECKING:

    def __getattr__(name: str) -> object:
        if name == "__version__":  # pyproject.toml is its one source
            from importlib.metadata import version

            return version("agent-rl-protocol-adapters")
        if name in _HOME_OF:
            from importlib import import_module

            value = getattr(import_module(_HOME_OF[name]), name)
            globals()[name] = value  # later lookups skip this function
            return value
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__})
