"""Token logprobs for the clients that ask for them (Chat ``logprobs`` / ``top_logprobs``,
Responses ``include: ["message.output_text.logprobs"]`` / ``top_logprobs``): exactly the engine's,
one per generated token, with the engine's most likely alternatives (SGLang's
``top_logprobs_num``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from server_clients import (
    PATHS,
    assert_error_body,
    minimal_body,
    openai_client,
    raw_request,
    raw_stream,
    sse_payloads,
)

from protocol_adapters._server.config import AdapterConfig
from protocol_adapters._tokenizer import Vocabulary
from protocol_adapters.testing import ScriptedReply
from protocol_adapters.testing.stack import LocalStack, local_stack

REPLY = ScriptedReply(reasoning="Short.", text="Café 猫 done.", tool_calls=[("ls", {"path": "."})])
TOOLS = [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}]


def engine_logprob(position: int, token_id: int) -> float:
    return -(1 + (token_id * 3 + position) % 17) / 32


def expected(stack: LocalStack) -> list[tuple[list[int], float]]:
    ids = stack.double.reply_ids(REPLY)
    return [
        (list(stack.vocabulary.token_bytes(t)), engine_logprob(i, t)) for i, t in enumerate(ids)
    ]


def assert_engine_logprobs(
    stack: LocalStack, entries: list[dict[str, Any]], top: int, *, replayed: bool = False
) -> None:
    assert [(e["bytes"], e["logprob"]) for e in entries] == expected(stack)
    for entry in entries:
        assert bytes(entry["bytes"]).decode(errors="replace") in entry["token"] or entry[
            "token"
        ].startswith("bytes:")
        alternatives = entry["top_logprobs"]
        if replayed:
            assert alternatives == []  # alternatives are not recorded
            continue
        assert len(alternatives) == top
        assert (alternatives[0]["bytes"], alternatives[0]["logprob"]) == (
            entry["bytes"],
            entry["logprob"],
        )


def stack_of(tokenizer_cache: Path, vocabulary: Vocabulary, **config: Any) -> Any:
    return local_stack(
        [REPLY] * 4,
        tokenizer_cache=tokenizer_cache,
        vocabulary=vocabulary,
        logprob=engine_logprob,
        config=AdapterConfig(**config),
    )


async def test_chat_logprobs_are_the_engines_whole_and_streamed(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    async with stack_of(tokenizer_cache, qwen_vocabulary) as stack:
        session = stack.server.sessions.open("chat-logprobs")
        body = minimal_body("openai_chat", "Where am I?") | {
            "tools": TOOLS,
            "logprobs": True,
            "top_logprobs": 3,
        }
        async with openai_client(stack, session.token) as oai:
            completion = await oai.chat.completions.create(**body)
            chunks = [c async for c in await oai.chat.completions.create(**body, stream=True)]
        whole = completion.choices[0].logprobs
        assert whole is not None
        assert whole.content is not None
        entries = [e.model_dump() for e in whole.content]
        assert len(entries) == completion.usage.completion_tokens
        assert_engine_logprobs(stack, entries, 3)
        streamed = [
            e.model_dump()
            for chunk in chunks
            if chunk.choices and chunk.choices[0].logprobs
            for e in chunk.choices[0].logprobs.content or []
        ]
        assert streamed == entries
        assert [r.top_logprobs for r in stack.double.requests] == [3, 3]


async def test_chat_without_logprobs_asks_the_engine_for_none(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    async with stack_of(tokenizer_cache, qwen_vocabulary) as stack:
        session = stack.server.sessions.open("no-logprobs")
        async with openai_client(stack, session.token) as oai:
            completion = await oai.chat.completions.create(
                **minimal_body("openai_chat", "hi") | {"logprobs": True}
            )
            plain = await oai.chat.completions.create(**minimal_body("openai_chat", "hi"))
    assert plain.choices[0].logprobs is None
    logprobs = completion.choices[0].logprobs
    assert logprobs is not None
    assert logprobs.content is not None
    assert all(e.top_logprobs == [] for e in logprobs.content)
    assert "top_logprobs_num" not in stack.double.requests[0].body  # logprobs without top-k
    assert "top_logprobs_num" not in stack.double.requests[1].body


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_responses_logprobs_are_the_engines(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary, stream: bool
) -> None:
    async with stack_of(tokenizer_cache, qwen_vocabulary) as stack:
        session = stack.server.sessions.open("responses-logprobs")
        body = minimal_body("openai_responses", "Where am I?") | {
            "tools": [{"type": "function", "name": "ls", "parameters": {"type": "object"}}],
            "include": ["message.output_text.logprobs"],
            "top_logprobs": 2,
        }
        if stream:
            payloads = sse_payloads(
                await raw_stream(stack, "openai_responses", session.token, body | {"stream": True})
            )
            final = payloads[-1]["response"]
            deltas = [
                e
                for p in payloads
                if p["type"] == "response.output_text.delta"
                for e in p["logprobs"]
            ]
        else:
            async with openai_client(stack, session.token) as oai:
                final = (await oai.responses.create(**body)).model_dump()
            deltas = None
    (message,) = [item for item in final["output"] if item["type"] == "message"]
    entries = message["content"][0]["logprobs"]
    assert len(entries) == final["usage"]["output_tokens"]
    assert_engine_logprobs(stack, entries, 2)
    if deltas is not None:  # the ones generated by the end of the text, in order
        assert deltas == entries[: len(deltas)]
        assert deltas


async def test_a_replay_gives_the_recorded_logprobs(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    async with stack_of(tokenizer_cache, qwen_vocabulary, replay_retries=True) as stack:
        session = stack.server.sessions.open("replayed")
        body = minimal_body("openai_chat", "Where am I?") | {
            "tools": TOOLS,
            "logprobs": True,
            "top_logprobs": 3,
        }
        answers = [
            await raw_request(stack, PATHS["openai_chat"], json.dumps(body).encode(), token=t)
            for t in (session.token, session.token)
        ]
    assert len(stack.double.requests) == 1  # the second was the same agent asking again
    first, again = (a.body["choices"][0]["logprobs"]["content"] for a in answers)
    assert_engine_logprobs(stack, first, 3)
    assert_engine_logprobs(stack, again, 3, replayed=True)


@pytest.mark.parametrize(
    ("dialect", "extra", "named"),
    [
        ("openai_chat", {"top_logprobs": 2}, "needs logprobs"),
        ("openai_chat", {"logprobs": True, "top_logprobs": 21}, "<= 20"),
        ("openai_chat", {"logprobs": "yes"}, "logprobs"),
        ("openai_responses", {"top_logprobs": -1}, "top_logprobs"),
    ],
)
async def test_bad_logprob_requests_are_400(
    tokenizer_cache: Path,
    qwen_vocabulary: Vocabulary,
    dialect: Any,
    extra: dict[str, Any],
    named: str,
) -> None:
    async with stack_of(tokenizer_cache, qwen_vocabulary) as stack:
        session = stack.server.sessions.open("bad")
        body = minimal_body(dialect, "hi") | extra
        answer = await raw_request(
            stack, PATHS[dialect], json.dumps(body).encode(), token=session.token
        )
    assert named in assert_error_body(dialect, answer.status, answer.body, "invalid")
