"""MoE routing and weight versions on SGLang's wire, without a server: the request fields, the
decoding of ``meta_info.routed_experts`` (base64 and list), every inconsistency refused with the
field named, and version runs built from streamed chunks."""

from __future__ import annotations

import base64
from array import array
from typing import Any

import pytest

from protocol_adapters._engine import GenerateRequest, RoutingAsk, SamplingParams
from protocol_adapters._engine.routed_experts import STEP_CHARS, int32_ids
from protocol_adapters._engine.versions import VersionRuns
from protocol_adapters._engine.wire import StreamDecoder, parse_result, request_body
from protocol_adapters._types import AdapterError, ErrorKind
from trajectory_tree import Completion, FinishReason

PROMPT = (11, 12, 13, 14, 15)
ASK = RoutingAsk(start=2, layers=2, topk=3)  # 6 ids per position


def req(ask: RoutingAsk | None = ASK) -> GenerateRequest:
    return GenerateRequest(
        input_ids=PROMPT, sampling=SamplingParams(max_new_tokens=8), rid="r", routed_experts=ask
    )


def b64(ids: list[int]) -> str:
    return base64.b64encode(array("i", ids).tobytes()).decode()


def rows(output: int, start: int = ASK.start) -> list[int]:
    """Distinct ids for every position a call of ``output`` tokens computes from ``start``."""
    count = (len(PROMPT) + output - 1 - start) * ASK.layers * ASK.topk
    return [i % 97 for i in range(count)]


def answer(
    ids: list[int], routing: Any = None, finish: Any = "stop", version: str = "v1", **meta: Any
) -> dict[str, Any]:
    info: dict[str, Any] = {
        "id": "r",
        "prompt_tokens": len(PROMPT),
        "completion_tokens": len(ids),
        "finish_reason": None if finish is None else {"type": finish},
        "output_token_logprobs": [[-0.5, t, None] for t in ids],
        "weight_version": version,
        **meta,
    }
    if routing is not None:
        info["routed_experts"] = routing
    return {"text": "", "output_ids": ids, "meta_info": info}


def refused(payload: Any, request: GenerateRequest | None = None) -> str:
    with pytest.raises(AdapterError) as caught:
        parse_result(payload, request or req())
    assert caught.value.kind is ErrorKind.ENGINE_ERROR
    assert "malformed engine response for r" in caught.value.message
    return caught.value.message


def test_the_request_asks_for_routing_from_its_start_only_when_capturing() -> None:
    body = request_body(req(), stream=False)
    assert body["return_routed_experts"] is True
    assert body["routed_experts_start_len"] == 2
    sampling = body["sampling_params"]
    assert isinstance(sampling, dict)
    assert "return_routed_experts" not in sampling
    plain = request_body(req(None), stream=True)
    assert "return_routed_experts" not in plain
    assert "routed_experts_start_len" not in plain
    with pytest.raises(ValueError, match="past the 5 ids"):
        req(RoutingAsk(6, 2, 3))
    with pytest.raises(ValueError, match="layers and topk"):
        RoutingAsk(0, 0, 3)


@pytest.mark.parametrize("as_list", [False, True])
def test_routing_is_decoded_into_the_turns_packed_rows(as_list: bool) -> None:
    expected = rows(output=3)
    payload = answer([7, 8, 9], expected if as_list else b64(expected), routed_experts_start_len=2)
    result = parse_result(payload, req())
    routed = result.routed_experts
    assert routed is not None
    assert (routed.start, routed.layers, routed.topk, routed.rows) == (2, 2, 3, 5)
    assert routed.experts.typecode == "i"
    assert routed.experts.tolist() == expected
    completion = result.to_completion()
    assert completion.routed_experts is routed
    assert completion.version_runs == ((0, "v1"),)


def test_a_large_routing_blob_spans_many_slices() -> None:
    """Decoded a slice at a time: ids cut at slice edges and a negative id in a late slice."""
    big = [i % 128 for i in range(STEP_CHARS)]  # four slices of base64
    ask = RoutingAsk(0, 1, 1)
    prompt_rows = len(big) - 2
    request = GenerateRequest(
        input_ids=tuple(range(prompt_rows)),
        sampling=SamplingParams(max_new_tokens=8),
        rid="r",
        routed_experts=ask,
    )
    payload = answer([1, 2, 3], b64(big))
    payload["meta_info"]["prompt_tokens"] = prompt_rows
    routed = parse_result(payload, request).routed_experts
    assert routed is not None
    assert routed.experts == array("i", big)
    big[-5] = -7
    payload["meta_info"]["routed_experts"] = b64(big)
    assert "negative expert id" in refused(payload, request)


@pytest.mark.parametrize(
    ("routing", "detail"),
    [
        (b64(rows(3)[:-1]), "routed_experts holds 29 expert ids, not 30: 5 positions from 2"),
        (b64([*rows(3), 1, 2, 3, 4, 5, 6]), "holds 36 expert ids, not 30"),
        (b64([-1, *rows(3)[1:]]), "routed_experts holds a negative expert id"),
        ([-1, *rows(3)[1:]], "routed_experts holds a negative expert id"),
        (["1", *rows(3)[1:]], "holds something not an int32"),
        ([2**40, *rows(3)[1:]], "holds something not an int32"),
        ("!" + b64(rows(3))[1:], "routed_experts is not base64"),
        (b64(rows(3)) + "A", "routed_experts is not base64: 161 characters"),
        ("AAA=" + b64(rows(3))[4:], "is not base64"),
        (base64.b64encode(bytes(119)).decode(), "not whole int32s"),
        ({"rows": []}, "routed_experts is a dict, not base64 text or a list"),
    ],
)
def test_inconsistent_routing_is_an_engine_error_naming_the_field(
    routing: Any, detail: str
) -> None:
    assert detail in refused(answer([7, 8, 9], routing))


def test_routing_must_be_there_exactly_when_asked_for() -> None:
    unasked = refused(answer([7, 8, 9], b64(rows(3))), req(None))
    assert "meta_info.routed_experts is present but was not asked for" in unasked
    missing = refused(answer([7, 8, 9]))
    assert "routed_experts is missing" in missing
    assert "--enable-return-routed-experts" in missing
    echoed = refused(answer([7, 8, 9], b64(rows(3)), routed_experts_start_len=0))
    assert "routed_experts_start_len is 0, but 2 was asked for" in echoed
    # An aborted call may end before the engine gathered its routing: none, and no error.
    aborted = parse_result(answer([7], finish="abort"), req())
    assert aborted.finish_reason is FinishReason.ABORT
    assert aborted.routed_experts is None
    # When it does carry routing, it is checked like any other.
    partial = parse_result(answer([7], b64(rows(1)), finish="abort"), req())
    assert partial.routed_experts is not None
    assert partial.routed_experts.rows == 3


def test_a_stream_takes_its_routing_from_the_finishing_chunk() -> None:
    decoder = StreamDecoder(req())
    first = decoder.feed(answer([7], b64([5, 5]), finish=None))  # partial: ignored
    assert first.routed_experts is None
    last_payload = answer([8, 9], b64(rows(3)), finish="stop")
    last_payload["meta_info"]["completion_tokens"] = 3
    last = decoder.feed(last_payload)
    assert last.routed_experts is not None
    assert last.routed_experts.experts.tolist() == rows(3)
    unasked = StreamDecoder(req(None))
    with pytest.raises(AdapterError, match="present but was not asked for"):
        unasked.feed(answer([7], b64([5, 5]), finish=None))


def test_version_runs_start_where_a_chunk_first_names_a_new_version() -> None:
    runs = VersionRuns()
    for tokens, version in [(2, "v1"), (1, "v1"), (3, "v2"), (0, "v2"), (1, "v2")]:
        runs.add(tokens, version)
    assert runs.runs == ((0, "v1"), (3, "v2"))
    assert runs.version == "v2"
    Completion([1] * 7, [-0.1] * 7, FinishReason.STOP, runs.version, runs.runs)

    late = VersionRuns()  # the version changed after the last token: it generated nothing
    late.add(4, "v1")
    late.add(0, "v2")
    assert (late.runs, late.version) == (((0, "v1"),), "v1")

    unknown = VersionRuns()  # tokens without a version: no runs claimed
    unknown.add(2, None)
    unknown.add(2, "v1")
    assert (unknown.runs, unknown.version) == ((), "v1")


def test_int32_ids_are_little_endian() -> None:
    assert int32_ids(base64.b64encode(bytes([1, 0, 0, 0, 0, 1, 0, 0])).decode()).tolist() == [
        1,
        256,
    ]
