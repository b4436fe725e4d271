"""Length limits: truncate or drop, every lost token listed as ``over_length``."""

from __future__ import annotations

import pytest
from invariants import check_session
from session_kit import Session, call, prompt, reply, system, tool_result, user

from trajectory_tree import LengthLimit, LengthMode, LossReason, TurnMeta, linearize

SYS = system("agent")
TASK = user("task")


def chain(s: Session, turns: int) -> None:
    history = [SYS, TASK]
    for i in range(turns):
        answer = reply(f"step {i} " * 3, call(f"c{i}", "bash", {"cmd": str(i)}))
        s.turn(prompt(*history), answer)
        history += [answer, tool_result(f"c{i}", "ok " * 5)]


def over_length(lin: object) -> dict[int, int]:
    exclusions = getattr(lin, "exclusions", ())
    return {e.turn: e.tokens for e in exclusions if e.reason is LossReason.OVER_LENGTH}


def test_limit_at_the_exact_length_changes_nothing() -> None:
    s = Session()
    chain(s, 3)
    full = check_session(s).samples[0]
    lin = check_session(s, limit=LengthLimit(len(full.tokens)))
    assert not lin.samples[0].truncated
    assert lin.samples[0].tokens == full.tokens
    assert lin.exclusions == ()


def test_truncate_cuts_inside_an_output_and_excludes_the_rest() -> None:
    s = Session()
    chain(s, 3)
    turn1 = s.tree.turns[1]
    cut = turn1.prompt_length + 5
    lin = check_session(s, limit=LengthLimit(cut, LengthMode.TRUNCATE))
    (sample,) = lin.samples
    assert sample.truncated
    assert len(sample.tokens) == cut
    assert sample.trained_turns == (0, 1)
    assert sample.trained_tokens == s.tree.turns[0].output_length + 5
    assert over_length(lin) == {1: turn1.output_length - 5, 2: s.tree.turns[2].output_length}
    assert sample.spans[-1].end == cut


def test_truncate_before_the_first_output_drops_the_sample() -> None:
    s = Session()
    chain(s, 2)
    lin = check_session(s, limit=LengthLimit(s.tree.turns[0].prompt_length))
    assert lin.samples == ()
    assert over_length(lin) == {t.id: t.output_length for t in s.tree.turns}


def test_drop_removes_the_sample_and_excludes_what_it_trained() -> None:
    s = Session()
    chain(s, 3)
    lin = check_session(s, limit=LengthLimit(s.tree.turns[2].prompt_length, LengthMode.DROP))
    assert lin.samples == ()
    assert over_length(lin) == {t.id: t.output_length for t in s.tree.turns}


@pytest.mark.parametrize("agent", [None, "fork"], ids=["same-agent", "another-agent"])
def test_drop_lets_a_shorter_branch_train_the_shared_turns(agent: str | None) -> None:
    """The long branch is dropped; its shared prefix fits in the short branch, which must then
    train it, instead of masking it as trained elsewhere while nothing trains it. So too when
    the short branch is another agent's (a fork): no kept sample of the turn's own agent is
    left to train it."""
    s = Session()
    s.turn(prompt(SYS, TASK), reply("plan"))
    s.turn(prompt(SYS, TASK, reply("plan"), user("long " * 40)), reply("long branch"))
    fork = TurnMeta(agent_id=agent)
    s.turn(prompt(SYS, TASK, reply("plan"), user("short")), reply("short branch"), meta=fork)
    limit = LengthLimit(s.tree.turns[2].prompt_length + 20, LengthMode.DROP)
    lin = check_session(s, limit=limit)
    assert [x.trained_turns for x in lin.samples] == [(0, 2)]
    assert over_length(lin) == {1: s.tree.turns[1].output_length}


def test_truncate_keeps_accounting_across_branches() -> None:
    s = Session()
    s.turn(prompt(SYS, TASK), reply("plan"))
    s.turn(prompt(SYS, TASK, reply("plan"), user("long " * 40)), reply("long branch"))
    s.turn(prompt(SYS, TASK, reply("plan"), user("short")), reply("short branch"))
    limit = LengthLimit(s.tree.turns[2].prompt_length + 20, LengthMode.TRUNCATE)
    lin = check_session(s, limit=limit)
    assert sum(x.trained_tokens for x in lin.samples) + sum(over_length(lin).values()) == sum(
        t.output_length for t in s.tree.turns
    )


def test_a_truncated_sample_names_only_the_turns_it_trains() -> None:
    """Both branches are cut: the long one inside its own prompt (it trains the shared turn 0),
    the short one inside its own output (it trains turn 2 only; turn 0, masked there, is
    trained in the other sample)."""
    s = Session()
    s.turn(prompt(SYS, TASK), reply("plan"))
    s.turn(prompt(SYS, TASK, reply("plan"), user("long " * 40)), reply("long branch"))
    s.turn(prompt(SYS, TASK, reply("plan"), user("short")), reply("short branch"))
    limit = LengthLimit(s.tree.turns[2].prompt_length + 3, LengthMode.TRUNCATE)
    lin = check_session(s, limit=limit)
    assert [(x.truncated, x.leaf_turn, x.trained_turns) for x in lin.samples] == [
        (True, 1, (0,)),
        (True, 2, (2,)),
    ]


@pytest.mark.parametrize("mode", list(LengthMode))
@pytest.mark.parametrize("fraction", [0.1, 0.3, 0.5, 0.7, 0.9])
def test_accounting_adds_up_at_any_limit(mode: LengthMode, fraction: float) -> None:
    s = Session()
    chain(s, 4)
    s.turn(prompt(SYS, user("another")), reply("side branch " * 10))
    longest = max(len(x.tokens) for x in linearize(s.tree).samples)
    check_session(s, limit=LengthLimit(max(1, int(longest * fraction)), mode))


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        LengthLimit(0)


def test_mode_names_are_accepted_and_unknown_ones_refused() -> None:
    assert LengthLimit(5, "drop").mode is LengthMode.DROP  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cut"):
        LengthLimit(5, "cut")  # type: ignore[arg-type]


def test_a_cut_at_the_end_of_an_output_excludes_nothing_of_that_turn() -> None:
    """The limit falls exactly after turn 0's last token: turn 0 is trained whole, and no
    ``over_length`` exclusion of 0 tokens is listed for it."""
    s = Session()
    chain(s, 2)
    first, second = s.tree.turns
    cut = first.prompt_length + first.output_length
    lin = check_session(s, limit=LengthLimit(cut))
    (sample,) = lin.samples
    assert (sample.truncated, sample.trained_turns, len(sample.tokens)) == (True, (0,), cut)
    assert sample.response_length == first.output_length
    assert [(e.turn, e.reason, e.tokens) for e in lin.exclusions] == [
        (1, LossReason.OVER_LENGTH, second.output_length)
    ]
