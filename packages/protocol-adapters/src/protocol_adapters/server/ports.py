"""What the server needs from a renderer and a reply parser, as structural interfaces.

The server is written against these so a deployment can plug in another chat template family or
SGLang's own parsers without touching request handling.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from protocol_adapters.types import ParsedReply, ReplyEvent
from trajectory_tree import BridgedPrompt, FullPrompt, Prompt, Route


class RenderedPrompt(Protocol):
    """The ids to send and how the tree should record them."""

    @property
    def ids(self) -> Sequence[int]: ...

    @property
    def prompt(self) -> BridgedPrompt | FullPrompt: ...


class PromptRenderer(Protocol):
    """Turns a routed request into prompt ids. Thread-safe: the server calls it off the loop."""

    def render(self, route: Route) -> RenderedPrompt: ...

    def count_tokens(self, prompt: Prompt) -> int: ...


class TokenText(Protocol):
    """The vocabulary as the server needs it: readable text for parsing, and turn-ending ids."""

    @property
    def stop_ids(self) -> frozenset[int]:
        """Ids that end an assistant turn (the engine stops on them and keeps them)."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` with special tokens kept (for the parser, never for training)."""
        ...


class StreamingReplyParser(Protocol):
    def feed(self, text: str) -> list[ReplyEvent]:
        """Events made certain by ``text``; a possible partial marker is held back."""
        ...

    def finish(self) -> tuple[list[ReplyEvent], ParsedReply]:
        """The held-back events and the whole reply, consistent with every event emitted."""
        ...


class ReplyParser(Protocol):
    def parse(self, text: str) -> ParsedReply: ...

    def streaming(self) -> StreamingReplyParser: ...
