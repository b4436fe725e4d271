"""The built-in reply parser: whole replies and streams through the same state machine."""

from __future__ import annotations

from collections.abc import Sequence

from protocol_adapters._tokenizer import Vocabulary
from protocol_adapters._types import ParsedReply
from trajectory_tree import ToolSpec

from .config import ParserConfig
from .decode import strip_stop_ids
from .stream import ReplyStream
from .tool_markup import CallIdFactory, new_call_id


class BuiltinReplyParser:
    """Reasoning + Hermes JSON or Qwen3-Coder XML tool calls. Immutable: share it freely; each
    :meth:`stream` is a fresh per-reply state machine."""

    def __init__(
        self,
        config: ParserConfig | None = None,
        tools: Sequence[ToolSpec] = (),
        call_id: CallIdFactory = new_call_id,
    ) -> None:
        self.config = config or ParserConfig()
        self.tools = tuple(tools)
        self.call_id = call_id

    def stream(self) -> ReplyStream:
        return ReplyStream(self.config, self.tools, self.call_id)

    def parse_text(self, text: str) -> ParsedReply:
        stream = self.stream()
        stream.feed(text)
        stream.finish()
        return stream.reply()

    def parse_ids(self, output_ids: Sequence[int], vocabulary: Vocabulary) -> ParsedReply:
        """Parse engine output ids (decoded with every special token spelled out)."""
        return self.parse_text(vocabulary.decode(strip_stop_ids(output_ids, vocabulary)))
