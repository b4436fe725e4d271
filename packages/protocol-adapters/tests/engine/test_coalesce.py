"""Joining the chunks one read held: nothing lost, reordered or moved across a version change."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from protocol_adapters._engine import GenerateChunk
from protocol_adapters._engine.coalesce import coalesced
from trajectory_tree import FinishReason


@st.composite
def streams(draw: st.DrawFn) -> list[GenerateChunk]:
    """A stream's chunks: 1-4 tokens each, counts cumulative, the version changing at random
    points, the last one finished or aborted."""
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=40))
    ending = draw(st.sampled_from([FinishReason.STOP, FinishReason.ABORT]))
    versions = draw(st.lists(st.sampled_from(["v1", "v2", None]), min_size=len(sizes)))
    chunks: list[GenerateChunk] = []
    seen = 0
    for index, size in enumerate(sizes):
        ids = tuple(range(seen, seen + size))
        seen += size
        last = index == len(sizes) - 1
        chunks.append(
            GenerateChunk(
                output_ids=ids,
                output_logprobs=tuple(-i / 8 for i in ids),
                completion_tokens=seen,
                prompt_tokens=7,
                finish_reason=ending if last else None,
                matched_stop=151645 if last else None,
                weight_version=versions[index],
                top_logprobs=tuple(((i, -0.5),) for i in ids),
            )
        )
    return chunks


@settings(deadline=None)
@given(streams(), st.integers(1, 12))
def test_joined_chunks_hold_the_same_tokens_versions_and_ending(
    chunks: list[GenerateChunk], cap: int
) -> None:
    joined = list(coalesced(chunks, max_tokens=cap))
    assert [t for c in joined for t in c.output_ids] == [t for c in chunks for t in c.output_ids]
    assert [p for c in joined for p in c.output_logprobs] == [
        p for c in chunks for p in c.output_logprobs
    ]
    assert [t for c in joined for t in c.top_logprobs] == [
        t for c in chunks for t in c.top_logprobs
    ]
    # every token keeps the version of the chunk that brought it
    assert [c.weight_version for c in joined for _ in c.output_ids] == [
        c.weight_version for c in chunks for _ in c.output_ids
    ]
    # a join never crosses the cap, except a single chunk already larger than it
    assert all(len(c.output_ids) <= max(cap, 4) for c in joined)
    assert [c.completion_tokens for c in joined][-1] == chunks[-1].completion_tokens
    assert joined[-1].finish_reason is chunks[-1].finish_reason
    assert joined[-1].matched_stop == 151645
    if chunks[-1].finish_reason is FinishReason.ABORT:
        # the tokens before an abort are handed on before it, never in the aborting chunk
        assert joined[-1].output_ids == chunks[-1].output_ids
    assert all(c.finish_reason is None for c in joined[:-1])


def test_neighbours_of_one_version_are_joined_up_to_the_cap() -> None:
    chunks = [
        GenerateChunk((i,), (-0.1,), i + 1, 3, weight_version="v1" if i < 5 else "v2")
        for i in range(8)
    ]
    joined = list(coalesced(chunks, max_tokens=3))
    assert [c.output_ids for c in joined] == [(0, 1, 2), (3, 4), (5, 6, 7)]
    assert [c.completion_tokens for c in joined] == [3, 5, 8]
    assert [c.weight_version for c in joined] == ["v1", "v1", "v2"]


def test_a_single_chunk_is_handed_on_as_is() -> None:
    chunk = GenerateChunk((1, 2), (-0.1, -0.2), 2, 3)
    assert list(coalesced([chunk])) == [chunk]
    assert next(iter(coalesced([chunk]))) is chunk
    assert list(coalesced([])) == []
