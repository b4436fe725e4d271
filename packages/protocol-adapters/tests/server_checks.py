"""Assertions shared by the server tests: the trust property, checked token by token."""

from __future__ import annotations

from protocol_adapters.testing.stack import LocalStack
from trajectory_tree import Linearization, SessionTree


def assert_engine_tokens_trained(stack: LocalStack, tree: SessionTree, lin: Linearization) -> None:
    """Every loss-1 token is an id the engine double sent, at its place, with its logprob; every
    prompt the engine received is exactly the recorded prompt of its turn; and every turn's
    output is trained exactly once, unless the linearization excludes it with a reason."""
    received = {r.rid: r for r in stack.double.requests}
    for turn in tree.turns:
        sent = received[turn.meta.request_id]
        assert list(tree.prompt_ids(turn)) == list(sent.input_ids)
    trained: list[int] = []
    for sample in lin.samples:
        for span in sample.spans:
            if span.trained:
                assert span.turn is not None
                turn = tree.turns[span.turn]
                assert list(sample.tokens[span.start : span.end]) == list(tree.output_ids(turn))
                assert list(sample.logprobs[span.start : span.end]) == list(turn.output_logprobs)
                assert all(sample.loss_mask[span.start : span.end])
                trained.append(turn.id)
    excluded = {e.turn for e in lin.exclusions}
    assert sorted(trained) == [t.id for t in tree.turns if t.output_length and t.id not in excluded]
