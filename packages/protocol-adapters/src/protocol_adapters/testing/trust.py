"""The trust property, checked token by token against the engine double.

For tests and demos: after a session ran through :func:`local_stack`, every prompt the engine
received must be exactly the recorded prompt of its turn, and every loss-1 token of the
linearization must be an id the engine produced, at its place, with its logprob, trained once
(or excluded with a reason). A violation raises :class:`TrustViolation` saying where.
"""

from __future__ import annotations

from trajectory_tree import Linearization, SessionTree

from .stack import LocalStack


class TrustViolation(AssertionError):
    """Recorded tokens that are not exactly what the engine was sent or produced."""


def check_engine_tokens_trained(
    stack: LocalStack, tree: SessionTree, linearization: Linearization
) -> None:
    received = {r.rid: r for r in stack.double.requests}
    for turn in tree.turns:
        sent = received.get(turn.meta.request_id)
        if sent is None:
            raise TrustViolation(
                f"turn {turn.id}: the engine never received {turn.meta.request_id}"
            )
        if list(tree.prompt_ids(turn)) != list(sent.input_ids):
            raise TrustViolation(f"turn {turn.id}: recorded prompt ids differ from those sent")
    trained: list[int] = []
    for sample in linearization.samples:
        for span in sample.spans:
            if not span.trained:
                continue
            if span.turn is None:
                raise TrustViolation(f"sample {sample.index}: a trained span without a turn")
            turn = tree.turns[span.turn]
            where = f"sample {sample.index}, turn {turn.id}, tokens {span.start}:{span.end}"
            if list(sample.tokens[span.start : span.end]) != list(tree.output_ids(turn)):
                raise TrustViolation(f"{where}: trained ids are not the engine's output ids")
            if list(sample.logprobs[span.start : span.end]) != list(turn.output_logprobs):
                raise TrustViolation(f"{where}: logprobs are not the engine's")
            if not all(sample.loss_mask[span.start : span.end]):
                raise TrustViolation(f"{where}: loss mask is not 1 on generated tokens")
            trained.append(turn.id)
    excluded = {e.turn for e in linearization.exclusions}
    expected = [t.id for t in tree.turns if t.output_length and t.id not in excluded]
    if sorted(trained) != expected:
        raise TrustViolation(f"turns trained {sorted(trained)}, expected each of {expected} once")
