"""Test and demo doubles that speak real wire protocols (no model runs here)."""

from .engine_double import EngineDouble, Faults, Malformation, ReceivedRequest, expert_id
from .scripted import Qwen3ReplyEncoder, ScriptedReply, Tokenizer, qwen3_text

__all__ = [
    "EngineDouble",
    "Faults",
    "Malformation",
    "Qwen3ReplyEncoder",
    "ReceivedRequest",
    "ScriptedReply",
    "Tokenizer",
    "expert_id",
    "qwen3_text",
]
