"""The prompt ids' JSON text, reused across a session's calls: always exactly ``json.dumps``.

Each case checks the text against ``json.dumps`` of the ids (the reference the engine parses) and
how many ids were reused, so a cache that silently re-encodes everything fails as surely as one
that reuses a wrong prefix.
"""

from __future__ import annotations

import json
import random
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol_adapters import GenerateRequest, SamplingParams
from protocol_adapters._engine.ids_json import STRIDE, IdsJson, encode
from protocol_adapters._engine.wire import encoded_body, request_body


def dumped(ids: array[int]) -> str:
    return json.dumps(ids.tolist(), separators=(",", ":"))[1:-1]


def ids(n: int, seed: int = 0) -> array[int]:
    rng = random.Random(seed)
    return array("i", (rng.randrange(152_000) for _ in range(n)))


def test_a_prompt_that_extends_the_last_reuses_its_text_to_the_last_mark() -> None:
    cache = IdsJson(1 << 30)
    first = ids(5 * STRIDE + 17)
    assert cache.text("s", first) == dumped(first)
    assert cache.reused_ids == 0
    second = array("i", first)
    second.extend(ids(900, seed=1))  # the reply, the closing scaffold, a tool result
    assert cache.text("s", second) == dumped(second)
    assert cache.reused_ids == 5 * STRIDE
    third = array("i", second)
    third.extend(ids(3 * STRIDE, seed=2))
    assert cache.text("s", third) == dumped(third)
    assert cache.reused_ids == 5 * STRIDE + 5 * STRIDE  # second held 5 marks of its 6017 ids


def test_a_sibling_reuses_the_shared_prefix_and_a_stranger_nothing() -> None:
    cache = IdsJson(1 << 30)
    history = ids(4 * STRIDE + 300)
    first = array("i", history)
    first.extend(ids(2 * STRIDE, seed=1))
    cache.text("s", first)
    sibling = array("i", history)
    sibling.extend(ids(STRIDE, seed=2))  # the same request with another tool result
    assert cache.text("s", sibling) == dumped(sibling)
    assert cache.reused_ids == 4 * STRIDE
    stranger = ids(6 * STRIDE, seed=3)  # a sub-agent's first call under the same key
    assert cache.text("s", stranger) == dumped(stranger)
    assert cache.reused_ids == 4 * STRIDE


def test_a_change_inside_the_first_mark_reuses_nothing() -> None:
    cache = IdsJson(1 << 30)
    first = ids(3 * STRIDE)
    cache.text("s", first)
    changed = array("i", first)
    changed[10] += 1
    assert cache.text("s", changed) == dumped(changed)
    assert cache.reused_ids == 0


def test_sessions_keep_their_own_entries_and_the_bound_holds() -> None:
    prompt = ids(4 * STRIDE)
    one_entry = encode(prompt).cost
    cache = IdsJson(2 * one_entry + one_entry // 2)  # room for two entries
    for key in ("a", "b", "c"):
        cache.text(key, prompt)
    assert cache.size <= cache.max_bytes
    cache.text("a", prompt)  # pushed out by "c": encoded whole again
    assert cache.reused_ids == 0
    cache.text("c", prompt)
    assert cache.reused_ids == 4 * STRIDE
    cache.forget("c")
    cache.forget("c")
    assert cache.size == one_entry


def test_no_key_or_no_memory_encodes_every_prompt_whole() -> None:
    prompt = ids(3 * STRIDE)
    for cache, key in ((IdsJson(1 << 30), None), (IdsJson(0), "s")):
        assert cache.text(key, prompt) == cache.text(key, prompt) == dumped(prompt)
        assert cache.reused_ids == 0
        assert cache.size == 0
    with pytest.raises(ValueError, match="max_bytes"):
        IdsJson(-1)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 4 * STRIDE), st.integers(0, 3 * STRIDE), st.integers(0, 9)),
        min_size=1,
        max_size=8,
    )
)
def test_any_sequence_of_prompts_is_encoded_exactly(steps: list[tuple[int, int, int]]) -> None:
    """Each step keeps a prefix of the previous prompt (any length) and appends new ids."""
    cache = IdsJson(1 << 30)
    prompt = array("i")
    for keep, new, seed in steps:
        prompt = array("i", prompt[: min(keep, len(prompt))])
        prompt.extend(ids(new, seed))
        assert cache.text("s", prompt) == dumped(prompt)


def test_the_encoded_body_is_the_request_bodys_json() -> None:
    prompt = ids(2 * STRIDE + 5)
    sampling = SamplingParams(max_new_tokens=9)
    request = GenerateRequest(prompt, sampling, "s", rid="r", top_logprobs=2)
    for stream in (False, True):
        body = encoded_body(request, stream=stream, ids_text=IdsJson(1 << 30).text("s", prompt))
        assert json.loads(body) == request_body(request, stream=stream)


def test_a_negative_id_in_an_array_is_refused_by_position() -> None:
    prompt = ids(STRIDE)
    prompt[700] = -5
    with pytest.raises(ValueError, match=r"input_ids\[700\] = -5 is not a token id"):
        GenerateRequest(prompt, SamplingParams(max_new_tokens=4))
    for typecode in ("q", "h"):
        wide = array(typecode, [3, 1, -1])
        with pytest.raises(ValueError, match=r"input_ids\[2\] = -1"):
            GenerateRequest(wide, SamplingParams(max_new_tokens=4))
    fine = GenerateRequest(array("i", [0, 151_643]), SamplingParams(max_new_tokens=4))
    assert fine.input_ids[1] == 151_643
