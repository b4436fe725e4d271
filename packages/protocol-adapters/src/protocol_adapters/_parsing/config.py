"""How to read a model's output: which tool-call format, whether it reasons, which backend."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class ToolCallFormat(StrEnum):
    """How a model family writes tool calls (markers in :mod:`.syntax`, bodies in
    :mod:`.tool_markup`)."""

    HERMES_JSON = "hermes_json"
    """Qwen3 / Hermes: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``."""
    QWEN3_CODER_XML = "qwen3_coder_xml"
    """Qwen3-Coder: ``<tool_call><function=name><parameter=p>value</parameter></function>``."""
    GLM45 = "glm45"
    """GLM-4.5/4.6: ``<tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>``."""
    LLAMA_JSON = "llama_json"
    """Llama 3.1-4 JSON tool calling: the whole reply is ``{"name": ..., "parameters": {...}}``
    (optionally after ``<|python_tag|>``; several separated by ``;``)."""
    MISTRAL = "mistral"
    """Mistral: ``[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`` to the end of the reply,
    or ``[TOOL_CALLS]name[ARGS]{...}`` per call (newer tokenizers)."""
    DEEPSEEK = "deepseek"
    """DeepSeek V3 / R1 / V3.1 / V3.2: a calls section ``<|tool calls begin|>`` ...
    ``<|tool calls end|>`` of ``<|tool call begin|>name<|tool sep|>{...}<|tool call end|>``
    (V3.1+; or ``function<|tool sep|>name`` and a json code block, V3 and R1). The real markers
    are single tokens spelled with full-width bars and ``▁`` for spaces (:mod:`.tool_markup`)."""
    MINIMAX_M1 = "minimax_m1"
    """MiniMax-M1: ``<tool_calls>`` then one ``{"name": ..., "arguments": {...}}`` per line, then
    ``</tool_calls>``."""
    OLMO3 = "olmo3"
    """OLMo 3: ``<function_calls>`` then one pythonic call ``name(a='v', n=3, flag=true)`` per line,
    then ``</function_calls>``: strings in single quotes as they are (no escaping), ``true``,
    ``false``, ``null`` and other values as JSON."""
    PHI4_MINI = "phi4_mini"
    """Phi-4-mini: ``functools[{"name": ..., "arguments": {...}}, ...]`` to the end of the reply."""
    GEMMA4 = "gemma4"
    """Gemma 4: ``<|tool_call>call:name{key:value,...}<tool_call|>`` per call, strings between
    ``<|"|>`` delimiters, keys bare, numbers and booleans bare."""


SGLANG_TOOL_PARSERS: dict[ToolCallFormat, str] = {
    ToolCallFormat.HERMES_JSON: "qwen25",
    ToolCallFormat.QWEN3_CODER_XML: "qwen3_coder",
    ToolCallFormat.GLM45: "glm45",
    ToolCallFormat.LLAMA_JSON: "llama3",
    ToolCallFormat.MISTRAL: "mistral",
    ToolCallFormat.DEEPSEEK: "deepseekv31",
    ToolCallFormat.GEMMA4: "gemma4",
}
"""SGLang's ``--tool-call-parser`` name for each format it has a parser for (``sglang_tool_parser``
overrides it: ``deepseekv3`` for V3 / R1, ``llama4`` for Llama 4, ``glm`` in newer SGLang
releases). SGLang has none for MiniMax-M1 (its ``minimax-m2`` / ``-m3`` read other markup), OLMo 3
(its ``pythonic`` wants a ``[call(...), ...]`` list) or Phi-4-mini: the SGLang backend leaves
their tool calls to the built-in parser."""


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
    ``--tool-call-parser`` / ``--reasoning-parser`` values, used only by the SGLang backend;
    ``sglang_tool_parser`` defaults to the one for ``tool_format`` (None: SGLang has none)."""

    tool_format: ToolCallFormat = ToolCallFormat.HERMES_JSON
    reasoning: bool = True
    starts_in_reasoning: bool = False
    backend: ParserBackend = ParserBackend.BUILTIN
    sglang_tool_parser: str | None = None
    sglang_reasoning_parser: str = "qwen3"

    @property
    def sglang_tool_parser_name(self) -> str | None:
        return self.sglang_tool_parser or SGLANG_TOOL_PARSERS.get(self.tool_format)
