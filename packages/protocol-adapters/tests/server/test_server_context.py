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
from server_clients import (
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

from protocol_adapters._bridge.renderer import Renderer
from protocol_adapters._engine import SGLangConfig, SGLangEngine
from protocol_adapters._server.config import AdapterConfig
from protocol_adapters._server.ports import reply_parsers
from protocol_adapters._server.runner import AdapterServer
from protocol_adapters._server.sessions import ContextTooLarge, SessionLimits
from protocol_adapters._server.shortened import Refused, dropped_history
from protocol_adapters._template.template import qwen3_template
from protocol_adapters._tokenizer import Vocabulary
from protocol_adapters.testing import EngineDouble
from protocol_adapters.testing.stack import VocabularyTokenizer, local_stack
from trajectory_tree import LossReason, Message, Prompt, Text, ToolCall, ToolSpec
from trajectory_tree import summarize as summarize_tree

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

    def encode_batch_fast(self, texts: list[str], **kwargs: Any) -> Any:
        self.characters += sum(map(len, texts))
        return self._inner.encode_batch_fast(texts, **kwargs)

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
    Json = dict[str, Any]
    task: Json = {"role": "user", "content": "THE TASK: fix the parser " + "detail " * 400}
    call: Json = {"type": "tool_use", "id": "toolu_1", "name": "shell", "input": {"cmd": "ls"}}
    result: Json = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "more " * 50}
    middle: list[Json] = [
        {"role": "assistant", "content": [{"type": "text", "text": "looking"}, call]},
        {"role": "user", "content": [result]},
    ]
    summarize: Json = {"role": "user", "content": "Summarize the conversation so far."}
    placeholder: Json = {"role": "user", "content": "[earlier conversation truncated]"}
    shell: Json = {"name": "shell", "input_schema": {"type": "object"}}
    async with local_stack(
        always_ok,
        tokenizer_cache=tokenizer_cache,
        vocabulary=qwen_vocabulary,
        engine_context_length=500,
    ) as stack:
        session = stack.server.sessions.open("shortened")
        async with anthropic_client(stack, session.token) as api:

            async def ask(messages: list[Json], agent: str | None = None) -> None:
                headers = {"x-claude-code-agent-id": agent} if agent else {}
                await api.messages.create(
                    model="policy",
                    max_tokens=16,
                    system="agent",
                    tools=[shell],  # type: ignore[list-item]
                    messages=messages,  # type: ignore[arg-type]
                    extra_headers=headers,
                )

            with pytest.raises(anthropic.BadRequestError, match="prompt is too long"):
                await ask([task, *middle, summarize])
            await ask([{"role": "user", "content": "a sub-agent's own request"}], agent="a1")
            await ask([placeholder, *middle, summarize])  # the resend: the task dropped
            await ask([{"role": "user", "content": "go on from the summary"}])
    sub_agent, resent, after = session.tree.turns
    assert resent.meta.extra["history_dropped"] == (
        "resent after a too-long refusal without 1 of its 4 messages, the task among them"
    )
    assert "history_dropped" not in sub_agent.meta.extra
    assert "history_dropped" not in after.meta.extra
    summary = summarize_tree(session.tree)
    assert summary.history_dropped == 1
    assert summary.excluded_tokens == {LossReason.HISTORY_DROPPED: resent.output_length}


# dropped_history, request by request: the shapes measured from the real CLIs
# (tests/test_cli_shortened_summary.py), and what must get no note.

AGENT = Message.text("system", "You are a coding agent.")
SHELL = (ToolSpec("shell", "Run a command.", '{"type":"object"}'),)
TASK = Message.text("user", "Run the report steps, then say that you are done.")
SUMMARIZE = Message.text("user", "CONTEXT CHECKPOINT COMPACTION: summarize the conversation.")


def call(*steps: int) -> Message:
    """A reply with one shell call per step (Codex's parallel calls: one message)."""
    return Message("assistant", tuple(ToolCall(f"call_{k}", "shell", f"step {k}") for k in steps))


def output(step: int) -> Message:
    return Message("tool", (Text(f"STEP-{step}-DONE"),), tool_call_id=f"call_{step}")


def note(
    refused: list[Message], request: list[Message], tools: tuple[ToolSpec, ...] = SHELL
) -> str | None:
    return dropped_history(Refused.of(Prompt(refused, SHELL)), Prompt(request, tools))


def among_them(gone: int, total: int) -> str:
    shortened = f"resent after a too-long refusal without {gone} of its {total} messages"
    return f"{shortened}, the task among them"


@pytest.mark.parametrize("system", [[AGENT], []], ids=["system prompt", "none"])
def test_claude_codes_summary_without_the_opening_round_is_noted(system: list[Message]) -> None:
    """Claude Code 2.1.330: refused, its summary of the opening round (the task, a system
    message, the first step) is resent as a summary of every round but that one, led by a
    placeholder and a date: the rounds it had left out come between the ones it keeps."""
    environment = Message.text("system", "# Environment")
    refused = [*system, TASK, environment, call(1), output(1), SUMMARIZE]
    placeholder = Message.text("user", "[earlier conversation truncated for compaction retry]")
    date = Message.text("system", "Today's date is 2026-11-26.")
    rounds = [call(1), output(1), call(2), output(2)]
    assert note(refused, [*system, placeholder, date, *rounds, SUMMARIZE]) == among_them(2, 5)


def test_codexs_resends_are_noted_from_the_one_without_the_task() -> None:
    """Codex 0.169.0 resends its compaction request without its oldest item each time: the
    skills and the environment context (a user message before the task) go without a note,
    the task with one; the request refused last, which had lost the task already, is resent
    without its first call and that call's output: noted too."""
    skills = Message.text("system", "<skills_instructions>")
    environment = Message.text("user", "<environment_context>")
    rest = [output(1), output(2), call(3), output(3), SUMMARIZE]
    first = [AGENT, skills, environment, TASK, call(1, 2), *rest]
    without_skills = [AGENT, environment, TASK, call(1, 2), *rest]
    without_environment = [AGENT, TASK, call(1, 2), *rest]
    without_task = [AGENT, call(1, 2), *rest]
    without_call = [AGENT, call(2), *rest[1:]]
    assert note(first, without_skills) is None
    assert note(without_skills, without_environment) is None
    assert note(without_environment, without_task) == among_them(1, 7)
    assert note(without_task, without_call) == (
        "resent after a too-long refusal without 2 of its 6 messages, "
        "its task gone in an earlier resend"
    )


CONVERSATION = [AGENT, TASK, call(1), output(1), call(2), output(2)]
TASKLESS = [AGENT, call(1), output(1), call(2), output(2), SUMMARIZE]
"""A request already resent without its task (and refused again)."""


@pytest.mark.parametrize(
    ("refused", "sent"),
    [
        pytest.param(CONVERSATION, CONVERSATION, id="retry"),
        pytest.param(CONVERSATION, [*CONVERSATION, call(3), output(3)], id="continuation"),
        pytest.param(CONVERSATION, [*CONVERSATION[:4], SUMMARIZE], id="summary with the task"),
        pytest.param(TASKLESS, TASKLESS, id="retry without the task"),
        pytest.param(TASKLESS, [*TASKLESS, call(3), output(3)], id="continuation without it"),
    ],
)
def test_a_request_that_drops_nothing_more_is_not_noted(
    refused: list[Message], sent: list[Message]
) -> None:
    """A retry of the refused request, a continuation of it, a request for a summary that still
    holds the task (Claude Code's first, of the opening round): not written without the task,
    or (the refused request had lost it already) the note belongs to the resend that lost it."""
    assert note(refused, sent) is None


REFUSED = [AGENT, TASK, call(1), output(1), SUMMARIZE]
RESENT = [AGENT, call(1), output(1), SUMMARIZE]
"""A resend without the task: noted, unlike the requests below that differ from it."""


@pytest.mark.parametrize(
    ("sent", "tools"),
    [
        pytest.param(
            [AGENT, Message.text("user", "Fix the parser."), call(9), output(9), SUMMARIZE],
            SHELL,
            id="another conversation",  # its own task and calls, the same instruction
        ),
        pytest.param(RESENT, (), id="other tools"),
        pytest.param(
            [Message.text("system", "You are a reviewer."), *RESENT[1:]],
            SHELL,
            id="another system prompt",
        ),
    ],
)
def test_another_request_after_a_refusal_is_not_noted(
    sent: list[Message], tools: tuple[ToolSpec, ...]
) -> None:
    """Without the task, but no resend of the refused request."""
    assert note(REFUSED, RESENT) == among_them(1, 4)
    assert dropped_history(None, Prompt(RESENT, SHELL)) is None
    assert note(REFUSED, sent, tools) is None
