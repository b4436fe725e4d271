"""Pick the reply parser the config asks for, with a clear error when it cannot be had."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from protocol_adapters._tokenizer import Vocabulary
from protocol_adapters._types import ParsedReply, ReplyEvent
from trajectory_tree import ToolSpec

from .builtin import BuiltinReplyParser
from .config import ParserBackend, ParserConfig
from .sglang_backend import SGLangReplyParser, sglang_available
from .tool_markup import CallIdFactory, new_call_id


class ReplyStreamLike(Protocol):
    """One reply being parsed: ``feed`` text deltas, then ``finish``, then ``reply``."""

    @property
    def malformed(self) -> int: ...

    def feed(self, text: str) -> list[ReplyEvent]: ...
    def finish(self) -> list[ReplyEvent]: ...
    def reply(self) -> ParsedReply: ...


class ReplyParser(Protocol):
    """What the server needs from a parser: whole replies and per-reply streams."""

    def stream(self) -> ReplyStreamLike: ...
    def parse_text(self, text: str) -> ParsedReply: ...
    def parse_ids(self, output_ids: Sequence[int], vocabulary: Vocabulary) -> ParsedReply: ...


class SGLangUnavailable(RuntimeError):
    """``ParserBackend.SGLANG`` was configured on a machine without SGLang."""


def resolve_backend(config: ParserConfig, *, sglang_installed: bool | None = None) -> ParserBackend:
    """``BUILTIN`` or ``SGLANG``: what ``config.backend`` means on this machine."""
    installed = sglang_available() if sglang_installed is None else sglang_installed
    if config.backend is ParserBackend.AUTO:
        return ParserBackend.SGLANG if installed else ParserBackend.BUILTIN
    if config.backend is ParserBackend.SGLANG and not installed:
        raise SGLangUnavailable(
            "the SGLang parser backend is configured but sglang is not installed "
            "(install protocol-adapters[sglang], or use ParserBackend.BUILTIN / AUTO)"
        )
    return config.backend


def make_reply_parser(
    config: ParserConfig | None = None,
    tools: Sequence[ToolSpec] = (),
    call_id: CallIdFactory = new_call_id,
    *,
    sglang_installed: bool | None = None,
) -> ReplyParser:
    """The configured parser for one request's tools."""
    config = config or ParserConfig()
    if resolve_backend(config, sglang_installed=sglang_installed) is ParserBackend.SGLANG:
        return SGLangReplyParser(config, tools, call_id)
    return BuiltinReplyParser(config, tools, call_id)
