"""Where tool calls sit in a reply, per format: the markers that open and close a call block.

The stream parser (:mod:`.stream`) finds blocks with these; :mod:`.tool_markup` reads their
bodies. Three shapes cover the families:

- marked blocks (``<tool_call>...</tool_call>``, a DeepSeek calls section, MiniMax-M1's
  ``<tool_calls>``, OLMo 3's ``<function_calls>``, Gemma 4's ``<|tool_call>``): released as soon
  as the closing marker arrives;
- a block that runs to the end of the reply (Mistral's ``[TOOL_CALLS]``, Phi-4-mini's
  ``functools[``): released at the end;
- a reply that *is* the call (Llama's JSON): a reply opening with ``{`` or ``<|python_tag|>`` is
  held to its end, then read as calls, or released as the text it is.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import ToolCallFormat
from .tool_markup import MISTRAL_CALLS, PHI4_CALLS, PYTHON_TAG

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
DEEPSEEK_CALLS_BEGIN = "<\uff5ctool\u2581calls\u2581begin\uff5c>"
DEEPSEEK_CALLS_END = "<\uff5ctool\u2581calls\u2581end\uff5c>"
MINIMAX_CALLS_OPEN = "<tool_calls>"
MINIMAX_CALLS_CLOSE = "</tool_calls>"
OLMO3_CALLS_OPEN = "<function_calls>"
OLMO3_CALLS_CLOSE = "</function_calls>"
GEMMA4_CALL_OPEN = "<|tool_call>"
GEMMA4_CALL_CLOSE = "<tool_call|>"


@dataclass(frozen=True, slots=True)
class CallSyntax:
    """``open`` starts a block anywhere in the text (empty: never); ``close`` ends it (None: the
    reply's end does); ``leading``: prefixes that make the whole reply one block when it starts
    with them (whitespace aside)."""

    open: str
    close: str | None
    leading: tuple[str, ...] = ()


SYNTAX = {
    ToolCallFormat.HERMES_JSON: CallSyntax(CALL_OPEN, CALL_CLOSE),
    ToolCallFormat.QWEN3_CODER_XML: CallSyntax(CALL_OPEN, CALL_CLOSE),
    ToolCallFormat.GLM45: CallSyntax(CALL_OPEN, CALL_CLOSE),
    ToolCallFormat.DEEPSEEK: CallSyntax(DEEPSEEK_CALLS_BEGIN, DEEPSEEK_CALLS_END),
    ToolCallFormat.MISTRAL: CallSyntax(MISTRAL_CALLS, None),
    ToolCallFormat.LLAMA_JSON: CallSyntax("", None, leading=(PYTHON_TAG, "{")),
    ToolCallFormat.MINIMAX_M1: CallSyntax(MINIMAX_CALLS_OPEN, MINIMAX_CALLS_CLOSE),
    ToolCallFormat.OLMO3: CallSyntax(OLMO3_CALLS_OPEN, OLMO3_CALLS_CLOSE),
    # ``functools[`` and not the bare word, which plain Python talk is full of.
    ToolCallFormat.PHI4_MINI: CallSyntax(PHI4_CALLS, None),
    ToolCallFormat.GEMMA4: CallSyntax(GEMMA4_CALL_OPEN, GEMMA4_CALL_CLOSE),
}
