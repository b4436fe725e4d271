"""Neutral types shared by the dialects, the renderer, the parsers and the engine client.

Each dialect module turns a provider request into a :class:`NeutralRequest` and a stream of
:data:`ReplyEvent` back into the provider's response format; nothing else in the package knows
what a provider's JSON looks like.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypeAlias

from trajectory_tree import FinishReason, Message, Prompt, ToolCall


@dataclass(frozen=True, slots=True)
class ClientSampling:
    """Sampling settings the client asked for; the rollout's settings may override them."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: tuple[str, ...] = ()
    json_schema: str | None = None
    """The JSON schema (as JSON text) the reply must follow: the client asked for structured
    output. Always honoured, whoever decides the sampling."""
    logprobs: bool = False
    """Whether the client wants each generated token's logprob back."""
    top_logprobs: int = 0
    """How many most likely alternatives it wants per token (with ``logprobs``)."""


@dataclass(frozen=True, slots=True)
class NeutralRequest:
    """A model call in provider-neutral form."""

    dialect: str
    model: str
    prompt: Prompt
    sampling: ClientSampling
    stream: bool
    metadata: Mapping[str, str] = field(default_factory=dict)
    body_bytes: int = 0
    """Size of the request body it came from: the server schedules huge ones apart."""


@dataclass(frozen=True, slots=True)
class Usage:
    """Real token counts: both CLIs decide when to compact from these."""

    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One generated token as the engine gave it, for clients that ask for logprobs.

    ``token`` is its text (``bytes:\\xe7\\x8c`` style when it is part of a UTF-8 character),
    ``raw`` its exact bytes; ``top`` the most likely tokens at its position, most likely first.
    """

    token: str
    raw: bytes
    logprob: float
    top: tuple[TokenLogprob, ...] = ()


# -- what a reply is made of, in the order the model produced it ------------------------------


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallDone:
    """A complete tool call (streamed as soon as its closing marker is seen)."""

    call: ToolCall


ReplyEvent: TypeAlias = ReasoningDelta | TextDelta | ToolCallDone


class StopReason(StrEnum):
    """Why the reply ended, as the dialects need it."""

    END_TURN = "end_turn"
    TOOL_USE = "tool_use"
    MAX_TOKENS = "max_tokens"


def stop_reason(finish: FinishReason, reply: Message) -> StopReason:
    if finish is FinishReason.LENGTH:
        return StopReason.MAX_TOKENS
    return StopReason.TOOL_USE if reply.tool_calls else StopReason.END_TURN


@dataclass(frozen=True, slots=True)
class ParsedReply:
    """An engine output parsed into an assistant message.

    ``malformed_tool_calls`` counts tool-call markup that did not parse; that text is kept in the
    message as plain text, never dropped.
    """

    message: Message
    malformed_tool_calls: int = 0


class ErrorKind(StrEnum):
    """Failures every dialect can report, each mapped to its own status and error shape."""

    INVALID_REQUEST = "invalid_request"
    AUTHENTICATION = "authentication"
    NOT_FOUND = "not_found"
    REQUEST_TOO_LARGE = "request_too_large"
    CONTEXT_LENGTH = "context_length"
    RATE_LIMITED = "rate_limited"
    OVERLOADED = "overloaded"
    ENGINE_ERROR = "engine_error"
    TIMEOUT = "timeout"


class AdapterError(Exception):
    """An error to answer in the client's dialect; ``kind`` picks status and shape. ``param``
    names the offending request field where the dialect's error shape has a place for it."""

    def __init__(self, kind: ErrorKind, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.param = param
