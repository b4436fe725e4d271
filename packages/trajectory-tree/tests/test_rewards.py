"""Reward policies: how one episode's outcome reaches its several samples."""

from __future__ import annotations

import pytest
from invariants import check_linearization, check_session
from session_kit import Session, prompt, reply, system, user

from trajectory_tree import LossReason, RewardPolicy, assign_reward


def three_branches() -> Session:
    """Main agent (turns 0, 3), a sub-agent (1, 4) and a compaction restart (2)."""
    s = Session()
    main = [system("main"), user("task")]
    sub = [system("sub"), user("subtask")]
    s.turn(prompt(*main), reply("m0"))
    s.turn(prompt(*sub), reply("s0"))
    s.turn(prompt(system("main"), user("summary of the task")), reply("c0"))
    s.turn(prompt(*main, reply("m0"), user("next")), reply("m1"))
    s.turn(prompt(*sub, reply("s0"), user("next")), reply("s1"))
    return s


@pytest.mark.parametrize("policy", list(RewardPolicy))
def test_every_policy_shares_the_rollout_id(policy: RewardPolicy) -> None:
    s = three_branches()
    lin = assign_reward(check_session(s), 1.0, rollout_id="ep-7", policy=policy)
    assert lin.samples
    assert {x.rollout_id for x in lin.samples} == {"ep-7"}
    check_linearization(s, lin)


def test_full_gives_every_sample_the_whole_reward() -> None:
    s = three_branches()
    base = check_session(s)
    lin = assign_reward(base, 0.75, rollout_id="ep")
    assert [x.reward for x in lin.samples] == [0.75] * 3
    assert [x.tokens for x in lin.samples] == [x.tokens for x in base.samples]
    assert lin.exclusions == base.exclusions


def test_split_divides_the_reward() -> None:
    lin = assign_reward(check_session(three_branches()), 1.5, rollout_id="ep", policy="split")  # type: ignore[arg-type]
    assert [x.reward for x in lin.samples] == [0.5, 0.5, 0.5]


def test_final_branch_keeps_the_sample_with_the_last_trained_turn() -> None:
    s = three_branches()
    base = check_session(s)
    assert [x.trained_turns for x in base.samples] == [(2,), (0, 3), (1, 4)]
    lin = assign_reward(base, 1.0, rollout_id="ep", policy=RewardPolicy.FINAL_BRANCH)
    assert [(x.index, x.trained_turns, x.reward) for x in lin.samples] == [(0, (1, 4), 1.0)]
    not_final = {
        e.turn: e.tokens for e in lin.exclusions if e.reason is LossReason.NOT_FINAL_BRANCH
    }
    assert not_final == {t: s.tree.turns[t].output_length for t in (0, 2, 3)}
    check_linearization(s, lin)


def test_final_branch_trains_the_turns_it_shares_with_dropped_branches() -> None:
    """The shared prefix was trained in a sample the policy drops: the final branch, which
    holds it too, must train it rather than mask it as trained elsewhere."""
    s = Session()
    task = [system("main"), user("task")]
    s.turn(prompt(*task), reply("plan"))
    s.turn(prompt(*task, reply("plan"), user("try A")), reply("A"))
    s.turn(prompt(*task, reply("plan"), user("try B")), reply("B"))
    base = check_session(s)
    assert [x.trained_turns for x in base.samples] == [(0, 1), (2,)]
    lin = assign_reward(base, 1.0, rollout_id="ep", policy=RewardPolicy.FINAL_BRANCH)
    (final,) = lin.samples
    assert final.trained_turns == (0, 2)
    assert final.prompt_length == s.tree.turns[0].prompt_length
    assert LossReason.TRAINED_IN_OTHER_SAMPLE not in final.masked_tokens()
    assert [(e.turn, e.reason) for e in lin.exclusions] == [(1, LossReason.NOT_FINAL_BRANCH)]
    check_linearization(s, lin)


def test_policy_names_are_accepted_and_unknown_ones_refused() -> None:
    base = check_session(three_branches())
    named = assign_reward(base, 1.0, rollout_id="ep", policy="final_branch")  # type: ignore[arg-type]
    assert len(named.samples) == 1
    with pytest.raises(ValueError, match="best_branch"):
        assign_reward(base, 1.0, rollout_id="ep", policy="best_branch")  # type: ignore[arg-type]


def test_no_samples_no_reward() -> None:
    s = Session()
    s.turn(prompt(user("x")), reply(), output=[])
    base = check_session(s)
    assert assign_reward(base, 1.0, rollout_id="ep") == base
