"""Clients of the three dialects for the server tests: the official SDKs (``max_retries=0``), raw
HTTP for what an SDK cannot send, and each dialect's error shape as its clients expect it.

The expected statuses, error types and codes are written out here from the providers' public
documentation, not imported from the dialect modules, so a wrong mapping there fails a test.
"""

from __future__ import annotations

import functools
import json
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import aiohttp
import anthropic
import openai
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from protocol_adapters._server.config import AdapterConfig
from protocol_adapters._server.sessions import Session
from protocol_adapters._tokenizer import Vocabulary
from protocol_adapters.testing import ScriptedReply
from protocol_adapters.testing.stack import LocalStack, local_stack

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


@functools.cache
def _tls() -> ssl.SSLContext:
    """One TLS context for all test clients. These servers speak plain HTTP, but every SDK client
    would otherwise load the CA bundle again (~50 ms each, most of a short test)."""
    return ssl.create_default_context()


def anthropic_client(
    stack: LocalStack, token: str, *, max_retries: int = 0
) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(
        base_url=stack.server.url,
        api_key=token,
        max_retries=max_retries,
        http_client=anthropic.DefaultAsyncHttpxClient(verify=_tls()),
    )


def openai_client(stack: LocalStack, token: str, *, max_retries: int = 0) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=stack.server.url + "/v1",
        api_key=token,
        max_retries=max_retries,
        http_client=openai.DefaultAsyncHttpxClient(verify=_tls()),
    )


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


class SdkClient:
    """One dialect's official SDK client for one session token (``async with``)."""

    def __init__(self, stack: LocalStack, dialect: Dialect, token: str) -> None:
        self.dialect = dialect
        self._anthropic = anthropic_client(stack, token) if dialect == "anthropic" else None
        self._openai = None if dialect == "anthropic" else openai_client(stack, token)

    async def post(self, body: object) -> str:
        """POST ``body`` (any JSON) to the dialect's endpoint; return the reply text.

        Errors surface as the SDK's own exception classes, as an agent would see them.
        """
        path = PATHS[self.dialect]
        if self._anthropic is not None:
            message = await self._anthropic.post(path, body=body, cast_to=anthropic.types.Message)
            return "".join(b.text for b in message.content if b.type == "text")
        assert self._openai is not None
        path = path.removeprefix("/v1")
        if self.dialect == "openai_chat":
            completion = await self._openai.post(path, body=body, cast_to=ChatCompletion)
            return completion.choices[0].message.content or ""
        response = await self._openai.post(path, body=body, cast_to=Response)
        return response.output_text

    async def __aenter__(self) -> SdkClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._anthropic is not None:
            await self._anthropic.close()
        if self._openai is not None:
            await self._openai.close()


async def sdk_post(stack: LocalStack, dialect: Dialect, token: str, body: object) -> str:
    """One request with a client of its own."""
    async with SdkClient(stack, dialect, token) as client:
        return await client.post(body)


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


async def raw_stream(stack: LocalStack, dialect: Dialect, token: str, body: object) -> str:
    """A streamed request's whole answer as text (status 200 expected)."""
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            stack.server.url + PATHS[dialect],
            json=body,
            headers={"Authorization": f"Bearer {token}"},
        ) as response,
    ):
        assert response.status == 200, await response.text()
        assert response.content_type == "text/event-stream"
        return await response.text()


def sse_payloads(raw: str) -> list[Any]:
    """The JSON of every ``data:`` line of an SSE answer (``[DONE]`` left out)."""
    lines = [line.removeprefix("data: ") for line in raw.splitlines() if line.startswith("data: ")]
    return [json.loads(line) for line in lines if line != "[DONE]"]


def assert_error_body(dialect: Dialect, status: int, body: Any, kind: Kind) -> str:
    """``body`` is exactly the dialect's error shape for ``kind``; returns the message."""
    expected = ANTHROPIC_ERRORS[kind][0] if dialect == "anthropic" else OPENAI_ERRORS[kind][0]
    assert status == expected
    return assert_error_shape(dialect, body, kind)


def assert_error_shape(dialect: Dialect, body: Any, kind: Kind) -> str:
    """The body (or in-stream error event) of ``kind`` in the dialect's shape; returns the
    message."""
    if dialect == "anthropic":
        assert body["type"] == "error"
        assert body["error"]["type"] == ANTHROPIC_ERRORS[kind][1]
        assert set(body) == {"type", "error"}
        assert set(body["error"]) == {"type", "message"}
    else:
        _, error_type, code = OPENAI_ERRORS[kind]
        error = body["error"]
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


def status_error(exc: BaseException) -> anthropic.APIStatusError | openai.APIStatusError:
    """``exc`` as an SDK's HTTP status error, whose ``response`` is the raw answer."""
    assert isinstance(exc, anthropic.APIStatusError | openai.APIStatusError), repr(exc)
    return exc


# -- nothing lost or corrupted ---------------------------------------------------------------


OK = ScriptedReply(text="ok")


def always_ok(input_ids: object) -> ScriptedReply:
    del input_ids
    return OK


def shape(session: Session) -> tuple[int, int, int]:
    """What a refused request must not change: nodes, turns, branches."""
    tree = session.tree
    return len(tree.nodes), len(tree.turns), sum(1 for _ in tree.leaves())


class Checked:
    """A stack with one seeded session; ``after_refusal`` proves nothing changed or broke."""

    def __init__(
        self, stack: LocalStack, dialect: Dialect, session: Session, client: SdkClient
    ) -> None:
        self.stack = stack
        self.dialect = dialect
        self.session = session
        self.token = self.session.token
        self.client = client
        self._calls = 0
        self._before: tuple[int, int, int] = (0, 0, 0)
        self._engine_calls = 0

    async def good(self) -> None:
        self._calls += 1
        body = minimal_body(self.dialect, f"good request {self._calls}")
        assert await self.client.post(body) == "ok"

    async def seed(self) -> None:
        await self.good()
        self._before = shape(self.session)
        self._engine_calls = len(self.stack.double.requests)

    async def after_refusal(self, *, engine_calls: int = 0) -> None:
        """The tree is as it was, the engine saw ``engine_calls`` more requests, and a good
        request on the same session is answered and recorded."""
        assert shape(self.session) == self._before, "a refused request changed the tree"
        assert len(self.stack.double.requests) == self._engine_calls + engine_calls
        turns = len(self.session.tree.turns)
        await self.good()
        assert len(self.session.tree.turns) == turns + 1


@asynccontextmanager
async def checked(
    tokenizer_cache: Path,
    vocabulary: Vocabulary,
    dialect: Dialect,
    config: AdapterConfig | None = None,
    *,
    seed: bool = True,
    **stack_options: Any,
) -> AsyncIterator[Checked]:
    """A local stack answering "ok" to everything, with one session seeded by a good turn
    (``seed=False``: call :meth:`Checked.seed` yourself)."""
    async with local_stack(
        always_ok,
        tokenizer_cache=tokenizer_cache,
        vocabulary=vocabulary,
        config=config,
        **stack_options,
    ) as stack:
        session = stack.server.sessions.open(f"bad-input-{dialect}")
        async with SdkClient(stack, dialect, session.token) as client:
            check = Checked(stack, dialect, session, client)
            if seed:
                await check.seed()
            yield check
