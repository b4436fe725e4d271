"""Test and demo doubles (no model runs here): :class:`EngineDouble` speaks SGLang's wire
protocol over real HTTP; :class:`FunctionEngine` answers in-process, for tests of the adapter's
own logic that need no wire."""

from .engine_double import EngineDouble, Faults, Malformation, ReceivedRequest, expert_id
from .function_engine import FunctionEngine
from .scripted import Qwen3ReplyEncoder, ScriptedReply, Tokenizer, qwen3_text

__all__ = [
    "EngineDouble",
    "Faults",
    "FunctionEngine",
    "Malformation",
    "Qwen3ReplyEncoder",
    "ReceivedRequest",
    "ScriptedReply",
    "Tokenizer",
    "expert_id",
    "qwen3_text",
]
