"""Test support: the tree's guarantees, checked against what the engine really saw and returned.

:func:`check_session` is called by the scenario tests and by the property-based tests alike, so
every hand-written scenario is also checked against every invariant.
"""

from __future__ import annotations

from collections import defaultdict

from session_kit import Session

from trajectory_tree import (
    FinishReason,
    LengthLimit,
    Linearization,
    LossReason,
    linearize,
    turn_exclusions,
)

PROMPT_REASONS = frozenset(
    {
        LossReason.CONTEXT,
        LossReason.TOOL_OUTPUT,
        LossReason.TEMPLATE_SCAFFOLD,
        LossReason.RERENDERED_HISTORY,
    }
)
OUTPUT_REASONS = frozenset(
    {
        LossReason.GENERATED,
        LossReason.TRAINED_IN_OTHER_SAMPLE,
        LossReason.ABORTED,
        LossReason.ABANDONED_RETRY,
        LossReason.SIDE_REQUEST,
    }
)


def check_recorded(session: Session) -> None:
    """Invariant 5: each turn's recorded ids and logprobs are exactly the engine call's."""
    tree = session.tree
    assert sorted(session.calls) == [t.id for t in tree.turns], "every turn recorded once"
    for turn in tree.turns:
        call = session.calls[turn.id]
        assert tree.prompt_ids(turn).tolist() == call.input_ids, f"turn {turn.id} prompt"
        assert tree.output_ids(turn).tolist() == call.output_ids, f"turn {turn.id} output"
        assert turn.output_logprobs.tolist() == call.logprobs, f"turn {turn.id} logprobs"
        assert turn.prompt_length == len(call.input_ids)
        assert turn.output_length == len(call.output_ids)


def check_linearization(session: Session, lin: Linearization) -> dict[int, int]:
    """Invariants 1-4 for ``lin``; returns the trained token count per turn."""
    tree = session.tree
    calls = session.calls
    trained_at: dict[int, list[int]] = defaultdict(list)  # turn -> trained output offsets
    shared_at: dict[int, set[int]] = defaultdict(set)  # turn -> offsets said trained elsewhere
    for index, sample in enumerate(lin.samples):
        tokens = sample.tokens.tolist()
        leaf = tree.turns[sample.leaf_turn]
        whole = tree.prompt_ids(leaf).tolist() + tree.output_ids(leaf).tolist()
        # 1. a sample is one turn's prompt + output (a prefix of it when truncated)
        if sample.truncated:
            assert len(tokens) < len(whole)
            assert tokens == whole[: len(tokens)]
        else:
            assert tokens == whole
        # 4. aligned arrays, spans tiling the sample, a reason on every span
        assert len(sample.loss_mask) == len(tokens) == len(sample.logprobs)
        assert sample.index == index
        position = 0
        for span in sample.spans:
            assert span.start == position < span.end, f"spans must tile: {span}"
            position = span.end
            mask = sample.loss_mask[span.start : span.end].tolist()
            logprobs = sample.logprobs[span.start : span.end].tolist()
            assert mask == [1 if span.trained else 0] * len(span)
            if span.turn is None:
                assert span.reason in PROMPT_REASONS, span
                assert logprobs == [0.0] * len(span)
                continue
            # 2. generated tokens: the engine's ids, after the engine's prompt, with its logprobs
            assert span.reason in OUTPUT_REASONS, span
            call = calls[span.turn]
            assert span.start == len(call.input_ids)
            assert tokens[: span.start] == call.input_ids
            assert tokens[span.start : span.end] == call.output_ids[: len(span)]
            assert logprobs == call.logprobs[: len(span)]
            positions = range(len(span))  # offsets into the turn's output
            if span.trained:
                trained_at[span.turn].extend(positions)
            elif span.reason is LossReason.TRAINED_IN_OTHER_SAMPLE:
                shared_at[span.turn].update(positions)
        assert position == len(tokens)
        trained_spans = [s for s in sample.spans if s.trained]
        assert trained_spans, "a sample trains something"
        assert sample.prompt_length == trained_spans[0].start
        assert sample.response_length == len(tokens) - sample.prompt_length
        assert list(sample.trained_turns) == list(dict.fromkeys(s.turn for s in trained_spans))
        assert sample.trained_tokens == sum(len(s) for s in trained_spans)
    # 3. every generated token is trained exactly once or excluded with a reason
    excluded: dict[int, int] = defaultdict(int)
    for ex in lin.exclusions:
        assert ex.tokens > 0
        excluded[ex.turn] += ex.tokens
    reasons = turn_exclusions(tree)
    for turn in tree.turns:
        offsets = trained_at[turn.id]
        assert len(offsets) == len(set(offsets)), f"turn {turn.id} trained twice"
        assert len(offsets) + excluded[turn.id] == turn.output_length, f"turn {turn.id} accounting"
        assert shared_at[turn.id] <= set(offsets), f"turn {turn.id}: 'trained elsewhere' is false"
        if turn.id in reasons:
            assert not offsets, f"excluded turn {turn.id} trained"
        if turn.finish_reason is FinishReason.ABORT and turn.output_length:
            assert reasons[turn.id] is LossReason.ABORTED
    return {t.id: len(trained_at[t.id]) for t in tree.turns}


def check_session(session: Session, *, limit: LengthLimit | None = None) -> Linearization:
    """All invariants on ``session``; returns its linearization."""
    check_recorded(session)
    lin = linearize(session.tree, limit=limit)
    check_linearization(session, lin)
    return lin
