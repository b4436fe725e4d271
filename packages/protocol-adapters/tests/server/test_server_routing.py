"""MoE routing capture and weight versions through the real server, the official SDKs as clients.

The engine double routes every position by a pure function of its token and position
(:func:`protocol_adapters.testing.expert_id`), so each expected row is computed here from the
recorded ids, never read back from what the adapter stored. A branch asks the engine only for
positions no earlier call on it returned; every sample's routing is then whole: one row per token
but the last, each the double's.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import pytest
from server_checks import assert_engine_tokens_trained
from server_clients import (
    DIALECTS,
    PATHS,
    Dialect,
    anthropic_client,
    assert_error_shape,
    assert_sdk_error,
    checked,
    minimal_body,
    openai_client,
    sdk_error_types,
)

from protocol_adapters import AdapterConfig, RoutingCapture
from protocol_adapters._server.admin import TREE_JSON_BYTES
from protocol_adapters._server.config import AdminConfig
from protocol_adapters._tokenizer import Vocabulary
from protocol_adapters.testing import Faults, Malformation, ScriptedReply
from protocol_adapters.testing.engine_double import EngineDouble, ReceivedRequest
from protocol_adapters.testing.stack import LocalStack, local_stack
from trajectory_tree import FinishReason, LossReason, SessionTree, Turn, linearize, loads

CAPTURE = AdapterConfig(routing=RoutingCapture(layers=3, topk=2))  # the double's default shape
BASH: dict[str, Any] = {
    "name": "Bash",
    "description": "Run a shell command",
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
}
SUB_AGENT = {"x-claude-code-agent-id": "a0123456789abcdef"}


class Script:
    """A tool call first, then a final answer once a tool result is in the prompt."""

    def __init__(self, vocabulary: Vocabulary) -> None:
        self.vocabulary = vocabulary

    def __call__(self, input_ids: Sequence[int]) -> ScriptedReply:
        text = self.vocabulary.decode(list(input_ids))
        if "<tool_response>" not in text:
            return ScriptedReply(text="Looking.", tool_calls=[("Bash", {"command": "ls"})])
        return ScriptedReply(text="All done here.")


def received(double: EngineDouble, turn: Turn) -> ReceivedRequest:
    return next(r for r in double.requests if r.rid == turn.meta.request_id)


def assert_turn_routing(double: EngineDouble, tree: SessionTree, turn: Turn, start: int) -> None:
    """The turn asked from ``start`` and holds exactly the double's rows from there."""
    assert received(double, turn).routed_experts_start_len == start
    routed = turn.routed_experts
    assert routed is not None
    assert (routed.start, routed.layers, routed.topk) == (start, 3, 2)
    sequence = [*tree.prompt_ids(turn), *tree.output_ids(turn)]
    assert routed.experts == double.expected_routing(sequence, start)
    assert routed.end == len(sequence) - 1


def assert_samples_routed(double: EngineDouble, tree: SessionTree) -> None:
    """Every sample has one row per token but the last, no gaps, each the double's."""
    lin = linearize(tree)
    assert lin.samples
    for sample in lin.samples:
        routing = sample.routing
        assert routing is not None
        assert routing.gaps == ()
        assert routing.rows == len(sample.tokens) - 1
        assert routing.experts == double.expected_routing(sample.tokens, 0)


async def ask(
    api: anthropic.AsyncAnthropic,
    messages: list[Any],
    *,
    stream: bool,
    system: str = "You are the main agent.",
    headers: dict[str, str] | None = None,
) -> anthropic.types.Message:
    options: dict[str, Any] = {
        "model": "policy",
        "max_tokens": 128,
        "system": system,
        "messages": messages,
        "tools": [BASH],
        "extra_headers": headers or {},
    }
    if not stream:
        reply: anthropic.types.Message = await api.messages.create(**options)
        return reply
    async with api.messages.stream(**options) as events:
        return await events.get_final_message()


def echoed(reply: anthropic.types.Message) -> dict[str, Any]:
    return {"role": "assistant", "content": [b.model_dump() for b in reply.content]}


def result_of(reply: anthropic.types.Message, content: str) -> dict[str, Any]:
    use = next(b for b in reply.content if b.type == "tool_use")
    return {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": use.id, "content": content}],
    }


@pytest.mark.parametrize("stream", [False, True])
async def test_every_branch_asks_only_for_new_rows_and_every_sample_is_whole(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary, stream: bool
) -> None:
    async with local_stack(
        Script(qwen_vocabulary),
        tokenizer_cache=tokenizer_cache,
        vocabulary=qwen_vocabulary,
        config=CAPTURE,
    ) as stack:
        double = stack.double
        session = stack.server.sessions.open("routing")
        async with anthropic_client(stack, session.token) as api:
            # The main agent: a tool call, its result, an answer.
            main: list[Any] = [{"role": "user", "content": "Fix the bug."}]
            first = await ask(api, main, stream=stream)
            main += [echoed(first), result_of(first, "a.py")]
            final = await ask(api, main, stream=stream)
            # A sub-agent: its own system prompt, its own branch.
            sub: list[Any] = [{"role": "user", "content": "Run the tests."}]
            sub_first = await ask(
                api, sub, stream=stream, system="You are a sub-agent.", headers=SUB_AGENT
            )
            sub += [echoed(sub_first), result_of(sub_first, "3 passed")]
            await ask(api, sub, stream=stream, system="You are a sub-agent.", headers=SUB_AGENT)
            # An edited history: the first tool call gets another result, a branch mid-path.
            edited = [*main[:2], result_of(first, "b.py")]
            await ask(api, edited, stream=stream)
            # A request ending on the model's own reply: rendered in full, a lineage of its own.
            await ask(api, [*main, echoed(final)], stream=stream)

        tree = session.tree
        t1, t2, s1, s2, edit, full = tree.turns
        assert full.rerendered is not None  # attached at the root: nothing was returned there
        after = {t.id: t.prompt_length + t.output_length - 1 for t in tree.turns}
        assert_turn_routing(double, tree, t1, 0)
        assert_turn_routing(double, tree, t2, after[t1.id])  # the second turn: new rows only
        assert_turn_routing(double, tree, s1, 0)
        assert_turn_routing(double, tree, s2, after[s1.id])
        assert_turn_routing(double, tree, edit, after[t1.id])
        assert_turn_routing(double, tree, full, 0)
        assert after[t1.id] < t2.prompt_length  # the tool result was asked for, not skipped
        assert_samples_routed(double, tree)
        assert_engine_tokens_trained(stack, tree, linearize(tree))
        for turn in tree.turns:
            assert turn.version_runs == ((0, "default"),)


async def test_routing_decoded_from_a_json_list_too(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    async with local_stack(
        Script(qwen_vocabulary),
        tokenizer_cache=tokenizer_cache,
        vocabulary=qwen_vocabulary,
        config=CAPTURE,
    ) as stack:
        stack.double.routing_as_list = True
        session = stack.server.sessions.open("list")
        async with anthropic_client(stack, session.token) as api:
            await ask(api, [{"role": "user", "content": "Hi."}], stream=True)
        (turn,) = session.tree.turns
        assert_turn_routing(stack.double, session.tree, turn, 0)


async def test_without_capture_nothing_is_asked_and_nothing_recorded(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    async with local_stack(
        Script(qwen_vocabulary), tokenizer_cache=tokenizer_cache, vocabulary=qwen_vocabulary
    ) as stack:
        session = stack.server.sessions.open("dense")
        async with anthropic_client(stack, session.token) as api:
            await ask(api, [{"role": "user", "content": "Hi."}], stream=False)
        assert stack.double.requests[0].routed_experts_start_len is None
        assert "return_routed_experts" not in stack.double.requests[0].body
        assert session.tree.turns[0].routed_experts is None
        assert linearize(session.tree).samples[0].routing is None


ROUTING_FAULTS = {
    Malformation.ROUTING_COUNT: "expert ids, not",
    Malformation.ROUTING_NEGATIVE: "negative expert id",
    Malformation.ROUTING_BAD_BASE64: "is not base64",
    Malformation.ROUTING_UNASKED: "present but was not asked for",
}


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("how", sorted(ROUTING_FAULTS))
async def test_malformed_routing_is_an_error_in_the_dialects_shape_and_records_nothing(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary, dialect: Dialect, how: Malformation
) -> None:
    config = None if how is Malformation.ROUTING_UNASKED else CAPTURE
    async with checked(tokenizer_cache, qwen_vocabulary, dialect, config) as check:
        check.stack.double.faults = Faults(malformed=how)
        with pytest.raises(sdk_error_types(dialect)) as err:
            await check.client.post(minimal_body(dialect, "routed"))
        message = assert_sdk_error(dialect, err.value, "api")
        assert "malformed engine response" in message
        assert "meta_info.routed_experts" in message
        assert ROUTING_FAULTS[how] in message
        check.stack.double.faults = Faults()
        await check.after_refusal(engine_calls=1)  # no turn: the call recorded nothing
        if config is not None:
            tree = check.session.tree
            assert_turn_routing(check.stack.double, tree, tree.turns[-1], 0)


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_malformed_routing_at_the_end_of_a_stream_keeps_no_routing(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary, dialect: Dialect
) -> None:
    """The routing comes with the last chunk, after tokens were streamed: the client gets the
    dialect's in-stream error and the partial turn is kept, aborted, without routing."""
    async with checked(tokenizer_cache, qwen_vocabulary, dialect, CAPTURE) as check:
        check.stack.double.faults = Faults(malformed=Malformation.ROUTING_NEGATIVE)
        body = minimal_body(dialect, "streamed") | {"stream": True}
        text = await stream_text(check.stack, dialect, check.token, body)
        assert "negative expert id" in text
        error = next(
            p for p in sse_json(text) if "error" in p or p.get("type") == "response.failed"
        )
        if dialect == "openai_responses":
            assert error["response"]["error"]["code"] == "server_error"
        else:
            assert_error_shape(dialect, error, "api")
        last = check.session.tree.turns[-1]
        assert last.finish_reason is FinishReason.ABORT
        assert last.routed_experts is None


async def test_an_in_place_weight_update_mid_stream_splits_the_turn_into_two_runs(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    long = ScriptedReply(text="one two three four five six seven eight nine ten")
    async with local_stack(
        [long],
        tokenizer_cache=tokenizer_cache,
        vocabulary=qwen_vocabulary,
        config=CAPTURE,
        faults=Faults(chunk_delay=0.1),
    ) as stack:
        double = stack.double
        session = stack.server.sessions.open("in-place")
        async with anthropic_client(stack, session.token) as api:
            streaming = asyncio.create_task(
                ask(api, [{"role": "user", "content": "Count."}], stream=True)
            )
            await double.wait_for_tokens(4)
            await double.update_weights("v2", "in_place")
            reply = await streaming
        assert reply.content[0].text == long.text  # type: ignore[union-attr]
        (turn,) = session.tree.turns
        assert turn.version_runs == ((0, "default"), (4, "v2"))
        assert turn.weight_version == "v2"
        assert turn.output_length > 4
        assert_turn_routing(double, session.tree, turn, 0)
        assert_samples_routed(double, session.tree)


async def test_an_abort_mode_update_is_a_retryable_error_and_the_retry_runs_on_new_weights(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    """Mid-episode: the second turn's stream is aborted by the update. Its partial output is
    kept (aborted, routing included, old version); the client's retry is generated whole under
    the new weights and asks routing from where the branch's first turn left off."""
    script = [
        ScriptedReply(text="Looking.", tool_calls=[("Bash", {"command": "ls"})]),
        ScriptedReply(text="I will now edit the file and then run every test again."),
        ScriptedReply(text="Fixed."),
    ]
    async with local_stack(
        script,
        tokenizer_cache=tokenizer_cache,
        vocabulary=qwen_vocabulary,
        config=CAPTURE,
    ) as stack:
        double = stack.double
        session = stack.server.sessions.open("abort-update")
        async with anthropic_client(stack, session.token) as api:
            messages: list[Any] = [{"role": "user", "content": "Fix it."}]
            first = await ask(api, messages, stream=False)
            messages += [echoed(first), result_of(first, "a.py")]
            double.faults = Faults(chunk_delay=0.1)
            body = {
                "model": "policy",
                "max_tokens": 128,
                "system": "You are the main agent.",
                "messages": messages,
                "tools": [BASH],
                "stream": True,
            }
            streaming = asyncio.create_task(stream_text(stack, "anthropic", session.token, body))
            await double.wait_for_tokens(3)
            await double.update_weights("v2", "abort")
            text = await streaming
            error = next(p for p in sse_json(text) if p.get("type") == "error")
            assert_error_shape("anthropic", error, "overloaded")
            assert "retry" in error["error"]["message"]
            double.faults = Faults()
            retried = await ask(api, messages, stream=False)
        assert retried.content[0].text == "Fixed."  # type: ignore[union-attr]
        tree = session.tree
        t1, aborted, retry = tree.turns
        assert aborted.finish_reason is FinishReason.ABORT
        assert aborted.output_length == 3
        assert aborted.weight_version == "default"
        assert retry.weight_version == "v2"
        assert retry.version_runs == ((0, "v2"),)
        start = t1.prompt_length + t1.output_length - 1
        assert_turn_routing(double, tree, aborted, start)
        assert_turn_routing(double, tree, retry, start)
        assert_samples_routed(double, tree)
        lin = linearize(tree)
        assert [e.reason for e in lin.exclusions] == [LossReason.ABORTED]


async def test_an_abort_mode_update_of_a_whole_answer_is_retried_by_the_sdks(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    """A non-streamed call aborted before its first token: the SDK retries the 529/503 by
    itself and the answer is generated under the new weights."""
    for dialect in DIALECTS:
        async with local_stack(
            [ScriptedReply(text="late"), ScriptedReply(text="fresh")],
            tokenizer_cache=tokenizer_cache,
            vocabulary=qwen_vocabulary,
            config=CAPTURE,
            faults=Faults(latency=30.0),
        ) as stack:
            double = stack.double
            session = stack.server.sessions.open(f"sdk-{dialect}")
            calling = asyncio.create_task(sdk_call(stack, dialect, session.token))
            while not double.requests:
                await asyncio.sleep(0.01)
            double.faults = Faults()
            await double.update_weights("v2", "abort")
            assert await calling == "fresh"
            (turn,) = session.tree.turns  # the aborted call produced nothing to keep
            assert turn.weight_version == "v2"
            assert len(double.requests) == 2
            assert_turn_routing(double, session.tree, turn, 0)


async def sdk_call(stack: LocalStack, dialect: Dialect, token: str) -> str:
    body = minimal_body(dialect, "go")
    if dialect == "anthropic":
        async with anthropic_client(stack, token, max_retries=2) as api:
            reply = await api.messages.create(**body)
            return str(reply.content[0].text)
    oai = openai_client(stack, token, max_retries=2)
    try:
        if dialect == "openai_chat":
            completion = await oai.chat.completions.create(**body)
            return str(completion.choices[0].message.content)
        response = await oai.responses.create(**body)
        return str(response.output_text)
    finally:
        await oai.close()


async def stream_text(stack: LocalStack, dialect: Dialect, token: str, body: Any) -> str:
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            stack.server.url + PATHS[dialect],
            json=body,
            headers={"Authorization": f"Bearer {token}"},
        ) as response,
    ):
        assert response.status == 200, await response.text()
        return await response.text()


def sse_json(text: str) -> list[dict[str, Any]]:
    lines = [line.removeprefix("data: ") for line in text.splitlines() if line.startswith("data: ")]
    return [json.loads(line) for line in lines if line != "[DONE]"]


@pytest.mark.parametrize("stream", [False, True])
async def test_an_engine_aborted_partial_turn_keeps_its_routing(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary, stream: bool
) -> None:
    cut = ScriptedReply(text="I will now edit the file and then", finish="abort")
    async with local_stack(
        [cut, ScriptedReply(text="Done.")],
        tokenizer_cache=tokenizer_cache,
        vocabulary=qwen_vocabulary,
        config=CAPTURE,
    ) as stack:
        session = stack.server.sessions.open("aborted")
        async with anthropic_client(stack, session.token) as api:
            with pytest.raises(anthropic.APIStatusError):
                await ask(api, [{"role": "user", "content": "Edit."}], stream=stream)
            await ask(api, [{"role": "user", "content": "Edit."}], stream=stream)
        aborted, retry = session.tree.turns
        assert aborted.finish_reason is FinishReason.ABORT
        assert aborted.output_length > 0
        assert_turn_routing(stack.double, session.tree, aborted, 0)
        assert_turn_routing(stack.double, session.tree, retry, 0)


async def test_the_admin_api_hands_out_routing_with_the_tree(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    """A rollout worker in another process gets the tree and its sidecar from one snapshot."""
    admin = AdminConfig(token="admin-routing")
    bearer = {"Authorization": f"Bearer {admin.token}"}
    config = AdapterConfig(routing=CAPTURE.routing, admin=admin)
    async with (
        local_stack(
            Script(qwen_vocabulary),
            tokenizer_cache=tokenizer_cache,
            vocabulary=qwen_vocabulary,
            config=config,
        ) as stack,
        aiohttp.ClientSession() as http,
    ):
        url = f"{stack.server.admin_url}/admin/sessions"
        async with http.post(url, json={}, headers=bearer) as opened:
            token = (await opened.json())["token"]
        async with anthropic_client(stack, token) as api:
            first = await ask(api, [{"role": "user", "content": "Hi."}], stream=False)
            await ask(
                api,
                [{"role": "user", "content": "Hi."}, echoed(first), result_of(first, "a.py")],
                stream=True,
            )
        async with http.get(f"{url}/{token}/tree?routing=2", headers=bearer) as bad:
            assert bad.status == 400
        async with http.get(f"{url}/{token}/tree", headers=bearer) as plain:
            assert plain.content_type == "application/json"
            without = loads(await plain.text())
        async with http.delete(f"{url}/{token}?routing=1", headers=bearer) as closed:
            assert closed.status == 200
            assert closed.content_type == "application/octet-stream"
            body = await closed.read()
            split = int(closed.headers[TREE_JSON_BYTES])
    tree = loads(body[:split].decode(), routing=body[split:])
    assert len(tree.turns) == 2
    assert all(turn.routed_experts is not None for turn in tree.turns)
    assert_samples_routed(stack.double, tree)
    # The JSON alone names the routing but cannot carry it: nothing is made up without it.
    assert all(turn.routed_experts is None for turn in without.turns)
