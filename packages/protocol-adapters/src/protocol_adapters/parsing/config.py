"""How to read a model's output: which tool-call format, whether it reasons, which backend."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class ToolCallFormat(StrEnum):
    """Tool-call markup inside ``<tool_call>...</tool_call>``."""

    HERMES_JSON = "hermes_json"
    """Qwen3 / Hermes: ``{"name": ..., "arguments": {...}}``."""
    QWEN3_CODER_XML = "qwen3_coder_xml"
    """Qwen3-Coder: ``<function=name><parameter=p>value</parameter></function>``."""


class ParserBackend(StrEnum):
    BUILTIN = "builtin"
    """Our parsers: streaming, never drop malformed tool-call text (the default)."""
    SGLANG = "sglang"
    """SGLang's ``FunctionCallParser``/``ReasoningParser``; an error if SGLang is not installed."""
    AUTO = "auto"
    """SGLang's when importable, else ours."""


@dataclass(frozen=True, slots=True)
class ParserConfig:
    """``starts_in_reasoning``: the generation prompt already opened ``<think>`` (thinking-only
    checkpoints), so output is reasoning until ``</think>``. The ``sglang_*`` names are SGLang's
    ``--tool-call-parser`` / ``--reasoning-parser`` values, used only by the SGLang backend."""

    tool_format: ToolCallFormat = ToolCallFormat.HERMES_JSON
    reasoning: bool = True
    starts_in_reasoning: bool = False
    backend: ParserBackend = ParserBackend.BUILTIN
    sglang_tool_parser: str = "qwen25"
    sglang_reasoning_parser: str = "qwen3"
