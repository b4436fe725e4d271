"""What the server needs from a renderer, as a structural interface.

The server is written against this so a deployment can plug in another chat-template family
without touching request handling. Reply parsers have their own interface
(:class:`protocol_adapters._parsing.ReplyParser`), made per request for that request's tools.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from protocol_adapters._parsing.config import ParserBackend, ParserConfig
from protocol_adapters._parsing.select import ReplyParser, make_reply_parser, resolve_backend
from trajectory_tree import BridgedPrompt, FullPrompt, Prompt, Route, ToolSpec


class RenderedPrompt(Protocol):
    """The ids to send, how the tree should record them, and notes the turn keeps about how
    the prompt was made (the template's mode, a check's mismatch: ``TurnMeta.extra``)."""

    @property
    def ids(self) -> Sequence[int]: ...

    @property
    def prompt(self) -> BridgedPrompt | FullPrompt: ...

    @property
    def notes(self) -> Mapping[str, str]: ...


class PromptRenderer(Protocol):
    """Turns a routed request into prompt ids. Thread-safe: the server calls it off the loop.

    ``render`` raises :class:`~protocol_adapters._bridge.PromptTooLong` as soon as it knows the
    prompt holds more than ``max_tokens`` tokens (``None``: no limit), without rendering and
    tokenizing the rest of a huge request.
    """

    def render(self, route: Route, max_tokens: int | None = None) -> RenderedPrompt: ...

    def count_tokens(self, prompt: Prompt, max_tokens: int | None = None) -> int: ...


ParserFactory = Callable[[Sequence[ToolSpec]], ReplyParser]
"""Makes the reply parser for one request's tools."""


def reply_parsers(config: ParserConfig | None = None) -> ParserFactory:
    """The configured parser (built-in, or SGLang's when selected) for each request's tools.

    Whether SGLang is installed is asked once, here: the question searches every entry of
    ``sys.path`` on disk (~0.3 ms), which every model call paid before. A backend that cannot be
    had (``SGLANG`` without SGLang) is refused here too, not at the first request."""
    sglang = resolve_backend(config or ParserConfig()) is ParserBackend.SGLANG

    def make(tools: Sequence[ToolSpec]) -> ReplyParser:
        return make_reply_parser(config, tools, sglang_installed=sglang)

    return make
