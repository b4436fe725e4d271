"""The one interface the server needs from a wire dialect, and from one of its streamed replies.

Each dialect module implements :class:`Dialect` as one class; the server only ever holds a
``Dialect``, so it handles every endpoint the same way and a new dialect touches no handler.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from protocol_adapters._types import (
    ErrorKind,
    NeutralRequest,
    ParsedReply,
    ReplyEvent,
    StopReason,
    TokenLogprob,
    Usage,
)
from trajectory_tree import Message

from .parse_memo import ParseMemo

Logprobs = Sequence[TokenLogprob] | None
"""The generated tokens' logprobs, when the client asked for them."""


class StreamEncoder(Protocol):
    """One streamed response: each method returns the SSE bytes to write, in call order."""

    def start(self, usage_in: Usage) -> bytes: ...

    def event(self, e: ReplyEvent) -> bytes: ...

    def logprobs(self, tokens: Sequence[TokenLogprob]) -> bytes: ...

    def finish(self, stop: StopReason, usage: Usage) -> bytes: ...

    def error(self, kind: ErrorKind, message: str) -> bytes: ...


class Dialect(Protocol):
    """A wire dialect with a uniform signature: everything is derived from the parsed request.

    The dialects' own functions take what their format needs (a model name, a creation time);
    these methods take the neutral request instead, so the server never branches on a dialect.
    """

    name: str
    """The key in ``DIALECTS``, and the ``dialect`` of every request this dialect parses."""

    def parse_request(self, body: object, memo: ParseMemo | None = None) -> NeutralRequest:
        """Validate a request body and normalize it; raises AdapterError(INVALID_REQUEST).
        ``memo``: the session's earlier parse, so that messages it re-sends are not parsed again
        (a dialect may ignore it)."""
        ...

    def response_body(
        self,
        request: NeutralRequest,
        reply: ParsedReply,
        usage: Usage,
        stop: StopReason,
        response_id: str,
        logprobs: Logprobs,
    ) -> dict[str, object]:
        """The non-streaming response object for ``reply``."""
        ...

    def stream_encoder(self, request: NeutralRequest, response_id: str) -> StreamEncoder:
        """The encoder of one streamed response to ``request``."""
        ...

    def error_response(
        self, kind: ErrorKind, message: str, param: str | None = None
    ) -> tuple[int, dict[str, object]]:
        """HTTP status and error body, in the shape this dialect's clients branch on."""
        ...

    def new_response_id(self) -> str:
        """A fresh id with this dialect's prefix (``msg_``, ``chatcmpl-``, ``resp_``)."""
        ...

    def echoed(self, message: Message) -> Message:
        """A reply as this dialect's clients hold it and echo it back: what the tree records, so
        the echo routes back onto the reply (the engine's ids are the same either way). Most
        formats keep a reply as it is."""
        return message
