"""Clients of the three dialects for the server tests: the official SDKs (``max_retries=0``), raw
HTTP for what an SDK cannot send, and each dialect's error shape as its clients expect it.

The expected statuses, error types and codes are written out here from the providers' public
documentation, not imported from the dialect modules, so a wrong mapping there fails a test.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
import anthropic
import openai
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from protocol_adapters.testing.stack import LocalStack

Dialect = Literal["anthropic", "openai_chat", "openai_responses"]
DIALECTS: tuple[Dialect, ...] = ("anthropic", "openai_chat", "openai_responses")
PATHS: dict[Dialect, str] = {
    "anthropic": "/v1/messages",
    "openai_chat": "/v1/chat/completions",
    "openai_responses": "/v1/responses",
}

Kind = Literal[
    "invalid", "context", "auth", "not_found", "too_large", "rate", "api", "overloaded", "timeout"
]
# kind -> (status, Anthropic error type)
ANTHROPIC_ERRORS: dict[Kind, tuple[int, str]] = {
    "invalid": (400, "invalid_request_error"),
    "context": (400, "invalid_request_error"),
    "auth": (401, "authentication_error"),
    "not_found": (404, "not_found_error"),
    "too_large": (413, "request_too_large"),
    "rate": (429, "rate_limit_error"),
    "api": (500, "api_error"),
    "timeout": (504, "timeout_error"),
    "overloaded": (529, "overloaded_error"),
}
ANTHROPIC_CLASSES: dict[Kind, type[anthropic.APIStatusError]] = {
    "invalid": anthropic.BadRequestError,
    "context": anthropic.BadRequestError,
    "auth": anthropic.AuthenticationError,
    "not_found": anthropic.NotFoundError,
    "too_large": anthropic.ContentTooLargeError,
    "rate": anthropic.RateLimitError,
    "api": anthropic.InternalServerError,
    "timeout": anthropic.GatewayTimeoutError,
    "overloaded": anthropic.OverloadedError,
}
# kind -> (status, OpenAI error type, code)
OPENAI_ERRORS: dict[Kind, tuple[int, str, str | None]] = {
    "invalid": (400, "invalid_request_error", None),
    "context": (400, "invalid_request_error", "context_length_exceeded"),
    "auth": (401, "invalid_request_error", "invalid_api_key"),
    "not_found": (404, "invalid_request_error", "not_found"),
    "too_large": (413, "invalid_request_error", "request_too_large"),
    "rate": (429, "rate_limit_error", "rate_limit_exceeded"),
    "api": (500, "server_error", "server_error"),
    "overloaded": (503, "server_error", "server_overloaded"),
    "timeout": (504, "server_error", "timeout"),
}
OPENAI_CLASSES: dict[Kind, type[openai.APIStatusError]] = {
    "invalid": openai.BadRequestError,
    "context": openai.BadRequestError,
    "auth": openai.AuthenticationError,
    "not_found": openai.NotFoundError,
    "too_large": openai.APIStatusError,
    "rate": openai.RateLimitError,
    "api": openai.InternalServerError,
    "overloaded": openai.InternalServerError,
    "timeout": openai.InternalServerError,
}


def anthropic_client(stack: LocalStack, token: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=stack.server.url, api_key=token, max_retries=0)


def openai_client(stack: LocalStack, token: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=stack.server.url + "/v1", api_key=token, max_retries=0)


def minimal_body(dialect: Dialect, text: str, *, max_tokens: int = 64) -> dict[str, Any]:
    """The smallest valid non-streaming request of a dialect: one user message."""
    if dialect == "anthropic":
        return {
            "model": "policy",
            "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": text}],
        }
    if dialect == "openai_chat":
        return {
            "model": "policy",
            "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": text}],
        }
    return {"model": "policy", "max_output_tokens": max_tokens, "input": text}


async def sdk_post(stack: LocalStack, dialect: Dialect, token: str, body: object) -> str:
    """POST ``body`` (any JSON) through the dialect's SDK; return the reply text.

    Errors surface as the SDK's own exception classes, as an agent would see them.
    """
    if dialect == "anthropic":
        async with anthropic_client(stack, token) as api:
            message = await api.post(PATHS[dialect], body=body, cast_to=anthropic.types.Message)
            return "".join(b.text for b in message.content if b.type == "text")
    async with openai_client(stack, token) as oai:
        path = PATHS[dialect].removeprefix("/v1")
        if dialect == "openai_chat":
            completion = await oai.post(path, body=body, cast_to=ChatCompletion)
            return completion.choices[0].message.content or ""
        response = await oai.post(path, body=body, cast_to=Response)
        return response.output_text


@dataclass(frozen=True, slots=True)
class RawAnswer:
    status: int
    body: Any
    headers: dict[str, str]


async def raw_request(
    stack: LocalStack,
    path: str,
    data: bytes | None = None,
    *,
    token: str | None = None,
    method: str = "POST",
) -> RawAnswer:
    """One plain HTTP request, for bodies and headers no SDK would send."""
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, stack.server.url + path, data=data, headers=headers) as response,
    ):
        text = await response.text()
        assert response.content_type == "application/json", text
        return RawAnswer(response.status, json.loads(text), dict(response.headers))


def assert_error_body(dialect: Dialect, status: int, body: Any, kind: Kind) -> str:
    """``body`` is exactly the dialect's error shape for ``kind``; returns the message."""
    if dialect == "anthropic":
        expected_status, error_type = ANTHROPIC_ERRORS[kind]
        assert status == expected_status
        assert body["type"] == "error"
        assert body["error"]["type"] == error_type
        assert set(body) == {"type", "error"}
        assert set(body["error"]) == {"type", "message"}
    else:
        expected_status, error_type, code = OPENAI_ERRORS[kind]
        error = body["error"]
        assert status == expected_status
        assert (error["type"], error["code"]) == (error_type, code)
        assert set(body) == {"error"}
        assert set(error) == {"message", "type", "param", "code"}
    message = body["error"]["message"]
    assert isinstance(message, str)
    assert message
    return message


def assert_sdk_error(dialect: Dialect, exc: BaseException, kind: Kind) -> str:
    """The SDK raised its class for ``kind`` over a body in the dialect's shape."""
    if dialect == "anthropic":
        assert isinstance(exc, ANTHROPIC_CLASSES[kind]), repr(exc)
    else:
        assert isinstance(exc, OPENAI_CLASSES[kind]), repr(exc)
    response = exc.response
    return assert_error_body(dialect, response.status_code, response.json(), kind)


def sdk_error_types(dialect: Dialect) -> type[Exception]:
    return anthropic.APIStatusError if dialect == "anthropic" else openai.APIStatusError
