"""The context length: learned from the engine at start, never configured larger than it, and
every "prompt is too long" the adapter sends is true (the prompt really exceeds the limit).

That message is what makes Claude Code compact its history, so a false one costs an agent its
context for nothing. A ``max_tokens`` larger than the room left is clamped instead, the way the
room is left: SGLang refuses ``prompt + max_new_tokens >= context``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import anthropic
import pytest

from protocol_adapters._engine import SGLangConfig, SGLangEngine
from protocol_adapters._rendering.renderer import Renderer
from protocol_adapters._rendering.template import qwen3_template
from protocol_adapters._server.config import AdapterConfig
from protocol_adapters._server.ports import reply_parsers
from protocol_adapters._server.runner import AdapterServer
from protocol_adapters._server.sessions import ContextTooLarge, SessionLimits
from protocol_adapters._tokenizer import Vocabulary
from protocol_adapters.testing import EngineDouble
from protocol_adapters.testing.stack import VocabularyTokenizer, local_stack
from trajectory_tree import LossReason
from trajectory_tree import summarize as summarize_tree

from .server_clients import (
    DIALECTS,
    PATHS,
    Dialect,
    always_ok,
    anthropic_client,
    assert_error_body,
    minimal_body,
    raw_request,
    sdk_post,
)

TOO_LONG = re.compile(r"^prompt is too long: (\d+) tokens > (\d+) maximum$")


async def test_the_server_refuses_to_start_with_a_context_larger_than_the_engines(
    qwen_vocabulary: Vocabulary,
) -> None:
    """A larger context would let prompts through that the engine refuses: with a huge
    ``max_tokens`` that read as "prompt is too long: 9 tokens > 8 maximum"."""
    config = AdapterConfig(limits=SessionLimits(context_tokens=65536))
    async with (
        EngineDouble(VocabularyTokenizer(qwen_vocabulary), [], context_length=32768) as double,
        SGLangEngine(SGLangConfig(base_url=double.url)) as engine,
    ):
        server = AdapterServer(
            config,
            engine,
            Renderer(qwen_vocabulary, qwen3_template()),
            qwen_vocabulary,
            reply_parsers(),
        )
        with pytest.raises(ContextTooLarge, match=r"65536.*32768"):
            await server.start()
        # nothing listens after a refused start
        with pytest.raises(RuntimeError, match="not running"):
            _ = server.url


async def test_sessions_get_the_engines_context_and_never_a_larger_one(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    async with local_stack(
        always_ok,
        tokenizer_cache=tokenizer_cache,
        vocabulary=qwen_vocabulary,
        engine_context_length=12000,
    ) as stack:
        registry = stack.server.sessions
        assert registry.open("default").context_tokens == 12000
        assert registry.open(
            "smaller", limits=SessionLimits(context_tokens=4096)
        ).context_tokens == (4096)
        with pytest.raises(ContextTooLarge, match="12000"):
            registry.open("larger", limits=SessionLimits(context_tokens=12001))


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_huge_max_tokens_is_clamped_to_the_room_left(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary, dialect: Dialect
) -> None:
    """Agent CLIs ask for output budgets sized for provider models (Claude Code: up to 128,000
    tokens), larger than a training engine's whole context: the reply gets what room is left."""
    async with local_stack(
        always_ok,
        tokenizer_cache=tokenizer_cache,
        vocabulary=qwen_vocabulary,
        engine_context_length=4096,
    ) as stack:
        session = stack.server.sessions.open("clamp")
        body = minimal_body(dialect, "hi", max_tokens=10**9)
        assert await sdk_post(stack, dialect, session.token, body) == "ok"
    sent = stack.double.requests[0]
    assert sent.sampling_params["max_new_tokens"] == 4096 - 1 - len(sent.input_ids)
    turn = session.tree.turns[0]
    assert turn.meta.extra["client_max_tokens"] == str(10**9)
    assert turn.meta.extra["max_new_tokens"] == str(sent.sampling_params["max_new_tokens"])


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_a_prompt_the_engine_calls_too_long_is_reported_with_its_true_numbers(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary, stream: bool
) -> None:
    """The engine restarted with a smaller context than the adapter learned: its own refusal of
    a long prompt still reads as the compaction trigger, with the engine's real numbers."""
    async with local_stack(
        always_ok, tokenizer_cache=tokenizer_cache, vocabulary=qwen_vocabulary
    ) as stack:
        session = stack.server.sessions.open("engine-limit")
        stack.double.context_length = 64
        body = minimal_body("anthropic", "please read this long task description " * 20)
        answer = await raw_request(
            stack,
            PATHS["anthropic"],
            json.dumps(body | {"stream": stream}).encode(),
            token=session.token,
        )
    message = assert_error_body("anthropic", answer.status, answer.body, "context")
    match = TOO_LONG.match(message)
    assert match is not None, message
    tokens, maximum = int(match[1]), int(match[2])
    assert tokens == len(stack.double.requests[0].input_ids)  # the prompt the engine refused
    assert maximum == 64 - 2
    assert tokens > maximum
    assert session.tree.turns == []


async def test_an_engine_refusing_only_the_output_budget_is_no_prompt_too_long(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    """The prompt fits the engine's (shrunken) context but prompt + max_new_tokens does not: that
    must not tell the client to compact. It is the adapter's error (a 500 api_error)."""
    async with local_stack(
        always_ok, tokenizer_cache=tokenizer_cache, vocabulary=qwen_vocabulary
    ) as stack:
        session = stack.server.sessions.open("budget")
        async with anthropic_client(stack, session.token) as api:
            stack.double.context_length = 200
            with pytest.raises(anthropic.InternalServerError) as err:
                await api.messages.create(
                    model="policy", max_tokens=4096, messages=[{"role": "user", "content": "hi"}]
                )
    message = err.value.body["error"]["message"]  # type: ignore[index]
    assert not message.startswith("prompt is too long")
    assert "context" in message


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_prompt_too_long_is_true_at_the_boundary(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary, dialect: Dialect
) -> None:
    """A prompt of exactly context - 2 tokens is served (one token of room); one more is not."""
    body: dict[str, Any] = minimal_body(dialect, "x")
    async with local_stack(
        always_ok, tokenizer_cache=tokenizer_cache, vocabulary=qwen_vocabulary
    ) as stack:
        probe = stack.server.sessions.open("probe")
        await sdk_post(stack, dialect, probe.token, body)
        prompt = len(stack.double.requests[0].input_ids)
        fits = stack.server.sessions.open("fits", limits=SessionLimits(context_tokens=prompt + 2))
        answer = await raw_request(
            stack, PATHS[dialect], json.dumps(body).encode(), token=fits.token
        )
        assert answer.status == 200, answer.body
        assert stack.double.requests[-1].sampling_params["max_new_tokens"] == 1
        tight = stack.server.sessions.open("tight", limits=SessionLimits(context_tokens=prompt + 1))
        answer = await raw_request(
            stack, PATHS[dialect], json.dumps(body).encode(), token=tight.token
        )
    message = assert_error_body(dialect, answer.status, answer.body, "context")
    assert message == f"prompt is too long: {prompt} tokens > {prompt - 1} maximum"


class CountingTokenizer:
    """A real tokenizer that tallies how many characters it was asked to encode."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.characters = 0

    def encode_batch(self, texts: list[str], **kwargs: Any) -> Any:
        self.characters += sum(map(len, texts))
        return self._inner.encode_batch(texts, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_huge_prompt_is_refused_after_the_limit_not_at_its_end(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary, dialect: Dialect
) -> None:
    """A 4 MB request over a 32k context: refused as too long with a count that is a true lower
    bound, having encoded a small fraction of it (the benchmark measures time and memory)."""
    counting = CountingTokenizer(qwen_vocabulary.tokenizer)
    vocabulary = Vocabulary(counting, "qwen3")  # type: ignore[arg-type]
    huge = "def handler(event):\n    return process(event, retries=3)\n" * 75_000
    async with local_stack(
        always_ok, tokenizer_cache=tokenizer_cache, vocabulary=vocabulary
    ) as stack:
        session = stack.server.sessions.open("huge")
        body = minimal_body(dialect, huge)
        before = counting.characters
        answer = await raw_request(
            stack, PATHS[dialect], json.dumps(body).encode(), token=session.token
        )
        encoded = counting.characters - before
    message = assert_error_body(dialect, answer.status, answer.body, "context")
    match = TOO_LONG.match(message)
    assert match is not None, message
    tokens, maximum = int(match[1]), int(match[2])
    assert maximum == 32768 - 2
    assert maximum < tokens <= qwen_vocabulary.count(huge)
    assert encoded < len(huge) / 10
    assert stack.double.requests == []
    assert session.tree.turns == []


async def test_a_request_resent_without_its_oldest_messages_is_noted_and_never_trained(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    """Refused as too long, Claude Code resends its compaction request without the oldest
    messages, the task first: what the model writes then was written without the task. The
    turn is recorded with a note saying so and excluded from training; another agent's
    request, or one that is no shortened resend, is not."""
    task = {"role": "user", "content": "THE TASK: fix the parser " + "detail " * 400}
    middle = [
        {"role": "assistant", "content": "looking"},
        {"role": "user", "content": "more " * 50},
    ]
    summarize = {"role": "user", "content": "Summarize the conversation so far."}
    async with local_stack(
        always_ok,
        tokenizer_cache=tokenizer_cache,
        vocabulary=qwen_vocabulary,
        engine_context_length=400,
    ) as stack:
        session = stack.server.sessions.open("shortened")
        async with anthropic_client(stack, session.token) as api:

            async def ask(messages: list[dict[str, str]], agent: str | None = None) -> None:
                headers = {"x-claude-code-agent-id": agent} if agent else {}
                await api.messages.create(
                    model="policy",
                    max_tokens=16,
                    system="agent",
                    messages=messages,  # type: ignore[arg-type]
                    extra_headers=headers,
                )

            with pytest.raises(anthropic.BadRequestError, match="prompt is too long"):
                await ask([task, *middle, summarize])
            await ask([{"role": "user", "content": "a sub-agent's own request"}], agent="a1")
            await ask([middle[1], summarize])  # the resend: the task and one reply dropped
            await ask([{"role": "user", "content": "go on from the summary"}])
    sub_agent, resent, after = session.tree.turns
    assert resent.meta.extra["history_dropped"] == (
        "resent without its first 2 of 4 messages after a too-long refusal; "
        "the first user message (the task) among them"
    )
    assert "history_dropped" not in sub_agent.meta.extra
    assert "history_dropped" not in after.meta.extra
    summary = summarize_tree(session.tree)
    assert summary.history_dropped == 1
    assert summary.excluded_tokens == {LossReason.HISTORY_DROPPED: resent.output_length}
