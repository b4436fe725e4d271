"""The trust property, checked token by token (``protocol_adapters.testing.trust``), plus one step
further: the recorded output is compared with what the engine double actually generated for each
prompt."""

from __future__ import annotations

from collections.abc import Sequence

from protocol_adapters.testing import ScriptedReply
from protocol_adapters.testing.stack import LocalStack
from protocol_adapters.testing.trust import check_engine_tokens_trained
from trajectory_tree import SessionTree

assert_engine_tokens_trained = check_engine_tokens_trained


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
