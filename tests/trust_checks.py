"""The trust property, checked token by token (the logic of protocol-adapters' server_checks,
copied here because test directories do not import each other), plus one step further: the
recorded output is compared with what the engine double actually generated for each prompt."""

from __future__ import annotations

from collections.abc import Sequence

from protocol_adapters.testing import ScriptedReply
from protocol_adapters.testing.stack import LocalStack
from trajectory_tree import Linearization, SessionTree


def assert_engine_tokens_trained(stack: LocalStack, tree: SessionTree, lin: Linearization) -> None:
    """Every loss-1 token is an id the engine double sent, at its place, with its logprob; and
    every prompt the engine received is exactly the recorded prompt of its turn."""
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
    assert sorted(trained) == [t.id for t in tree.turns if t.output_length]


def assert_outputs_are_generations(
    stack: LocalStack,
    tree: SessionTree,
    replies: Sequence[tuple[tuple[int, ...], ScriptedReply]],
) -> None:
    """Each turn's recorded output ids and logprobs are exactly what the double generated for
    that turn's prompt: the ids of its scripted reply, each with the double's logprob."""
    by_prompt = dict(replies)
    assert len(by_prompt) == len(replies), "two requests had the same prompt"
    for turn in tree.turns:
        reply = by_prompt[tuple(tree.prompt_ids(turn))]
        generated = stack.double.reply_ids(reply)
        assert list(tree.output_ids(turn)) == generated
        expected = [stack.double.logprob_at(i, t) for i, t in enumerate(generated)]
        assert list(turn.output_logprobs) == expected
