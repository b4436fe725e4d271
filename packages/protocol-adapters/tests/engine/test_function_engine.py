"""``testing.FunctionEngine``: the in-process engine for tests of the adapter's own logic.

Alone, it ends and streams generations as SGLang does; behind the real server with the official
``anthropic`` SDK, the tree records exactly what its function generated; and one scripted session
records the same tree through it as through the engine double behind the real SGLang client,
which is what makes it a faithful stand-in wherever a test does not test the wire.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anthropic
import pytest

from protocol_adapters import (
    AdapterConfig,
    AdapterError,
    AdapterServer,
    Engine,
    ErrorKind,
    GenerateChunk,
    GenerateRequest,
    Renderer,
    RendererConfig,
    RoutingCapture,
    SamplingParams,
    Vocabulary,
    qwen3_template,
    reply_parsers,
)
from protocol_adapters.testing import FunctionEngine, ScriptedReply, qwen3_text
from protocol_adapters.testing.stack import local_stack
from trajectory_tree import FinishReason, SessionTree, Turn, linearize, message_to_dict

STOP = 7
"""A stop token id for the unit tests (no vocabulary there: ids are just numbers)."""


def request(
    max_new_tokens: int = 64,
    *,
    stop_token_ids: tuple[int, ...] = (STOP,),
    stop: tuple[str, ...] = (),
    prompt: tuple[int, ...] = (1, 2, 3),
    top_logprobs: int = 0,
) -> GenerateRequest:
    sampling = SamplingParams(max_new_tokens, stop_token_ids=stop_token_ids, stop=stop)
    return GenerateRequest(prompt, sampling, top_logprobs=top_logprobs)


async def chunks_of(engine: FunctionEngine, req: GenerateRequest) -> list[GenerateChunk]:
    return [chunk async for chunk in engine.stream(req)]


# -- (a) the engine alone -----------------------------------------------------------------------


async def test_it_is_an_engine_and_records_every_request_it_got() -> None:
    engine = FunctionEngine(lambda r: [r.input_ids[-1] + 1, STOP])
    assert isinstance(engine, Engine)
    first, second = request(prompt=(5, 6)), request(prompt=(5, 6, 40))
    assert (await engine.generate(first)).output_ids == (7,)  # 6 + 1 is the stop token itself
    await chunks_of(engine, second)
    assert engine.requests == [first, second]
    assert [r.input_ids for r in engine.requests] == [(5, 6), (5, 6, 40)]
    assert await engine.context_length() == 32768
    assert engine.aborts == []


async def test_a_stop_token_ends_with_stop_and_stays_in_the_output() -> None:
    engine = FunctionEngine(lambda r: [10, 11, STOP, 12, 13])
    result = await engine.generate(request())
    assert result.output_ids == (10, 11, STOP)
    assert result.finish_reason is FinishReason.STOP
    assert result.matched_stop == STOP
    assert result.output_logprobs == (-0.125,) * 3
    assert (result.prompt_tokens, result.completion_tokens) == (3, 3)
    assert result.weight_version == "default"
    assert result.to_completion().version_runs == ((0, "default"),)
    # Only the request's stop ids stop it: 7 is an ordinary token without them.
    result = await engine.generate(request(stop_token_ids=(13,)))
    assert (result.output_ids, result.matched_stop) == ((10, 11, STOP, 12, 13), 13)


async def test_max_new_tokens_ends_with_length_before_any_stop_token() -> None:
    engine = FunctionEngine(lambda r: [10, 11, 12, STOP, 14])
    result = await engine.generate(request(3))
    assert (result.output_ids, result.finish_reason) == ((10, 11, 12), FinishReason.LENGTH)
    assert result.matched_stop is None
    # A stop token at exactly max_new_tokens ends in length: SGLang checks the length first.
    result = await engine.generate(request(4))
    assert (result.output_ids, result.finish_reason) == ((10, 11, 12, STOP), FinishReason.LENGTH)
    # Output that runs out before a stop is a generation cut short.
    result = await FunctionEngine(lambda r: [10, 11]).generate(request())
    assert (result.output_ids, result.finish_reason) == ((10, 11), FinishReason.LENGTH)


@pytest.mark.parametrize("per_chunk", [1, 2, 5])
async def test_streamed_chunks_concatenate_to_the_whole_result(per_chunk: int) -> None:
    engine = FunctionEngine(
        lambda r: [10, 11, 12, 13, 14, STOP, 99],
        logprob=lambda position, token: -position - token / 100,
        tokens_per_chunk=per_chunk,
    )
    result = await engine.generate(request(top_logprobs=3))
    chunks = await chunks_of(engine, request(top_logprobs=3))
    assert len(chunks) == -(-6 // per_chunk)
    assert sum((c.output_ids for c in chunks), ()) == result.output_ids == (10, 11, 12, 13, 14, 7)
    assert sum((c.output_logprobs for c in chunks), ()) == result.output_logprobs
    assert result.output_logprobs[:2] == (-0.10, -1.11)
    assert sum((c.top_logprobs for c in chunks), ()) == result.top_logprobs
    assert result.top_logprobs[0] == ((10, -0.10), (11, -1.10), (12, -2.10))
    assert [c.finish_reason for c in chunks] == [None] * (len(chunks) - 1) + [FinishReason.STOP]
    assert chunks[-1].matched_stop == STOP
    assert [c.completion_tokens for c in chunks] == [
        min(6, per_chunk * (i + 1)) for i in range(len(chunks))
    ]
    assert {c.prompt_tokens for c in chunks} == {3}
    assert {c.weight_version for c in chunks} == {"default"}


async def test_each_chunk_names_the_weight_version_it_was_generated_under() -> None:
    engine = FunctionEngine(lambda r: [10, 11, 12, STOP])
    versions = []
    async for chunk in engine.stream(request()):
        versions.append(chunk.weight_version)
        engine.weight_version = "step-2"  # an in-place weight update after the first chunk
    assert versions == ["default", "step-2", "step-2", "step-2"]
    assert (await engine.generate(request())).weight_version == "step-2"


async def test_text_is_encoded_with_the_vocabulary_and_stop_strings_are_matched(
    qwen_vocabulary: Vocabulary,
) -> None:
    end_of_turn = qwen_vocabulary.token_id("<|im_end|>")
    stop_ids = tuple(sorted(qwen_vocabulary.stop_ids))
    engine = FunctionEngine(lambda r: "Hello there!<|im_end|>", vocabulary=qwen_vocabulary)
    result = await engine.generate(request(stop_token_ids=stop_ids))
    assert result.output_ids == tuple(qwen_vocabulary.encode("Hello there!<|im_end|>"))
    assert (result.finish_reason, result.matched_stop) == (FinishReason.STOP, end_of_turn)
    result = await engine.generate(request(stop_token_ids=stop_ids, stop=("there",)))
    assert qwen_vocabulary.decode(result.output_ids) == "Hello there"
    assert (result.finish_reason, result.matched_stop) == (FinishReason.STOP, "there")
    with pytest.raises(TypeError, match="give a vocabulary"):
        await FunctionEngine(lambda r: "Hello").generate(request())


async def test_abort_ends_a_running_stream_and_an_awaited_reply() -> None:
    engine = FunctionEngine(lambda r: [10, 11, 12, 13, STOP])
    req = request()
    stream = engine.stream(req)
    first = await anext(stream)
    await engine.abort(req.rid)
    rest = [chunk async for chunk in stream]
    assert first.output_ids == (10,)
    assert [(c.output_ids, c.finish_reason, c.abort_message) for c in rest] == [
        ((), FinishReason.ABORT, "Aborted by AbortReq.")
    ]
    assert engine.aborts == [req.rid]

    async def hang(r: GenerateRequest) -> list[int]:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    hanging = FunctionEngine(hang)
    req = request()
    call = asyncio.create_task(hanging.generate(req))
    await asyncio.sleep(0.01)
    await hanging.abort(req.rid)
    result = await call
    assert (result.output_ids, result.finish_reason) == ((), FinishReason.ABORT)
    await hanging.abort(req.rid)  # no longer running: no error


async def test_a_caller_that_leaves_early_is_recorded_as_an_abort() -> None:
    engine = FunctionEngine(lambda r: [10, 11, 12, STOP])
    req = request()
    stream = engine.stream(req)
    await anext(stream)
    await stream.aclose()  # what the server does when its client goes away
    done = request()
    await chunks_of(engine, done)  # read to the finish: nothing to abort
    assert engine.aborts == [req.rid]


async def test_engine_errors_are_the_sglang_clients() -> None:
    engine = FunctionEngine(lambda r: [10, STOP], context_length=64)
    with pytest.raises(AdapterError) as refused:
        await engine.generate(request(prompt=tuple(range(64))))
    assert refused.value.kind is ErrorKind.CONTEXT_LENGTH
    assert "The input (64 tokens) is longer than the model's context length (64 tokens)" in (
        refused.value.message
    )
    with pytest.raises(AdapterError) as refused:
        await chunks_of(engine, request(61))  # 3 + 61 >= 64, refused inside the stream
    assert refused.value.kind is ErrorKind.CONTEXT_LENGTH
    assert len(engine.requests) == 2  # recorded, as the double records what it refuses

    def down(r: GenerateRequest) -> list[int]:
        raise AdapterError(ErrorKind.OVERLOADED, "engine unreachable")

    with pytest.raises(AdapterError, match="unreachable"):
        await FunctionEngine(down).generate(request())


# -- (b) the real server over it, the official SDK as client ------------------------------------

TOOLS: list[Any] = [
    {
        "name": "Bash",
        "description": "Run a shell command",
        "input_schema": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    }
]
CALL = ScriptedReply(
    reasoning="I should look at the files.",
    text="Let me list them.",
    tool_calls=[("Bash", {"command": "ls -la"})],
)
ANSWER = ScriptedReply(text="There are two files. Done.")


def logprob(position: int, token: int) -> float:
    """Distinct for every position and token, so a logprob recorded at the wrong place shows."""
    return -(position + 1) / 8 - token / 1_000_000


@functools.cache
def _tls() -> ssl.SSLContext:
    return ssl.create_default_context()  # one for all clients: loading the CA bundle is slow


def client(server: AdapterServer, token: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(
        base_url=server.url,
        api_key=token,
        max_retries=0,
        http_client=anthropic.DefaultAsyncHttpxClient(verify=_tls()),
    )


@asynccontextmanager
async def served(
    engine: FunctionEngine, vocabulary: Vocabulary, config: AdapterConfig | None = None
) -> AsyncIterator[AdapterServer]:
    """The real server over ``engine``: the stack of ``testing/stack.py`` without the wire."""
    renderer = Renderer(vocabulary, qwen3_template(), RendererConfig())
    server = AdapterServer(config or AdapterConfig(), engine, renderer, vocabulary, reply_parsers())
    async with server:
        yield server


async def test_the_server_records_exactly_what_the_function_generated(
    qwen_vocabulary: Vocabulary,
) -> None:
    def agent(r: GenerateRequest) -> str:
        """Lists the files, and answers once their listing is in the prompt."""
        listed = "<tool_response>" in qwen_vocabulary.decode(r.input_ids)
        return qwen3_text(ANSWER if listed else CALL)

    engine = FunctionEngine(agent, vocabulary=qwen_vocabulary, logprob=logprob)
    async with served(engine, qwen_vocabulary) as server:
        session = server.sessions.open("function-engine")
        api = client(server, session.token)
        messages: list[Any] = [{"role": "user", "content": "What is here?"}]
        called = await api.messages.create(
            model="policy", max_tokens=1024, messages=messages, tools=TOOLS
        )
        assert called.stop_reason == "tool_use"
        (use,) = [b for b in called.content if b.type == "tool_use"]
        assert (use.name, use.input) == ("Bash", {"command": "ls -la"})
        messages += [
            {"role": "assistant", "content": [b.model_dump() for b in called.content]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "a b"}],
            },
        ]
        async with api.messages.stream(
            model="policy", max_tokens=1024, messages=messages, tools=TOOLS
        ) as streamed:
            answered = await streamed.get_final_message()
        assert answered.stop_reason == "end_turn"
        assert [b.text for b in answered.content if b.type == "text"] == [ANSWER.text]
        await api.close()
        tree = (await server.close_session(session.token)).tree

    assert len(tree.turns) == len(engine.requests) == 2
    for turn, sent, reply in zip(tree.turns, engine.requests, (CALL, ANSWER), strict=True):
        generated = qwen_vocabulary.encode(qwen3_text(reply))
        assert list(tree.prompt_ids(turn)) == list(sent.input_ids)
        assert list(tree.output_ids(turn)) == generated
        assert list(turn.output_logprobs) == [logprob(p, t) for p, t in enumerate(generated)]
        assert turn.finish_reason is FinishReason.STOP
        assert turn.meta.request_id == sent.rid
    lin = linearize(tree)
    assert len(lin.samples) == 1, "the tool round trip continues one branch"
    (sample,) = lin.samples
    trained = [s for s in sample.spans if s.trained]
    assert [list(sample.tokens[s.start : s.end]) for s in trained] == [
        list(tree.output_ids(t)) for t in tree.turns
    ]


# -- (c) the same session through it and through the wire double --------------------------------

SCRIPT = [
    CALL,
    ScriptedReply(text="The listing shows two files, a and b, and nothing else at all here."),
    ScriptedReply(text="Nothing else: a and b."),
]
MAX_TOKENS = (1024, 6, 1024)
"""The second reply is cut at 6 tokens: a ``length`` finish."""
CAPTURE = AdapterConfig(routing=RoutingCapture(layers=3, topk=2))
"""MoE routing on, in the double's default shape: the trees must hold the same expert ids."""


async def session_on(server: AdapterServer) -> SessionTree:
    """Three turns: a tool call (whole), a reply cut by max_tokens (streamed) and one more
    (streamed) after a user message."""
    session = server.sessions.open("parity")
    api = client(server, session.token)
    messages: list[Any] = [{"role": "user", "content": "What is here?"}]
    for turn, max_tokens in enumerate(MAX_TOKENS):
        ask: dict[str, Any] = {
            "model": "policy",
            "max_tokens": max_tokens,
            "messages": messages,
            "tools": TOOLS,
        }
        if turn == 0:
            reply = await api.messages.create(**ask)
        else:
            async with api.messages.stream(**ask) as streamed:
                reply = await streamed.get_final_message()
        messages.append({"role": "assistant", "content": [b.model_dump() for b in reply.content]})
        uses = [b for b in reply.content if b.type == "tool_use"]
        follow: list[Any] = [
            {"type": "tool_result", "tool_use_id": u.id, "content": "a b"} for u in uses
        ]
        messages.append({"role": "user", "content": follow or "Anything else?"})
    await api.close()
    return (await server.close_session(session.token)).tree


def without_ids(value: Any) -> Any:
    """A recorded reply without its tool-call ids (the server draws them at random)."""
    if isinstance(value, dict):
        return {k: without_ids(v) for k, v in value.items() if k != "id"}
    if isinstance(value, list):
        return [without_ids(v) for v in value]
    return value


def recorded(tree: SessionTree) -> Iterator[tuple[object, ...]]:
    def routing(turn: Turn) -> object:
        r = turn.routed_experts
        return None if r is None else (r.start, r.layers, r.topk, list(r.experts))

    for turn in tree.turns:
        yield (
            list(tree.prompt_ids(turn)),
            list(tree.output_ids(turn)),
            list(turn.output_logprobs),
            turn.finish_reason,
            turn.weight_version,
            turn.version_runs,
            routing(turn),
            without_ids(message_to_dict(turn.reply)),
        )


async def test_a_session_records_the_same_tree_as_through_the_wire_double(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    async with local_stack(
        SCRIPT,
        tokenizer_cache=tokenizer_cache,
        vocabulary=qwen_vocabulary,
        config=CAPTURE,
        logprob=logprob,
    ) as stack:
        over_the_wire = await session_on(stack.server)
    replies = iter(SCRIPT)
    engine = FunctionEngine(
        lambda r: qwen3_text(next(replies)), vocabulary=qwen_vocabulary, logprob=logprob
    )
    async with served(engine, qwen_vocabulary, CAPTURE) as server:
        in_process = await session_on(server)

    turns = in_process.turns
    assert [t.finish_reason for t in turns] == [
        FinishReason.STOP,
        FinishReason.LENGTH,
        FinishReason.STOP,
    ]
    assert turns[1].output_length == MAX_TOKENS[1]
    assert all(t.routed_experts is not None for t in turns), "routing recorded on every turn"
    assert list(recorded(in_process)) == list(recorded(over_the_wire))
    sent = [list(r.input_ids) for r in engine.requests]
    assert sent == [list(r.input_ids) for r in stack.double.requests]
    lin_wire, lin_local = linearize(over_the_wire), linearize(in_process)
    assert [(list(s.tokens), list(s.logprobs), list(s.loss_mask)) for s in lin_local.samples] == [
        (list(s.tokens), list(s.logprobs), list(s.loss_mask)) for s in lin_wire.samples
    ]
