"""Text that is not valid Unicode is refused at the door, in the client's dialect, naming where.

A JSON string may carry a lone surrogate (``"\\ud800"``) and an HTTP header any bytes. Such text
can be neither tokenized nor written to a tree file or an HTTP body: accepted, it used to make a
whole session's tree unreadable (500 on every read) and lose it on close. Now every string that
reaches the tree or the tokenizer is valid Unicode, and a request that is not gets a 400.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from server_clients import (
    PATHS,
    Checked,
    Dialect,
    assert_error_body,
    checked,
    minimal_body,
    raw_request,
)

from protocol_adapters._tokenizer import Vocabulary
from trajectory_tree import dumps, linearize, loads

LONE = "\ud800"
"""Sent as the JSON escape ``\\ud800``: ``json.dumps`` writes it that way."""

BASH = {"name": "Bash", "description": "Run a shell command", "input_schema": {"type": "object"}}


def anthropic_history(*, call_id: str = "toolu_1", signature: str = "sig") -> dict[str, Any]:
    return {
        "model": "policy",
        "max_tokens": 64,
        "tools": [BASH],
        "messages": [
            {"role": "user", "content": "list the files"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "ls it", "signature": signature},
                    {"type": "tool_use", "id": call_id, "name": "Bash", "input": {"c": "ls"}},
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": call_id, "content": "a.py"}],
            },
        ],
    }


def chat_history(*, call_id: str = "call_1") -> dict[str, Any]:
    call = {"id": call_id, "type": "function", "function": {"name": "Bash", "arguments": "{}"}}
    return {
        "model": "policy",
        "max_tokens": 64,
        "messages": [
            {"role": "user", "content": "list the files"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call_id, "content": "a.py"},
        ],
    }


def edited(dialect: Dialect, edit: Callable[[dict[str, Any]], object]) -> dict[str, Any]:
    body = minimal_body(dialect, "hello")
    edit(body)
    return body


# (case, dialect, body, the field the error must name)
CASES: list[tuple[str, Dialect, dict[str, Any], str]] = [
    ("model", "anthropic", edited("anthropic", lambda b: b.update(model=LONE)), "model"),
    (
        "content",
        "anthropic",
        edited("anthropic", lambda b: b["messages"][0].update(content=f"hi {LONE}")),
        "messages.0.content",
    ),
    ("system", "anthropic", edited("anthropic", lambda b: b.update(system=LONE)), "system"),
    (
        "tool-name",
        "anthropic",
        edited("anthropic", lambda b: b.update(tools=[{**BASH, "name": LONE}])),
        "tools.0.name",
    ),
    (
        "tool-description",
        "anthropic",
        edited("anthropic", lambda b: b.update(tools=[{**BASH, "description": LONE}])),
        "tools.0.description",
    ),
    (
        "tool-use-id",
        "anthropic",
        anthropic_history(call_id=f"toolu_{LONE}"),
        "messages.1.content.1.id",
    ),
    (
        "thinking-signature",
        "anthropic",
        anthropic_history(signature=LONE),
        "messages.1.content.0.signature",
    ),
    (
        "key",
        "anthropic",
        edited("anthropic", lambda b: b.update(metadata={LONE: "x"})),
        "metadata",
    ),
    ("chat-model", "openai_chat", edited("openai_chat", lambda b: b.update(model=LONE)), "model"),
    (
        "chat-content",
        "openai_chat",
        edited("openai_chat", lambda b: b["messages"][0].update(content=LONE)),
        "messages.0.content",
    ),
    (
        "chat-tool-call-id",
        "openai_chat",
        chat_history(call_id=f"call_{LONE}"),
        "messages.1.tool_calls.0.id",
    ),
    (
        "responses-input",
        "openai_responses",
        edited("openai_responses", lambda b: b.update(input=f"a{LONE}b")),
        "input",
    ),
    (
        "responses-instructions",
        "openai_responses",
        edited("openai_responses", lambda b: b.update(instructions=LONE)),
        "instructions",
    ),
]


@pytest.mark.parametrize(("case", "dialect", "body", "field"), CASES, ids=[c[0] for c in CASES])
async def test_a_lone_surrogate_anywhere_in_the_body_is_a_400_naming_the_field(
    tokenizer_cache: Path,
    qwen_vocabulary: Vocabulary,
    case: str,
    dialect: Dialect,
    body: dict[str, Any],
    field: str,
) -> None:
    data = json.dumps(body).encode()
    assert b"\\ud800" in data  # how a client sends it
    async with checked(tokenizer_cache, qwen_vocabulary, dialect) as check:
        answer = await raw_request(check.stack, PATHS[dialect], data, token=check.token)
        message = assert_error_body(dialect, answer.status, answer.body, "invalid")
        assert message.startswith(f"{field}: ")
        assert "not valid Unicode (lone surrogate U+D800)" in message
        await check.after_refusal()
        await assert_tree_survives(check)


async def test_count_tokens_refuses_a_lone_surrogate_too(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    body = {"model": "policy", "messages": [{"role": "user", "content": LONE}]}
    async with checked(tokenizer_cache, qwen_vocabulary, "anthropic") as check:
        answer = await raw_request(
            check.stack,
            "/v1/messages/count_tokens",
            json.dumps(body).encode(),
            token=check.token,
        )
        message = assert_error_body("anthropic", answer.status, answer.body, "invalid")
        assert message.startswith("messages.0.content: ")


async def test_surrogate_pairs_are_valid_text() -> None:
    """``"\\ud83d\\ude00"`` is one emoji, not two lone surrogates."""
    data = json.dumps({"content": "\U0001f600"}).encode()
    assert b"\\ud83d\\ude00" in data
    assert json.loads(data)["content"] == "\U0001f600"


@pytest.mark.parametrize(
    "header", ["x-claude-code-session-id", "x-claude-code-agent-id", "x-codex-turn-metadata"]
)
@pytest.mark.parametrize("dialect", ["anthropic", "openai_responses"])
async def test_a_recorded_header_that_is_not_utf8_is_a_400_naming_it(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary, header: str, dialect: Dialect
) -> None:
    async with checked(tokenizer_cache, qwen_vocabulary, dialect) as check:
        status, answer = await raw_http(
            check,
            PATHS[dialect],
            json.dumps(minimal_body(dialect, "hi")).encode(),
            {header: b"a\xff\xfeb"},
        )
        message = assert_error_body(dialect, status, answer, "invalid")
        assert message == f"header {header}: not valid UTF-8"
        await check.after_refusal()
        await assert_tree_survives(check)


async def test_valid_non_ascii_headers_are_recorded_as_sent(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    async with checked(tokenizer_cache, qwen_vocabulary, "anthropic") as check:
        status, _ = await raw_http(
            check,
            PATHS["anthropic"],
            json.dumps(minimal_body("anthropic", "hi")).encode(),
            {"x-claude-code-session-id": "sessión-é".encode()},
        )
        assert status == 200
        assert check.session.tree.turns[-1].meta.extra["x-claude-code-session-id"] == "sessión-é"
        await assert_tree_survives(check)


async def raw_http(
    check: Checked, path: str, data: bytes, headers: dict[str, bytes]
) -> tuple[int, Any]:
    """A request written byte for byte: header values are sent as the given bytes."""
    host, port = check.stack.server.url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    head = [
        f"POST {path} HTTP/1.1".encode(),
        f"Host: {host}".encode(),
        b"Content-Type: application/json",
        f"Authorization: Bearer {check.token}".encode(),
        f"Content-Length: {len(data)}".encode(),
        b"Connection: close",
        *(name.encode() + b": " + value for name, value in headers.items()),
    ]
    writer.write(b"\r\n".join(head) + b"\r\n\r\n" + data)
    await writer.drain()
    response = await reader.read()
    writer.close()
    status_line, _, rest = response.partition(b"\r\n")
    _, _, body = rest.partition(b"\r\n\r\n")
    return int(status_line.split()[1]), json.loads(body)


async def assert_tree_survives(check: Checked) -> None:
    """The session's tree serializes to UTF-8, reloads, and linearizes, over the admin-free
    in-process path and the one a caller of ``close_session`` takes."""
    tree = check.session.tree
    text = dumps(tree)
    text.encode("utf-8")
    again = loads(text)
    assert len(again.turns) == len(tree.turns)
    assert [s.tokens for s in linearize(again).samples] == [
        s.tokens for s in linearize(tree).samples
    ]
