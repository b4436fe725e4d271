"""Inference engines: the :class:`Engine` protocol and its SGLang ``/generate`` client."""

from .config import ROUTING_HEADER, SGLangConfig
from .protocol import Engine
from .sglang import SGLangEngine
from .types import (
    GenerateChunk,
    GenerateRequest,
    GenerateResult,
    RoutingAsk,
    SamplingParams,
    new_rid,
)

__all__ = [
    "ROUTING_HEADER",
    "Engine",
    "GenerateChunk",
    "GenerateRequest",
    "GenerateResult",
    "RoutingAsk",
    "SGLangConfig",
    "SGLangEngine",
    "SamplingParams",
    "new_rid",
]
