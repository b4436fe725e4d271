"""The SGLang engine double, spoken to with a plain HTTP client: its wire format is SGLang's."""

from __future__ import annotations

import asyncio
import base64
import json
from array import array
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from transformers import PreTrainedTokenizerFast

from protocol_adapters.testing import (
    EngineDouble,
    Faults,
    Qwen3ReplyEncoder,
    ScriptedReply,
    expert_id,
    qwen3_text,
)

FIXTURE = Path(__file__).parent.parent / "fixtures" / "small_tokenizer.json"

TOOL_REPLY = ScriptedReply(
    reasoning="The test fails; look at the parser.",
    text="Let me run it.",
    tool_calls=[("bash", {"cmd": "pytest -x", "timeout": 30}), ("read", {"path": "ü.py"})],
)


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_file=str(FIXTURE))  # type: ignore[no-untyped-call]


async def post(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as response:
        return response.status, await response.json(content_type=None)


async def post_stream(url: str, body: dict[str, Any]) -> list[str]:
    """The ``data:`` payloads of an SSE answer, in order."""
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        raw = (await response.read()).decode()
    assert raw.endswith("\n\n")
    events = raw[: -len("\n\n")].split("\n\n")
    assert all(e.startswith("data: ") for e in events)
    return [e[len("data: ") :] for e in events]


def generate_body(rid: str = "r1", max_new_tokens: int = 512, **extra: Any) -> dict[str, Any]:
    return {
        "rid": rid,
        "input_ids": [11, 12, 13],
        "sampling_params": {"max_new_tokens": max_new_tokens, "skip_special_tokens": False},
        "return_logprob": True,
        **extra,
    }


def test_qwen3_format_matches_the_template_layout() -> None:
    assert qwen3_text(TOOL_REPLY) == (
        "<think>\nThe test fails; look at the parser.\n</think>\n\nLet me run it."
        '\n<tool_call>\n{"name": "bash", "arguments": {"cmd": "pytest -x", "timeout": 30}}\n'
        "</tool_call>"
        '\n<tool_call>\n{"name": "read", "arguments": {"path": "ü.py"}}\n</tool_call><|im_end|>'
    )
    assert qwen3_text(ScriptedReply(tool_calls=[("f", {})])) == (
        '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call><|im_end|>'
    )
    assert qwen3_text(ScriptedReply(text="cut", finish="length")) == "cut"


def test_encoder_uses_single_marker_ids_and_real_text_ids(tokenizer: Any) -> None:
    encoder = Qwen3ReplyEncoder(tokenizer)
    ids = encoder.encode(TOOL_REPLY)
    assert tokenizer.decode(ids, skip_special_tokens=False) == qwen3_text(TOOL_REPLY)
    for marker in ("<think>", "</think>", "<tool_call>", "</tool_call>", "<|im_end|>"):
        assert tokenizer.convert_tokens_to_ids(marker) in ids
    assert ids[-1] == encoder.end_of_turn_id
    plain = ScriptedReply(text="Let me run it.", finish="length")
    assert encoder.encode(plain) == tokenizer.encode("Let me run it.", add_special_tokens=False)


def test_encoder_refuses_a_tokenizer_without_qwen3_markers(tokenizer: Any) -> None:
    class NoThink:
        def encode(self, text: str, /, *, add_special_tokens: bool) -> list[int]:
            return list(tokenizer.encode(text, add_special_tokens=add_special_tokens))

        def decode(self, token_ids: list[int], /, *, skip_special_tokens: bool) -> str:
            return str(tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens))

        def convert_tokens_to_ids(self, tokens: str, /) -> int | list[int] | None:
            return None if tokens == "<think>" else tokenizer.convert_tokens_to_ids(tokens)

    with pytest.raises(ValueError, match="<think>"):
        Qwen3ReplyEncoder(NoThink())


async def test_generate_answers_in_sglang_shape(tokenizer: Any) -> None:
    async with EngineDouble(tokenizer, [TOOL_REPLY], logprob=lambda i, t: -0.5 - i) as double:
        status, body = await post(f"{double.url}/generate", generate_body())
    ids = double.reply_ids(TOOL_REPLY)
    assert status == 200
    assert body["output_ids"] == ids
    assert body["text"] == qwen3_text(TOOL_REPLY)  # skip_special_tokens=False was asked for
    meta = body["meta_info"]
    assert meta["id"] == "r1"
    assert meta["prompt_tokens"] == 3
    assert meta["completion_tokens"] == len(ids)
    assert meta["finish_reason"] == {"type": "stop", "matched": ids[-1]}
    assert meta["output_token_logprobs"] == [[-0.5 - i, t, None] for i, t in enumerate(ids)]
    assert meta["weight_version"] == "default"
    received = double.requests[0]
    assert received.rid == "r1"
    assert received.input_ids == (11, 12, 13)
    assert received.sampling_params["max_new_tokens"] == 512
    assert received.headers["content-type"] == "application/json"


async def test_max_new_tokens_cuts_to_length(tokenizer: Any) -> None:
    async with EngineDouble(tokenizer, [TOOL_REPLY]) as double:
        _, body = await post(f"{double.url}/generate", generate_body(max_new_tokens=5))
    assert body["output_ids"] == double.reply_ids(TOOL_REPLY)[:5]
    assert body["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
    assert body["meta_info"]["completion_tokens"] == 5


async def test_without_return_logprob_there_are_no_logprobs(tokenizer: Any) -> None:
    async with EngineDouble(tokenizer, [ScriptedReply(text="hi")]) as double:
        _, body = await post(f"{double.url}/generate", generate_body(return_logprob=False))
    assert "output_token_logprobs" not in body["meta_info"]
    assert body["text"] == "hi<|im_end|>"


@pytest.mark.parametrize("incremental", [False, True])
async def test_stream_chunks_are_cumulative_or_incremental_like_sglang(
    tokenizer: Any, incremental: bool
) -> None:
    reply = ScriptedReply(text="one two three four five six seven")
    async with EngineDouble(
        tokenizer, [reply], incremental_streaming=incremental, tokens_per_chunk=2
    ) as double:
        events = await post_stream(f"{double.url}/generate", generate_body(stream=True))
    ids = double.reply_ids(reply)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert len(chunks) == (len(ids) + 1) // 2
    seen: list[int] = []
    for n, chunk in enumerate(chunks):
        meta = chunk["meta_info"]
        count = min(2 * (n + 1), len(ids))
        assert meta["completion_tokens"] == count
        got = [t for _, t, _ in meta["output_token_logprobs"]]
        assert chunk["output_ids"] == got
        seen = [*seen, *got] if incremental else got
        assert seen == ids[:count]
        assert (meta["finish_reason"] is None) == (n < len(chunks) - 1)
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "stop"


async def test_hang_until_aborted_finishes_as_abort(tokenizer: Any) -> None:
    async with EngineDouble(tokenizer, [ScriptedReply(text="x")], faults=Faults(hang=True)) as d:
        pending = asyncio.create_task(post(f"{d.url}/generate", generate_body(rid="slow")))
        await asyncio.sleep(0.05)
        assert not pending.done()
        status, _ = await post(f"{d.url}/abort_request", {"rid": "slow"})
        assert status == 200
        status, body = await pending
    assert status == 200
    assert d.aborts == ["slow"]
    assert body["meta_info"]["finish_reason"]["type"] == "abort"
    assert body["meta_info"]["completion_tokens"] == 0


async def test_latency_jitter_spreads_each_answer_around_the_latency(tokenizer: Any) -> None:
    faults = Faults(latency=0.2, latency_jitter=0.5)
    replies = [ScriptedReply(text="x")] * 12
    async with EngineDouble(tokenizer, replies, faults=faults) as double:
        answers = await asyncio.gather(
            *(post(f"{double.url}/generate", generate_body(rid=f"r{i}")) for i in range(12))
        )
    waited = sorted(body["meta_info"]["e2e_latency"] for _, body in answers)
    assert waited[0] >= 0.1  # never under latency * (1 - jitter)
    assert waited[-1] - waited[0] > 0.05  # twelve uniform draws over 0.2 s: not one value
    with pytest.raises(ValueError, match="latency_jitter"):
        Faults(latency=1.0, latency_jitter=1.5)


async def test_refusals_use_sglang_error_shapes(tokenizer: Any) -> None:
    async with EngineDouble(tokenizer, [], context_length=8) as double:
        status, body = await post(f"{double.url}/generate", generate_body(max_new_tokens=6))
        assert status == 400
        assert "maximum context length of 8 tokens" in body["error"]["message"]
        long_prompt = {**generate_body(), "input_ids": list(range(9))}
        status, body = await post(f"{double.url}/generate", long_prompt)
        assert status == 400
        assert "longer than the model's context length" in body["error"]["message"]
        events = await post_stream(f"{double.url}/generate", {**long_prompt, "stream": True})
        assert "longer than the model's context length" in json.loads(events[0])["error"]["message"]
        assert events[1] == "[DONE]"
        status, body = await post(f"{double.url}/generate", {"text": "hello"})
        assert status == 400
        assert "input_ids" in body["error"]["message"]


async def test_injected_http_error_and_exhausted_script(tokenizer: Any) -> None:
    async with EngineDouble(tokenizer, [ScriptedReply(text="x")]) as double:
        double.faults = Faults(http_status=500, error_message="CUDA error: out of memory")
        status, body = await post(f"{double.url}/generate", generate_body())
        assert (status, body) == (500, {"error": {"message": "CUDA error: out of memory"}})
        double.faults = Faults()
        assert (await post(f"{double.url}/generate", generate_body()))[0] == 200
        status, body = await post(f"{double.url}/generate", generate_body())
        assert status == 400
        assert "script exhausted" in body["error"]["message"]


async def test_callable_script_sees_the_prompt(tokenizer: Any) -> None:
    def echo(input_ids: Any) -> ScriptedReply:
        return ScriptedReply(text=f"prompt had {len(input_ids)} tokens")

    async with EngineDouble(tokenizer, echo) as double:
        _, body = await post(f"{double.url}/generate", generate_body())
    assert body["text"] == "prompt had 3 tokens<|im_end|>"


async def test_health_model_info_and_connection_records(tokenizer: Any) -> None:
    async with EngineDouble(tokenizer, [], weight_version="step-7") as double:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{double.url}/health") as response:
                assert response.status == 200
            async with session.get(f"{double.url}/get_model_info") as response:
                info = await response.json()
        assert info["is_generation"] is True
        assert info["weight_version"] == "step-7"
        assert double.connection_count == 1  # one keep-alive connection for both calls


async def test_server_info_names_the_context_length_as_sglang_does(tokenizer: Any) -> None:
    async with EngineDouble(tokenizer, [], context_length=4096) as double:
        async with aiohttp.ClientSession() as session:
            for path in ("/server_info", "/get_server_info"):
                async with session.get(f"{double.url}{path}") as response:
                    info = await response.json()
                assert info["context_length"] == 4096
                assert info["max_req_input_len"] == 4095
                assert info["max_total_num_tokens"] >= 4096
            double.report_context_length = False  # no --context-length on SGLang's command line
            async with session.get(f"{double.url}/server_info") as response:
                info = await response.json()
        assert info["context_length"] is None
        assert info["max_req_input_len"] == 4095


async def test_prompt_plus_max_new_tokens_must_stay_below_the_context(tokenizer: Any) -> None:
    """SGLang refuses ``prompt + max_new_tokens >= context`` (not only ``>``)."""
    async with EngineDouble(tokenizer, [ScriptedReply(text="x")], context_length=8) as double:
        status, body = await post(f"{double.url}/generate", generate_body(max_new_tokens=5))
        assert status == 400
        assert "maximum context length of 8 tokens" in body["error"]["message"]
        status, _ = await post(f"{double.url}/generate", generate_body(max_new_tokens=4))
        assert status == 200


@pytest.mark.parametrize(
    ("sampling", "named"),
    [
        ({"max_new_tokens": 4, "top_logprobs_num": 2}, "unexpected keyword"),
        ({"max_new_tokens": 4, "json_schema": {"type": "object"}}, "json_schema"),
        ({"max_new_tokens": 4, "json_schema": "{not json"}, "json_schema"),
        ({"max_new_tokens": 4, "json_schema": "{}", "regex": "a+"}, "only one of"),
    ],
)
async def test_sampling_params_sglang_would_refuse(
    tokenizer: Any, sampling: dict[str, Any], named: str
) -> None:
    async with EngineDouble(tokenizer, [ScriptedReply(text="x")]) as double:
        status, body = await post(
            f"{double.url}/generate", {**generate_body(), "sampling_params": sampling}
        )
    assert status == 400
    assert named in body["error"]["message"]


async def test_json_schema_is_accepted_and_recorded(tokenizer: Any) -> None:
    schema = json.dumps({"type": "object", "properties": {"title": {"type": "string"}}})
    async with EngineDouble(tokenizer, [ScriptedReply(text='{"title": "x"}')]) as double:
        sampling = {"max_new_tokens": 64, "json_schema": schema, "skip_special_tokens": False}
        status, body = await post(
            f"{double.url}/generate", {**generate_body(), "sampling_params": sampling}
        )
    assert status == 200
    assert body["text"] == '{"title": "x"}<|im_end|>'
    assert double.requests[0].sampling_params["json_schema"] == schema


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_top_logprobs_num_gives_alternatives_per_output_token(
    tokenizer: Any, stream: bool
) -> None:
    async with EngineDouble(tokenizer, [TOOL_REPLY], incremental_streaming=True) as double:
        body = generate_body(top_logprobs_num=3, stream=stream)
        if stream:
            events = await post_stream(f"{double.url}/generate", body)
            chunks = [json.loads(e) for e in events[:-1]]
        else:
            chunks = [(await post(f"{double.url}/generate", body))[1]]
    tokens = [entry for c in chunks for entry in c["meta_info"]["output_token_logprobs"]]
    tops = [entry for c in chunks for entry in c["meta_info"]["output_top_logprobs"]]
    assert len(tops) == len(tokens) == len(double.reply_ids(TOOL_REPLY))
    for (logprob, token_id, _), top in zip(tokens, tops, strict=True):
        assert len(top) == 3
        assert top[0][:2] == [logprob, token_id]
        assert [t[0] for t in top] == sorted((t[0] for t in top), reverse=True)


# -- MoE routing and weight updates ----------------------------------------------------------


def test_expert_ids_are_a_fixed_function_of_token_and_position() -> None:
    assert expert_id(5, 3, 1, 0, 64) == (5 * 7919 + 3 * 104729 + 613) % 64
    assert expert_id(5, 3, 1, 0, 64) != expert_id(5, 4, 1, 0, 64)
    assert expert_id(5, 3, 1, 0, 64) != expert_id(6, 3, 1, 0, 64)


@pytest.mark.parametrize("as_list", [False, True])
async def test_routing_covers_the_asked_positions_up_to_the_last_token(
    tokenizer: Any, as_list: bool
) -> None:
    reply = ScriptedReply(text="short")
    async with EngineDouble(
        tokenizer, [reply, reply], routed_layers=2, routed_topk=4, routing_as_list=as_list
    ) as double:
        body = generate_body(return_routed_experts=True, routed_experts_start_len=1)
        status, answer = await post(f"{double.url}/generate", body)
        assert status == 200
        meta = answer["meta_info"]
        ids = [11, 12, 13, *answer["output_ids"]]
        raw = meta["routed_experts"]
        experts = array("i", raw) if as_list else _int32s(raw)
        assert len(experts) == (len(ids) - 1 - 1) * 2 * 4
        assert experts == double.expected_routing(ids, 1)
        assert experts[:8].tolist() == double.routed_row(12, 1)
        assert meta["routed_experts_start_len"] == 1
        assert double.requests[0].routed_experts_start_len == 1

        events = await post_stream(
            f"{double.url}/generate", generate_body(stream=True, return_routed_experts=True)
        )
        carrying = ["routed_experts" in json.loads(e)["meta_info"] for e in events[:-1]]
        assert carrying == [False] * (len(carrying) - 1) + [True]


@pytest.mark.parametrize("start", [-1, 4])
async def test_a_routing_start_outside_the_prompt_is_refused(tokenizer: Any, start: int) -> None:
    async with EngineDouble(tokenizer, [ScriptedReply(text="x")]) as double:
        body = generate_body(return_routed_experts=True, routed_experts_start_len=start)
        status, answer = await post(f"{double.url}/generate", body)
        assert status == 400
        assert "routed_experts_start_len" in answer["error"]["message"]


async def test_without_the_server_flag_routing_is_left_out(tokenizer: Any) -> None:
    async with EngineDouble(tokenizer, [ScriptedReply(text="x")], capture_routing=False) as double:
        status, answer = await post(
            f"{double.url}/generate", generate_body(return_routed_experts=True)
        )
        assert status == 200
        assert "routed_experts" not in answer["meta_info"]


async def test_weight_updates_abort_running_generations_or_continue_them(tokenizer: Any) -> None:
    long = ScriptedReply(text="one two three four five six seven")
    async with EngineDouble(
        tokenizer, [long, long], faults=Faults(chunk_delay=0.05), incremental_streaming=True
    ) as double:
        streaming = asyncio.create_task(
            post_stream(f"{double.url}/generate", generate_body(rid="a", stream=True))
        )
        assert await double.wait_for_tokens(2) == "a"
        await double.update_weights("v2", "in_place")
        chunks = [json.loads(c)["meta_info"] for c in (await streaming)[:-1]]
        versions = [c["weight_version"] for c in chunks]
        assert versions[:2] == ["default", "default"]
        assert set(versions[2:]) == {"v2"}
        assert chunks[-1]["finish_reason"]["type"] == "stop"

        streaming = asyncio.create_task(
            post_stream(f"{double.url}/generate", generate_body(rid="b", stream=True))
        )
        assert await double.wait_for_tokens(2) == "b"
        await double.update_weights("v3", "abort")
        last = json.loads((await streaming)[-2])["meta_info"]
        assert last["finish_reason"]["type"] == "abort"
        assert last["weight_version"] == "v2"  # aborted before the new weights were loaded
        assert double.weight_version == "v3"
        assert double.weight_updates == [("v2", "in_place"), ("v3", "abort")]
        assert double.aborts == []  # no client asked for these


def _int32s(text: str) -> array[int]:
    packed: array[int] = array("i")
    packed.frombytes(base64.b64decode(text))
    return packed
