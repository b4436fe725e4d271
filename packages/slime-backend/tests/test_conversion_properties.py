"""Conversion invariants over random sessions: sub-agents, compactions, aborts, length limits."""

from __future__ import annotations

import json
import pickle

from episode_kit import Recorder, base_sample, logprobs_of, mask_of, system, tool, user
from hypothesis import event, given, settings
from hypothesis import strategies as st

from slime_backend import NAMESPACE, ConversionOptions, EpisodeOutcome, episode_samples
from slime_backend.testing import StandInSample
from trajectory_tree import FinishReason, LengthMode, Message, linearize, summarize

Status = StandInSample.Status

step = st.tuples(
    st.integers(0, 2),  # which agent speaks
    st.booleans(),  # restart its conversation (a compaction) instead of continuing
    st.sampled_from([FinishReason.STOP] * 6 + [FinishReason.LENGTH, FinishReason.ABORT]),
    st.integers(0, 2),  # well-formed tool calls
    st.integers(0, 1),  # malformed ones
    st.text("abcxyz ", min_size=1, max_size=12),
)


def record(steps: list[tuple[int, bool, FinishReason, int, int, str]]) -> Recorder:
    rec = Recorder(seed=len(steps))
    last: dict[int, tuple[list[Message], Message]] = {}  # per agent: its request and the reply
    for agent, restart, finish, calls, malformed, text in steps:
        if agent not in last or restart:
            messages = [system(f"agent {agent}"), user(f"task {len(rec.tree.turns)}")]
        else:
            previous, reply = last[agent]
            calls_made = reply.tool_calls
            follow = tool(calls_made[0].id, "out") if calls_made else user("continue")
            messages = [*previous, reply, follow]
        reply = rec.turn(
            messages, text, calls=calls, malformed=malformed, finish=finish, agent=str(agent)
        )
        last[agent] = (messages, reply)
    return rec


@settings(max_examples=150, deadline=None)
@given(
    st.lists(step, min_size=0, max_size=12),
    st.one_of(st.none(), st.integers(30, 200)),
    st.sampled_from(list(LengthMode)),
    st.floats(-1, 1, allow_nan=False),
)
def test_every_sample_is_faithful_to_the_tree(
    steps: list[tuple[int, bool, FinishReason, int, int, str]],
    limit: int | None,
    mode: LengthMode,
    reward: float,
) -> None:
    rec = record(steps)
    options = ConversionOptions(max_sample_tokens=limit, length_mode=mode)
    base = base_sample(index=42, group_index=9)
    samples = episode_samples(
        rec.tree, base, EpisodeOutcome(reward), options, sample_class=StandInSample
    )
    lin = linearize(rec.tree, limit=options.limit)
    summary = summarize(rec.tree, lin)

    event(f"{len(lin.samples)} samples" if lin.samples else "placeholder")
    event(f"{sum(s.status is Status.TRUNCATED for s in samples)} truncated")
    assert samples, "slime must always get at least one sample"
    assert {(s.rollout_id, s.index, s.group_index) for s in samples} == {(42, 42, 9)}
    for s in samples:
        assert len(mask_of(s)) == len(logprobs_of(s)) == s.response_length
        assert s.response_length <= len(s.tokens)
        json.dumps(s.metadata)
        assert pickle.loads(pickle.dumps(s)) == s
    if not lin.samples:
        (placeholder,) = samples
        assert placeholder.status is Status.ABORTED
        assert placeholder.remove_sample
        assert placeholder.metadata[NAMESPACE]["episode"]["trained_tokens"] == 0
        return

    assert len(samples) == len(lin.samples)
    for s, ref in zip(samples, lin.samples, strict=True):
        start = ref.prompt_length
        assert s.tokens == ref.tokens.tolist()
        assert mask_of(s)[0] == 1
        assert mask_of(s) == ref.loss_mask[start:].tolist()
        for lp, mask, engine in zip(logprobs_of(s), mask_of(s), ref.logprobs[start:], strict=True):
            assert lp == (engine if mask else 0.0)
        assert s.reward == reward
        truncated_by = s.metadata[NAMESPACE]["sample"]["truncated_by"]
        assert (s.status is Status.TRUNCATED) == (truncated_by is not None)
    # The accounting identity: every generated token is trained once or excluded with a reason.
    trained = sum(sum(mask_of(s)) for s in samples)
    excluded = sum(summary.excluded_tokens.values())
    assert trained + excluded == summary.generated_tokens
    assert samples[0].metadata[NAMESPACE]["episode"]["trained_tokens"] == trained
