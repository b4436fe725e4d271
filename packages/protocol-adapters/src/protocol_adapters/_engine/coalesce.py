"""Stream chunks that arrived in one read, handed on as one.

SGLang sends a chunk per token (its default stream interval). While the adapter keeps up, each
socket read holds one; when it falls behind (many sessions streaming at once), a read holds many,
and handing them on one by one pays the whole per-chunk path for each token: the turn's loop, the
reply parser, an SSE event and a socket write to the client. Joined, that path runs once per
read, so the adapter's cost per token falls as its load rises, where it matters. A joined chunk is
what SGLang itself sends with a larger stream interval: the same tokens, in order, with the last
one's counts and finish.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace

from trajectory_tree import FinishReason

from .types import GenerateChunk

MAX_JOINED_TOKENS = 128
"""A joined chunk holds at most this many tokens, so that one read of many short events does not
hold the event loop for longer than a few milliseconds."""


def coalesced(
    chunks: Sequence[GenerateChunk], max_tokens: int = MAX_JOINED_TOKENS
) -> Iterator[GenerateChunk]:
    """``chunks`` in order, neighbours joined while their weight version is the same and the
    joined chunk stays within ``max_tokens`` (a version change mid-stream stays visible: each
    token is recorded under the version that produced it). An abort is never joined to the tokens
    before it: the client sees them streamed, then the abort, whatever the reads held."""
    group: list[GenerateChunk] = []
    tokens = 0
    for chunk in chunks:
        if group and (
            chunk.weight_version != group[0].weight_version
            or tokens + len(chunk.output_ids) > max_tokens
            or chunk.finish_reason is FinishReason.ABORT
        ):
            yield _joined(group)
            group, tokens = [], 0
        group.append(chunk)
        tokens += len(chunk.output_ids)
    if group:
        yield _joined(group)


def _joined(group: list[GenerateChunk]) -> GenerateChunk:
    if len(group) == 1:
        return group[0]
    last = group[-1]
    return replace(
        last,
        output_ids=tuple(i for chunk in group for i in chunk.output_ids),
        output_logprobs=tuple(p for chunk in group for p in chunk.output_logprobs),
        top_logprobs=tuple(t for chunk in group for t in chunk.top_logprobs),
    )
