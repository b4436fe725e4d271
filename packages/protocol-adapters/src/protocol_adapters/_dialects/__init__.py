"""The three wire dialects, behind one interface the server can dispatch on.

Each dialect module (``anthropic``, ``openai_chat``, ``openai_responses``) offers
``parse_request``, ``response_body``, ``StreamEncoder``, ``error_response`` and
``new_response_id``; :data:`DIALECTS` wraps them so the server handles every endpoint the same
way::

    dialect = DIALECTS["anthropic"]
    request = dialect.parse_request(body)            # AdapterError(INVALID_REQUEST) on bad input
    encoder = dialect.stream_encoder(request, response_id)
    writer.write(encoder.start(Usage(prompt_tokens, 0)))
    for event in reply_events: writer.write(encoder.event(event))
    writer.write(encoder.logprobs(tokens))                # when the client asked for them
    writer.write(encoder.finish(stop, usage))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
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

from . import anthropic, openai_chat, openai_responses


class StreamEncoder(Protocol):
    """One streamed response: each method returns the SSE bytes to write, in call order."""

    def start(self, usage_in: Usage) -> bytes: ...

    def event(self, e: ReplyEvent) -> bytes: ...

    def logprobs(self, tokens: Sequence[TokenLogprob]) -> bytes: ...

    def finish(self, stop: StopReason, usage: Usage) -> bytes: ...

    def error(self, kind: ErrorKind, message: str) -> bytes: ...


@dataclass(frozen=True, slots=True)
class Dialect:
    """A wire dialect with a uniform signature: everything is derived from the parsed request."""

    name: str
    parse_request: Callable[[object], NeutralRequest]
    response_body: Callable[
        [NeutralRequest, ParsedReply, Usage, StopReason, str, Sequence[TokenLogprob] | None],
        dict[str, object],
    ]
    stream_encoder: Callable[[NeutralRequest, str], StreamEncoder]
    error_response: Callable[[ErrorKind, str, str | None], tuple[int, dict[str, object]]]
    new_response_id: Callable[[], str]
    echoed: Callable[[Message], Message] = lambda message: message
    """A reply as this dialect's clients hold it and echo it back: what the tree records, so
    the echo routes back onto the reply (the engine's ids are the same either way)."""


Logprobs = Sequence[TokenLogprob] | None
"""The generated tokens' logprobs, when the client asked for them."""


def _anthropic_body(
    request: NeutralRequest,
    reply: ParsedReply,
    usage: Usage,
    stop: StopReason,
    response_id: str,
    logprobs: Logprobs,
) -> dict[str, object]:
    del logprobs  # the Messages API has no token logprobs
    return anthropic.response_body(reply, usage, stop, request.model, response_id)


def _chat_body(
    request: NeutralRequest,
    reply: ParsedReply,
    usage: Usage,
    stop: StopReason,
    response_id: str,
    logprobs: Logprobs,
) -> dict[str, object]:
    return openai_chat.response_body(
        reply, usage, stop, request.model, response_id, logprobs=logprobs
    )


def _responses_body(
    request: NeutralRequest,
    reply: ParsedReply,
    usage: Usage,
    stop: StopReason,
    response_id: str,
    logprobs: Logprobs,
) -> dict[str, object]:
    return openai_responses.response_body(
        reply, usage, stop, request.model, response_id, request=request, logprobs=logprobs
    )


def _anthropic_stream(request: NeutralRequest, response_id: str) -> StreamEncoder:
    return anthropic.StreamEncoder(request.model, response_id)


def _chat_stream(request: NeutralRequest, response_id: str) -> StreamEncoder:
    include_usage = request.metadata.get("include_usage") == "true"
    return openai_chat.StreamEncoder(request.model, response_id, include_usage=include_usage)


def _responses_stream(request: NeutralRequest, response_id: str) -> StreamEncoder:
    return openai_responses.StreamEncoder(request.model, response_id, request=request)


DIALECTS: dict[str, Dialect] = {
    anthropic.DIALECT: Dialect(
        anthropic.DIALECT,
        anthropic.parse_request,
        _anthropic_body,
        _anthropic_stream,
        anthropic.error_response,
        anthropic.new_response_id,
    ),
    openai_chat.DIALECT: Dialect(
        openai_chat.DIALECT,
        openai_chat.parse_request,
        _chat_body,
        _chat_stream,
        openai_chat.error_response,
        openai_chat.new_response_id,
        openai_chat.echoed,
    ),
    openai_responses.DIALECT: Dialect(
        openai_responses.DIALECT,
        openai_responses.parse_request,
        _responses_body,
        _responses_stream,
        openai_responses.error_response,
        openai_responses.new_response_id,
    ),
}

__all__ = ["DIALECTS", "Dialect", "StreamEncoder", "anthropic", "openai_chat", "openai_responses"]
