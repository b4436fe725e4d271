"""Engine output -> assistant message: reasoning, text and tool calls, whole or streamed.

Malformed tool-call markup is returned as text and counted, never dropped.
"""

from .builtin import BuiltinReplyParser
from .config import ParserBackend, ParserConfig, ToolCallFormat
from .decode import IncrementalDecoder, strip_stop_ids
from .select import (
    ReplyParser,
    ReplyStreamLike,
    SGLangUnavailable,
    make_reply_parser,
    resolve_backend,
)
from .sglang_backend import SGLangReplyParser, sglang_available
from .stream import ReplyStream, assemble
from .tool_markup import new_call_id

__all__ = [
    "BuiltinReplyParser",
    "IncrementalDecoder",
    "ParserBackend",
    "ParserConfig",
    "ReplyParser",
    "ReplyStream",
    "ReplyStreamLike",
    "SGLangReplyParser",
    "SGLangUnavailable",
    "ToolCallFormat",
    "assemble",
    "make_reply_parser",
    "new_call_id",
    "resolve_backend",
    "sglang_available",
    "strip_stop_ids",
]
