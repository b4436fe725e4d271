"""Token logprobs in the OpenAI shape, shared by Chat Completions and Responses:
``{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}``."""

from __future__ import annotations

from collections.abc import Sequence

from protocol_adapters._types import TokenLogprob

from .json_shape import JsonObject, fail, optional_int

MAX_TOP_LOGPROBS = 20
"""The most alternatives per token the OpenAI APIs accept."""


def top_logprobs(root: JsonObject) -> int:
    """The request's ``top_logprobs`` (0 when absent), within OpenAI's bounds."""
    value = optional_int(root, "top_logprobs", "", minimum=0) or 0
    if value > MAX_TOP_LOGPROBS:
        fail("top_logprobs", f"must be <= {MAX_TOP_LOGPROBS}, got {value}")
    return value


def logprob_entries(tokens: Sequence[TokenLogprob]) -> list[dict[str, object]]:
    return [
        {
            "token": token.token,
            "logprob": token.logprob,
            "bytes": list(token.raw),
            "top_logprobs": [
                {"token": other.token, "logprob": other.logprob, "bytes": list(other.raw)}
                for other in token.top
            ],
        }
        for token in tokens
    ]
