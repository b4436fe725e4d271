"""The trust property for sessions whose turns are not all whole, stopped replies: identical
requests (identical twin sub-agents), replies cut at ``max_new_tokens``, generations aborted
by a killed CLI or a closed session, several sessions on one engine.

``assert_trained_once_as_generated`` (``cli_session.py``) pairs each turn with its reply by
prompt, and wants every turn stopped; here each turn is paired with the request it records
(its rid), the reply the script gave for that prompt, cut at that request's
``max_new_tokens``, and an aborted turn must hold a prefix of it and be trained nowhere.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Sequence

from protocol_adapters.testing import ScriptedReply
from protocol_adapters.testing.stack import LocalStack
from trajectory_tree import FinishReason, Linearization, LossReason, SessionTree, Turn, linearize

from .cli_session import CliSession, ModelT
from .trust_checks import assert_engine_tokens_trained


def assert_outputs_are_the_requests_generations(
    stack: LocalStack,
    tree: SessionTree,
    replies: Sequence[tuple[tuple[int, ...], ScriptedReply]],
) -> None:
    """Each turn's output ids and logprobs are exactly what the double generated for the
    engine request the turn records: the scripted reply for that prompt (identical prompts got
    identical replies) up to the request's ``max_new_tokens``, with the double's logprobs. An
    aborted turn holds a non-empty prefix of that; a turn cut at ``max_new_tokens`` says
    ``length``."""
    by_prompt: dict[tuple[int, ...], list[list[int]]] = defaultdict(list)
    for prompt, reply in replies:
        by_prompt[prompt].append(stack.double.reply_ids(reply))
    requests = {r.rid: r for r in stack.double.requests}
    for turn in tree.turns:
        request = requests[turn.meta.request_id]
        prompt = tuple(tree.prompt_ids(turn))
        assert request.input_ids == prompt
        generations = by_prompt[prompt]
        assert generations, f"turn {turn.id}: the script never answered this prompt"
        assert all(g == generations[0] for g in generations), "one prompt, several replies"
        cap = request.sampling_params["max_new_tokens"]
        assert isinstance(cap, int)
        generated = generations[0][:cap]
        output = list(tree.output_ids(turn))
        if turn.finish_reason is FinishReason.ABORT:
            assert 0 < len(output) < len(generated), f"turn {turn.id}: not a partial generation"
            generated = generated[: len(output)]
        else:
            cut = len(generations[0]) > cap
            expected = FinishReason.LENGTH if cut else FinishReason.STOP
            assert turn.finish_reason is expected, f"turn {turn.id}: {turn.finish_reason}"
        assert output == generated, f"turn {turn.id}: output ids are not the double's"
        expected_logprobs = [stack.double.logprob_at(i, t) for i, t in enumerate(generated)]
        assert list(turn.output_logprobs) == expected_logprobs


def assert_each_engine_token_trained_once(
    done: CliSession[ModelT], *, aborted: Collection[int] = ()
) -> Linearization:
    """Over the whole tree: each turn's prompt is what the engine received; each generated
    token is trained exactly once, with its logprob, except the ``aborted`` turns' (trained
    nowhere, excluded as aborted); outputs are the double's generations; every turn was checked
    against a full render without a mismatch."""
    tree = done.tree
    lin = linearize(tree)
    assert {t.id for t in tree.turns if t.finish_reason is FinishReason.ABORT} == set(aborted)
    assert {(e.turn, e.reason) for e in lin.exclusions} == {
        (turn, LossReason.ABORTED) for turn in aborted
    }
    assert_engine_tokens_trained(done.stack, tree, lin)
    assert_outputs_are_the_requests_generations(done.stack, tree, done.agent.replies)
    stats = done.stack.renderer.stats
    assert stats.mismatches == 0
    assert stats.checked == len(tree.turns)
    return lin


def turns_by_agent(tree: SessionTree) -> dict[str | None, list[Turn]]:
    """The turns of each agent (``None``: the main agent), in order."""
    found: dict[str | None, list[Turn]] = {}
    for turn in tree.turns:
        found.setdefault(turn.meta.agent_id, []).append(turn)
    return found


def trained_by_agent(tree: SessionTree, lin: Linearization) -> dict[str | None, list[list[int]]]:
    """The trained turns of each sample, by the agent of the sample's leaf; every sample trains
    only turns of that agent."""
    found: dict[str | None, list[list[int]]] = {}
    for sample in lin.samples:
        agent = tree.turns[sample.leaf_turn].meta.agent_id
        trained = list(sample.trained_turns)
        others = [t for t in trained if tree.turns[t].meta.agent_id != agent]
        assert not others, f"sample {sample.index} of agent {agent} trains {others} of another"
        found.setdefault(agent, []).append(trained)
    return found


def assert_one_sample_per_agent(tree: SessionTree, lin: Linearization) -> None:
    """Each agent is one sample training exactly its own turns."""
    assert trained_by_agent(tree, lin) == {
        agent: [[t.id for t in turns]] for agent, turns in turns_by_agent(tree).items()
    }
