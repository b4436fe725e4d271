"""Retries: a client replaying the same request must not fork training."""

from __future__ import annotations

import pytest
from invariants import check_session
from session_kit import Session, call, prompt, reply, system, tool_result, user

from trajectory_tree import FinishReason, LossReason, TurnMeta, dumps, loads, turn_exclusions

SYS = system("agent")
TASK = user("task")
ASK = prompt(SYS, TASK)


def test_replayed_request_shows_the_recorded_turn() -> None:
    s = Session()
    first = s.turn(ASK, reply("answer"))
    route = s.tree.route(ASK)
    assert route.recorded == (first,)
    assert route.new_messages == ()
    assert s.tree.route(prompt(SYS, TASK, reply("answer"), user("more"))).recorded == ()


def test_replaying_the_recorded_answer_changes_nothing() -> None:
    """An adapter that answers a retry from ``route.recorded`` records nothing new."""
    s = Session()
    s.turn(ASK, reply("answer"))
    before = len(s.tree.nodes)
    replay = s.tree.route(ASK).recorded[-1]
    assert s.tree.output_ids(replay).tolist() == s.calls[0].output_ids
    assert len(s.tree.nodes) == before
    assert len(check_session(s).samples) == 1


def test_recording_a_retry_abandons_the_earlier_leaf() -> None:
    s = Session()
    s.turn(ASK, reply("first try"))
    route = s.tree.route(ASK)
    retry = s.finish(s.start(ASK, reply("second try")))
    assert s.tree.route(ASK).recorded == (s.tree.turns[0], retry)
    assert route.recorded == (s.tree.turns[0], retry), "a route reads the live tree"
    lin = check_session(s)
    assert [x.trained_turns for x in lin.samples] == [(1,)]
    assert [(e.turn, e.reason) for e in lin.exclusions] == [(0, LossReason.ABANDONED_RETRY)]
    assert lin.exclusions[0].tokens == s.tree.turns[0].output_length


def test_a_retry_deep_in_a_session_trains_the_shared_prefix_once() -> None:
    s = Session()
    history = [SYS, TASK]
    for i in range(3):
        answer = reply(f"step {i}", call(f"c{i}", "bash", {"cmd": str(i)}))
        s.turn(prompt(*history), answer)
        history += [answer, tool_result(f"c{i}", "ok")]
    s.turn(prompt(*history), reply("done"))
    s.turn(prompt(*history), reply("done, really"))
    s.turn(prompt(*history), reply("done, for sure"))
    lin = check_session(s)
    assert [x.trained_turns for x in lin.samples] == [(0, 1, 2, 5)]
    assert {e.turn: e.reason for e in lin.exclusions} == {
        3: LossReason.ABANDONED_RETRY,
        4: LossReason.ABANDONED_RETRY,
    }


def test_a_retry_whose_earlier_answer_was_continued_keeps_both() -> None:
    s = Session()
    s.turn(ASK, reply("first", call("c1", "bash", {"cmd": "ls"})))
    s.turn(prompt(SYS, TASK, s.tree.turns[0].reply, tool_result("c1", "a.py")), reply("later"))
    s.turn(ASK, reply("second"))  # e.g. another client replaying the first request
    assert turn_exclusions(s.tree) == {}
    lin = check_session(s)
    assert [x.trained_turns for x in lin.samples] == [(0, 1), (2,)]


def test_a_retry_after_an_aborted_answer() -> None:
    s = Session()
    partial = s.fmt.assistant_output(reply("I will fix"))[:4]
    s.turn(ASK, reply("I wi"), output=partial, finish=FinishReason.ABORT)
    s.turn(ASK, reply("fixed"))
    lin = check_session(s)
    assert [x.trained_turns for x in lin.samples] == [(1,)]
    assert [(e.turn, e.reason) for e in lin.exclusions] == [(0, LossReason.ABORTED)]


def test_the_newest_retry_is_the_lineage_routing_follows() -> None:
    s = Session()
    answer = reply("same")
    s.turn(ASK, answer)
    s.turn(ASK, answer, output=[*b"sa", *b"me", 257])
    route = s.tree.route(prompt(SYS, TASK, answer, user("next")))
    assert route.previous_generated is s.tree.turns[1]


@pytest.mark.parametrize("continued", [0, 1], ids=["first-answer", "retry-answer"])
def test_the_answer_the_client_never_continued_is_abandoned_whichever_came_first(
    continued: int,
) -> None:
    """A client may retry and then continue the *first* answer (its retry's response came too
    late, or it had both and kept one): the unused answer is excluded in either case."""
    s = Session()
    answers = [
        reply("first try", call("c1", "bash", {"cmd": "ls"})),
        reply("second try", call("c2", "bash", {"cmd": "pwd"})),
    ]
    s.turn(ASK, answers[0])
    s.turn(ASK, answers[1], meta=TurnMeta(retry_count=1))
    kept = answers[continued]
    (used,) = kept.tool_calls
    s.turn(prompt(SYS, TASK, kept, tool_result(used.id, "out")), reply("done"))
    lin = check_session(s)
    assert [x.trained_turns for x in lin.samples] == [(continued, 2)]
    abandoned = 1 - continued
    assert [(e.turn, e.reason) for e in lin.exclusions] == [(abandoned, LossReason.ABANDONED_RETRY)]


@pytest.mark.parametrize("finish_order", [(0, 1), (1, 0)], ids=["in-order", "reversed"])
@pytest.mark.parametrize("continued", [0, 1], ids=["continue-a", "continue-b"])
def test_concurrent_identical_requests_train_only_the_continued_answer(
    finish_order: tuple[int, int], continued: int
) -> None:
    """Two identical requests in flight at once (a client that timed out and retried while the
    first was still generating) finish in either order; the client continues one of them."""
    s = Session()
    answers = [
        reply("answer a", call("ca", "bash", {"cmd": "a"})),
        reply("answer b", call("cb", "bash", {"cmd": "b"})),
    ]
    pending = [s.start(ASK, answer) for answer in answers]
    recorded = {index: s.finish(pending[index]) for index in finish_order}
    kept = answers[continued]
    (used,) = kept.tool_calls
    final = s.turn(prompt(SYS, TASK, kept, tool_result(used.id, "out")), reply("done"))
    lin = check_session(s)
    assert [x.trained_turns for x in lin.samples] == [(recorded[continued].id, final.id)]
    assert [(e.turn, e.reason) for e in lin.exclusions] == [
        (recorded[1 - continued].id, LossReason.ABANDONED_RETRY)
    ]


def test_retry_exclusions_survive_a_round_trip() -> None:
    """The order of use is part of the tree: a reloaded tree excludes the same answer."""
    s = Session()
    first = reply("first", call("c1", "bash", {"cmd": "ls"}))
    s.turn(ASK, first)
    s.turn(ASK, reply("second"))
    s.turn(prompt(SYS, TASK, first, tool_result("c1", "out")), reply("done"))
    assert (
        turn_exclusions(loads(dumps(s.tree)))
        == turn_exclusions(s.tree)
        == {1: LossReason.ABANDONED_RETRY}
    )


def test_metadata_left_out_describes_a_first_attempt_of_the_policys_own_work() -> None:
    meta = TurnMeta()
    assert (meta.request_id, meta.retry_count, meta.agent_id) == ("", 0, None)
    assert (meta.side_request, meta.malformed_tool_calls, dict(meta.extra)) == (False, 0, {})
    assert (meta.started_at, meta.finished_at) == (0.0, 0.0)
