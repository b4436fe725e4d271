"""SGLang wire parsing without a server: validation, stream decoding, SSE framing, error mapping."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol_adapters._engine import GenerateRequest, SamplingParams, SGLangConfig
from protocol_adapters._engine.sse_reader import SSEParser
from protocol_adapters._engine.wire import (
    StreamDecoder,
    context_length_of,
    engine_message,
    error_for_status,
    parse_result,
    request_body,
)
from protocol_adapters._types import AdapterError, ErrorKind
from trajectory_tree import FinishReason

REQ = GenerateRequest(input_ids=(1, 2, 3), sampling=SamplingParams(max_new_tokens=8), rid="r")


def answer(
    ids: list[int], logprobs: list[float] | None = None, finish: Any = "stop", **meta: Any
) -> dict[str, Any]:
    logprobs = logprobs if logprobs is not None else [-0.5] * len(ids)
    return {
        "text": "",
        "output_ids": ids,
        "meta_info": {
            "id": "r",
            "prompt_tokens": 3,
            "completion_tokens": len(ids),
            "finish_reason": {"type": finish} if isinstance(finish, str) else finish,
            "output_token_logprobs": [[lp, t, None] for lp, t in zip(logprobs, ids, strict=True)],
            "weight_version": "v1",
            **meta,
        },
    }


def engine_error(payload: Any, request: GenerateRequest = REQ) -> str:
    with pytest.raises(AdapterError) as caught:
        parse_result(payload, request)
    assert caught.value.kind is ErrorKind.ENGINE_ERROR
    return caught.value.message


# -- typed inputs ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_new_tokens": 0},
        {"max_new_tokens": True},
        {"max_new_tokens": 1, "temperature": -0.1},
        {"max_new_tokens": 1, "temperature": float("nan")},
        {"max_new_tokens": 1, "top_p": 0.0},
        {"max_new_tokens": 1, "top_k": 0},
        {"max_new_tokens": 1, "min_p": 1.5},
        {"max_new_tokens": 1, "stop": "</s>"},
        {"max_new_tokens": 1, "stop": ("",)},
        {"max_new_tokens": 1, "stop_token_ids": (-1,)},
    ],
)
def test_sampling_params_refuse_nonsense(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 (each case has its own message)
        SamplingParams(**kwargs)


def test_requests_refuse_bad_ids_and_get_unique_rids() -> None:
    sampling = SamplingParams(max_new_tokens=1)
    with pytest.raises(ValueError, match="empty"):
        GenerateRequest(input_ids=(), sampling=sampling)
    with pytest.raises(ValueError, match=r"input_ids\[1\]"):
        GenerateRequest(input_ids=(1, -2), sampling=sampling)
    rids = {GenerateRequest(input_ids=(1,), sampling=sampling).rid for _ in range(1000)}
    assert len(rids) == 1000


@pytest.mark.parametrize(
    "kwargs",
    [
        {"base_url": "localhost:30000"},
        {"base_url": "http://h:1/?x=1"},
        {"base_url": "http://h:1", "request_timeout": 0},
        {"base_url": "http://h:1", "abort_timeout": float("inf")},
        {"base_url": "http://h:1", "max_connections": 0},
    ],
)
def test_config_refuses_nonsense(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011
        SGLangConfig(**kwargs)


def test_config_joins_paths_under_a_prefix() -> None:
    assert SGLangConfig("http://h:1/sglang/").url("/generate") == "http://h:1/sglang/generate"


def test_request_body_keeps_every_sampled_token() -> None:
    sampling = SamplingParams(max_new_tokens=9, stop=("\n\n",), stop_token_ids=(7,))
    body = request_body(GenerateRequest((4, 5), sampling, rid="x"), stream=True)
    assert body["rid"] == "x"
    assert body["input_ids"] == [4, 5]
    assert body["return_logprob"] is True
    assert body["stream"] is True
    params = body["sampling_params"]
    assert isinstance(params, dict)
    assert params["no_stop_trim"] is True
    assert params["skip_special_tokens"] is False
    assert params["stop"] == ["\n\n"]
    assert params["stop_token_ids"] == [7]
    json.dumps(body)  # plain JSON


def test_request_body_asks_for_structured_output_and_top_logprobs_only_when_wanted() -> None:
    plain = request_body(REQ, stream=False)
    assert "top_logprobs_num" not in plain
    assert "json_schema" not in plain["sampling_params"]  # type: ignore[operator]
    schema = '{"type":"object","properties":{"title":{"type":"string"}}}'
    sampling = SamplingParams(max_new_tokens=9, json_schema=schema)
    body = request_body(GenerateRequest((4,), sampling, rid="x", top_logprobs=3), stream=False)
    assert body["top_logprobs_num"] == 3  # a request field, not a sampling parameter
    params = body["sampling_params"]
    assert isinstance(params, dict)
    assert params["json_schema"] == schema


def test_top_logprobs_are_read_per_output_token() -> None:
    req = GenerateRequest((1, 2, 3), SamplingParams(max_new_tokens=8), rid="r", top_logprobs=2)
    top = [[[-0.5, 10, None], [-1.5, 99, None]], [[-0.25, 11, None], [None, 98, None]]]
    result = parse_result(answer([10, 11], [-0.5, -0.25], output_top_logprobs=top), req)
    # -inf (written as null by SGLang's encoder) is no alternative at all
    assert result.top_logprobs == (((10, -0.5), (99, -1.5)), ((11, -0.25),))
    assert parse_result(answer([10, 11]), REQ).top_logprobs == ()
    assert "missing" in engine_error(answer([10, 11]), req)
    assert "2 output tokens" in engine_error(answer([10, 11], output_top_logprobs=top[:1]), req)


@pytest.mark.parametrize("cumulative", [False, True], ids=["incremental", "cumulative"])
def test_streamed_top_logprobs_follow_the_tokens(cumulative: bool) -> None:
    req = GenerateRequest((1, 2, 3), SamplingParams(max_new_tokens=8), rid="r", top_logprobs=1)
    tops = [[[-0.5, 10, None]], [[-0.25, 11, None]], [[-0.125, 12, None]]]
    ids = [10, 11, 12]
    decoder = StreamDecoder(req)
    got: list[tuple[tuple[int, float], ...]] = []
    for end in (1, 3):
        start = 0 if cumulative or end == 1 else 1
        chunk = answer(
            ids[start:end],
            [-0.5, -0.25, -0.125][start:end],
            finish=None if end < 3 else "stop",
            completion_tokens=end,
            output_top_logprobs=tops[start:end],
        )
        got.extend(decoder.feed(chunk).top_logprobs)
    assert got == [((10, -0.5),), ((11, -0.25),), ((12, -0.125),)]


@pytest.mark.parametrize(
    ("info", "length"),
    [
        (
            {"context_length": 32768, "max_total_num_tokens": 500000, "max_req_input_len": 32767},
            32768,
        ),
        (
            {"context_length": None, "max_total_num_tokens": 500000, "max_req_input_len": 40959},
            40960,
        ),
        ({"context_length": 131072, "max_total_num_tokens": 60000}, 60000),  # a small KV pool
        ({"internal_states": [{"max_req_input_len": 8191}]}, 8192),
    ],
)
def test_context_length_from_server_info(info: dict[str, Any], length: int) -> None:
    assert context_length_of(info) == length


@pytest.mark.parametrize("info", [{"version": "0.5"}, [], {"context_length": "big"}])
def test_server_info_without_a_context_length_is_an_engine_error(info: Any) -> None:
    with pytest.raises(AdapterError) as caught:
        context_length_of(info)
    assert caught.value.kind is ErrorKind.ENGINE_ERROR


# -- whole answers ---------------------------------------------------------------------------------


def test_a_valid_answer() -> None:
    result = parse_result(answer([10, 11], [-1.0, -0.25], {"type": "stop", "matched": 11}), REQ)
    assert result.output_ids == (10, 11)
    assert result.output_logprobs == (-1.0, -0.25)
    assert result.finish_reason is FinishReason.STOP
    assert result.matched_stop == 11
    assert result.weight_version == "v1"


def test_abort_answers_carry_the_engines_message() -> None:
    finish = {"type": "abort", "message": "Abort before prefill", "status_code": None}
    result = parse_result(answer([], finish=finish), REQ)
    assert result.finish_reason is FinishReason.ABORT
    assert result.abort_message == "Abort before prefill"


@pytest.mark.parametrize(
    ("mutate", "detail"),
    [
        (lambda a: a.pop("meta_info"), "missing meta_info"),
        (lambda a: a["meta_info"].update(prompt_tokens=4), "prompt_tokens=4 but 3 input ids"),
        (lambda a: a["meta_info"].update(completion_tokens=-1), "completion_tokens is -1"),
        (lambda a: a["meta_info"].update(finish_reason=None), "finish_reason is null"),
        (lambda a: a["meta_info"].update(finish_reason={"type": "eos"}), "type is 'eos'"),
        (lambda a: a["meta_info"].update(weight_version=3), "weight_version is 3"),
        (lambda a: a.update(output_ids=[10, 12]), "output_ids disagree"),
        (lambda a: a["meta_info"]["output_token_logprobs"].append([-1.0]), "not [logprob, id"),
        (lambda a: a["meta_info"]["output_token_logprobs"][0].__setitem__(1, True), "token id"),
        (lambda a: a["meta_info"]["output_token_logprobs"][1].__setitem__(0, "x"), "logprob 'x'"),
        (lambda a: a["meta_info"].update(output_token_logprobs={}), "is a dict"),
    ],
)
def test_inconsistent_answers_are_refused_with_a_precise_message(mutate: Any, detail: str) -> None:
    payload = answer([10, 11])
    mutate(payload)
    assert detail in engine_error(payload)


def test_non_finite_logprobs_are_refused() -> None:
    payload = json.loads(json.dumps(answer([10, 11], [-0.5, float("-inf")])))
    assert "(token 11) has non-finite logprob" in engine_error(payload)


def test_an_error_object_instead_of_a_result() -> None:
    with pytest.raises(AdapterError) as caught:
        parse_result({"error": {"message": "Requested token count exceeds the model's maximum "
                                "context length of 8 tokens."}}, REQ)  # fmt: skip
    assert caught.value.kind is ErrorKind.CONTEXT_LENGTH


# -- streams ---------------------------------------------------------------------------------------

tokens = st.lists(
    st.tuples(st.integers(0, 200_000), st.floats(-30.0, 0.0, allow_nan=False)),
    min_size=0,
    max_size=40,
)


def chunked(n: int, cuts: list[int]) -> list[int]:
    """Increasing chunk ends that finish at ``n`` (chunks may be empty)."""
    return sorted({min(c, n) for c in cuts} | {n})


@settings(deadline=None)
@given(tokens, st.lists(st.integers(0, 40), max_size=10), st.booleans())
def test_stream_decoding_gives_new_tokens_in_either_server_mode(
    generated: list[tuple[int, float]], cuts: list[int], incremental: bool
) -> None:
    ids = [t for t, _ in generated]
    logprobs = [lp for _, lp in generated]
    decoder = StreamDecoder(REQ)
    got_ids: list[int] = []
    got_logprobs: list[float] = []
    start = 0
    ends = chunked(len(ids), cuts)
    for n, end in enumerate(ends):
        first = start if incremental else 0
        payload = answer(
            ids[first:end], logprobs[first:end], "stop" if n == len(ends) - 1 else None
        )
        payload["meta_info"]["completion_tokens"] = end
        chunk = decoder.feed(payload)
        assert list(chunk.output_ids) == ids[start:end]
        got_ids += chunk.output_ids
        got_logprobs += chunk.output_logprobs
        start = end
    assert (got_ids, got_logprobs) == (ids, logprobs)
    assert decoder.finished


def test_a_cumulative_chunk_may_not_rewrite_history() -> None:
    decoder = StreamDecoder(REQ)
    decoder.feed(answer([10, 11], finish=None))
    with pytest.raises(AdapterError, match="rewrite earlier tokens"):
        decoder.feed(answer([10, 12, 13], finish=None))


def test_a_chunk_that_fits_neither_mode_is_refused() -> None:
    decoder = StreamDecoder(REQ)
    decoder.feed(answer([10, 11], finish=None))
    bad = answer([12], finish=None)
    bad["meta_info"]["completion_tokens"] = 5
    with pytest.raises(AdapterError, match="neither cumulative nor incremental"):
        decoder.feed(bad)


def test_nothing_may_follow_the_finish() -> None:
    decoder = StreamDecoder(REQ)
    decoder.feed(answer([10]))
    with pytest.raises(AdapterError, match="after the chunk that carried the finish reason"):
        decoder.feed(answer([10, 11]))


# -- SSE framing -----------------------------------------------------------------------------------


def fed_in_reads(parser: SSEParser, raw: bytes, sizes: list[int]) -> list[str]:
    """The events ``parser`` gives for ``raw`` arriving in reads of ``sizes`` bytes (the rest in
    one last read), then its end of stream."""
    events: list[str] = []
    at = 0
    for size in [*sizes, len(raw)]:
        events += parser.feed(raw[at : at + size])
        at += size
    return events + parser.close()


@settings(deadline=None)
@given(
    st.lists(st.text(st.characters(exclude_categories=["Cs"]), max_size=30), max_size=6),
    st.sampled_from(["\n", "\r\n", "\r"]),
    st.lists(st.integers(1, 50), max_size=20),
)
def test_sse_events_survive_any_split_of_the_bytes(
    payloads: list[str], newline: str, sizes: list[int]
) -> None:
    payloads = [p.replace("\r", "").replace("\n", "") for p in payloads]
    wire = "".join(f": keep-alive{newline}data: {p}{newline}{newline}" for p in payloads)
    wire += "data: [DONE]" + newline + newline
    parser = SSEParser()
    assert fed_in_reads(parser, wire.encode(), sizes) == [*payloads, "[DONE]"]
    assert not parser.pending


def reference_events(wire: str) -> list[str]:
    """Server-sent events by the letter of the spec, a line at a time (the ``data`` field only)."""
    events: list[str] = []
    data: list[str] = []
    for line in wire.replace("\r\n", "\n").replace("\r", "\n").split("\n")[:-1]:
        if not line:
            if data:
                events.append("\n".join(data))
            data = []
            continue
        name, colon, value = line.partition(":")
        if name == "data":
            data.append(value[1:] if colon and value.startswith(" ") else value)
    return events


SSE_LINES = st.sampled_from(
    ["", "", "data: x", "data:y", "data:  two spaces", "data", "data:", "database: no",
     "data x", ": comment", "event: e", "id: 1", "retry: 5", "data: {\"a\": 1}", "data: é"]
)  # fmt: skip


@settings(deadline=None)
@given(
    st.lists(SSE_LINES, max_size=25),
    st.sampled_from(["\n", "\r\n", "\r"]),
    st.lists(st.integers(1, 40), max_size=20),
)
def test_sse_fields_of_every_kind_parse_as_the_spec_says_under_any_split(
    lines: list[str], newline: str, sizes: list[int]
) -> None:
    """Each read may take the LF-only fast path or the general one (a read starting mid-line,
    or holding a CR); both give the spec's events."""
    wire = "".join(line + newline for line in lines) + newline
    assert fed_in_reads(SSEParser(), wire.encode(), sizes) == reference_events(wire)


def test_sse_joins_multi_line_data_and_skips_other_fields() -> None:
    parser = SSEParser()
    assert parser.feed(b"event: x\nid: 3\ndata: a\ndata:b\n\n") == ["a\nb"]
    assert parser.feed(b"data: partial") == []
    assert parser.pending
    assert parser.close() == []  # an unterminated event is not an event


# -- error bodies ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('{"error": {"message": "boom"}}', "boom"),
        ('{"object": "error", "message": "bad", "type": "BadRequest", "code": 400}', "bad"),
        ('{"detail": "Not Found"}', "Not Found"),
        ('{"detail": [{"msg": "field required"}]}', '[{"msg": "field required"}]'),
        ("Internal Server Error", "Internal Server Error"),
        ("", "(empty body)"),
    ],
)
def test_engine_messages_in_every_shape(body: str, message: str) -> None:
    assert engine_message(body) == message


@pytest.mark.parametrize(
    ("status", "message", "kind"),
    [
        (400, "bad top_p", ErrorKind.INVALID_REQUEST),
        (400, "The input (9 tokens) is longer than the model's context length (8 tokens).",
         ErrorKind.CONTEXT_LENGTH),
        (413, "too big", ErrorKind.REQUEST_TOO_LARGE),
        (422, "field required", ErrorKind.INVALID_REQUEST),
        (429, "queue full", ErrorKind.RATE_LIMITED),
        (500, "CUDA error", ErrorKind.ENGINE_ERROR),
        (502, "bad gateway", ErrorKind.ENGINE_ERROR),
        (503, "no healthy workers", ErrorKind.OVERLOADED),
    ],
)  # fmt: skip
def test_status_mapping(status: int, message: str, kind: ErrorKind) -> None:
    error = error_for_status(status, json.dumps({"error": {"message": message}}), "rid-1")
    assert error.kind is kind
    assert message in error.message
    assert "rid-1" in error.message
