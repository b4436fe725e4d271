"""MoE routing through the tree: kept per call, assembled per sample, never invented.

The engine here returns routing as SGLang does: rows for positions ``[start, prompt + output -
1)`` of the call, from the start the client asked for (where the branch's earlier calls stopped).
Each expert id is a pure function of the token at that position, the position, the layer and the
slot, so every row of every sample can be checked against the tokens the sample holds.
"""

from __future__ import annotations

import dataclasses
from array import array
from collections.abc import Sequence

import pytest
from session_kit import ChatFormat, Pending, Session, call, prompt, reply, system, tool_result, user

from trajectory_tree import (
    Completion,
    FinishReason,
    FormatError,
    InvalidTurn,
    LengthLimit,
    Message,
    RoutedExperts,
    Sample,
    TrajectoryError,
    dump_routing,
    dumps,
    linearize,
    loads,
)

LAYERS, TOPK, EXPERTS = 3, 2, 16


def expert(token: int, position: int, layer: int, slot: int) -> int:
    return (token * 31 + position * 7 + layer * 3 + slot) % EXPERTS


def rows_for(ids: Sequence[int], start: int, end: int) -> array[int]:
    return array(
        "i",
        [
            expert(ids[p], p, layer, slot)
            for p in range(start, end)
            for layer in range(LAYERS)
            for slot in range(TOPK)
        ],
    )


def routed(s: Session, pending: Pending, *, start: int | None = None) -> Pending:
    """The call's routing as the engine returns it, from the start the adapter asks for."""
    sequence = pending.call.input_ids + pending.call.output_ids
    asked = s.tree.routing_start(pending.route, pending.prompt)
    first = asked if start is None else start
    routing = RoutedExperts(first, LAYERS, TOPK, rows_for(sequence, first, len(sequence) - 1))
    completion = dataclasses.replace(pending.completion, routed_experts=routing)
    return dataclasses.replace(pending, completion=completion)


def check_rows(sample: Sample) -> None:
    assert sample.routing is not None
    assert sample.routing.rows == len(sample.tokens) - 1
    expected = rows_for(sample.tokens, 0, len(sample.tokens) - 1)
    row = LAYERS * TOPK
    for a, b in sample.routing.gaps:
        expected[a * row : b * row] = array("i", bytes(4 * (b - a) * row))
    assert sample.routing.experts == expected


def task() -> list[Message]:
    return [system("You are a coding agent."), user("Fix the failing test.")]


def test_each_call_asks_only_for_new_rows_and_samples_are_complete() -> None:
    s = Session()
    history = task()
    starts = []
    for i in range(3):
        answer = reply(f"step {i}", call(f"c{i}", "bash", {"cmd": f"ls {i}"}))
        pending = routed(s, s.start(prompt(*history), answer))
        assert pending.completion.routed_experts is not None
        starts.append(pending.completion.routed_experts.start)
        turn = s.finish(pending)
        history += [answer, tool_result(f"c{i}", f"file{i}.py")]
        assert s.tree.routed_prefix(s.tree.node(turn.node)) == turn.prompt_length + (
            turn.output_length - 1
        )
    # The first call starts at 0; each later one where the previous one's rows stopped: the
    # position of its last output token, which no forward pass had read until this call.
    turns = s.tree.turns
    assert starts == [0] + [t.prompt_length + t.output_length - 1 for t in turns[:-1]]
    (sample,) = linearize(s.tree).samples
    assert sample.routing is not None
    assert sample.routing.complete
    check_rows(sample)


def test_sub_agent_and_compaction_branches_each_get_their_own_rows() -> None:
    s = Session()
    main = task()
    first = reply("delegating", call("a1", "Agent", {"prompt": "find the bug"}))
    s.finish(routed(s, s.start(prompt(*main), first)))
    sub = [system("You are a sub-agent."), user("find the bug")]
    sub_answer = reply("found it in parser.py")
    s.finish(routed(s, s.start(prompt(*sub), sub_answer)))
    main += [first, tool_result("a1", "found it in parser.py")]
    s.finish(routed(s, s.start(prompt(*main), reply("fixing"))))
    compacted = [system("You are a coding agent."), user("Summary so far: fixing parser.py")]
    s.finish(routed(s, s.start(prompt(*compacted), reply("continuing"))))
    samples = linearize(s.tree).samples
    assert len(samples) == 3
    for sample in samples:
        assert sample.routing is not None
        assert sample.routing.complete, sample.routing
        check_rows(sample)


def test_a_rerendered_prompt_starts_over_at_zero() -> None:
    s = Session()
    history = task()
    answer = reply("one", call("c1", "bash", {"cmd": "ls"}), reasoning="look first")
    s.finish(routed(s, s.start(prompt(*history), answer)))
    history += [answer, tool_result("c1", "a.py")]
    s.fmt = ChatFormat(strip_history_reasoning=True)  # the history renders differently now
    pending = routed(s, s.start(prompt(*history), reply("two"), full="template changed"))
    assert pending.completion.routed_experts is not None
    assert pending.completion.routed_experts.start == 0
    assert s.finish(pending).rerendered is not None
    assert len(linearize(s.tree).samples) == 2
    for sample in linearize(s.tree).samples:
        check_rows(sample)
        assert sample.routing is not None
        assert sample.routing.complete


def test_positions_no_call_returned_are_named_not_invented() -> None:
    s = Session()
    history = task()
    answer = reply("one", call("c1", "bash", {"cmd": "ls"}))
    s.finish(s.start(prompt(*history), answer))  # recorded without routing
    history += [answer, tool_result("c1", "a.py")]
    pending = s.start(prompt(*history), reply("two"))
    late = len(pending.call.input_ids) - 5  # the engine left out a cached prefix
    s.finish(routed(s, pending, start=late))
    (sample,) = linearize(s.tree).samples
    assert sample.routing is not None
    assert sample.routing.gaps == ((0, late),)
    assert sample.routing.missing_rows == late
    assert not sample.routing.complete
    check_rows(sample)  # zeros in the gap, the engine's rows elsewhere


@pytest.mark.parametrize("skipped", [1, 5])
def test_the_routed_prefix_stops_at_the_first_gap(skipped: int) -> None:
    s = Session()
    history = task()
    answer = reply("one", call("c1", "bash", {"cmd": "ls"}))
    first = s.finish(routed(s, s.start(prompt(*history), answer)))
    covered = first.prompt_length + first.output_length - 1
    history += [answer, tool_result("c1", "a.py")]
    second = s.finish(routed(s, s.start(prompt(*history), reply("two")), start=covered + skipped))
    assert s.tree.routed_prefix(s.tree.node(second.node)) == covered
    (sample,) = linearize(s.tree).samples
    assert sample.routing is not None
    assert sample.routing.gaps == ((covered, covered + skipped),)


def test_without_routing_a_sample_has_none() -> None:
    s = Session()
    s.turn(prompt(*task()), reply("done"))
    (sample,) = linearize(s.tree).samples
    assert sample.routing is None


def test_the_call_that_computed_a_position_wins_over_a_later_one() -> None:
    s = Session()
    history = task()
    answer = reply("one", call("c1", "bash", {"cmd": "ls"}))
    s.finish(routed(s, s.start(prompt(*history), answer)))
    history += [answer, tool_result("c1", "a.py")]
    pending = s.start(prompt(*history), reply("two"))
    sequence = pending.call.input_ids + pending.call.output_ids
    # A call that returned every row again, with different experts (say, after a weight
    # update): positions the first call computed keep the first call's rows.
    other = array("i", [(e + 1) % EXPERTS for e in rows_for(sequence, 0, len(sequence) - 1)])
    completion = dataclasses.replace(
        pending.completion, routed_experts=RoutedExperts(0, LAYERS, TOPK, other)
    )
    s.finish(dataclasses.replace(pending, completion=completion))
    (sample,) = linearize(s.tree).samples
    first = s.tree.turns[0]
    covered = first.prompt_length + first.output_length - 1
    row = LAYERS * TOPK
    assert sample.routing is not None
    assert sample.routing.experts[: covered * row] == rows_for(sample.tokens, 0, covered)
    assert sample.routing.experts[covered * row :] == other[covered * row :]


@pytest.mark.parametrize(
    ("start", "extra_rows", "message"),
    [
        (None, 1, "past the"),  # a row for the last token, which no call computes
        ("past_prompt", 0, "past the prompt"),
    ],
)
def test_routing_that_does_not_fit_its_call_is_refused(
    start: str | None, extra_rows: int, message: str
) -> None:
    s = Session()
    pending = s.start(prompt(*task()), reply("done"))
    sequence = pending.call.input_ids + pending.call.output_ids
    first = len(pending.call.input_ids) + 1 if start == "past_prompt" else 0
    rows = rows_for([*sequence, 0], first, len(sequence) - 1 + extra_rows)
    completion = dataclasses.replace(
        pending.completion, routed_experts=RoutedExperts(first, LAYERS, TOPK, rows)
    )
    with pytest.raises(InvalidTurn, match=message):
        s.finish(dataclasses.replace(pending, completion=completion))
    assert s.tree.turns == []
    assert len(s.tree.nodes) == 0


def test_routed_experts_are_whole_non_negative_int32_rows() -> None:
    with pytest.raises(InvalidTurn, match="whole rows"):
        RoutedExperts(0, LAYERS, TOPK, array("i", [1] * (LAYERS * TOPK + 1)))
    with pytest.raises(InvalidTurn, match="negative"):
        RoutedExperts(0, LAYERS, TOPK, array("i", [-1] * (LAYERS * TOPK)))
    with pytest.raises(InvalidTurn, match="int32"):
        RoutedExperts(0, LAYERS, TOPK, array("q", [1] * (LAYERS * TOPK)))
    with pytest.raises(InvalidTurn, match="layers and topk"):
        RoutedExperts(0, 0, TOPK, array("i"))


def test_one_branch_with_two_routing_shapes_is_refused() -> None:
    s = Session()
    history = task()
    answer = reply("one", call("c1", "bash", {"cmd": "ls"}))
    s.finish(routed(s, s.start(prompt(*history), answer)))
    history += [answer, tool_result("c1", "a.py")]
    pending = s.start(prompt(*history), reply("two"))
    sequence = pending.call.input_ids + pending.call.output_ids
    start = s.tree.routed_prefix(pending.route.anchor)
    wide = array("i", [1] * ((len(sequence) - 1 - start) * (LAYERS + 1) * TOPK))
    completion = dataclasses.replace(
        pending.completion, routed_experts=RoutedExperts(start, LAYERS + 1, TOPK, wide)
    )
    s.finish(dataclasses.replace(pending, completion=completion))
    with pytest.raises(TrajectoryError, match="3x2 and 4x2"):
        linearize(s.tree)


def routed_session() -> Session:
    s = Session()
    history = task()
    for i in range(3):
        answer = reply(f"step {i}", call(f"c{i}", "bash", {"cmd": f"ls {i}"}))
        s.finish(routed(s, s.start(prompt(*history), answer)))
        history += [answer, tool_result(f"c{i}", f"file{i}.py")]
    return s


def test_routing_round_trips_through_its_sidecar() -> None:
    s = routed_session()
    text, sidecar = dumps(s.tree), dump_routing(s.tree)
    assert len(sidecar) == 4 * sum(
        len(t.routed_experts.experts) for t in s.tree.turns if t.routed_experts is not None
    )
    assert '"sha256"' in text
    assert "routed_experts" not in text
    back = loads(text, routing=sidecar)
    assert [t.routed_experts for t in back.turns] == [t.routed_experts for t in s.tree.turns]
    (before,), (after,) = linearize(s.tree).samples, linearize(back).samples
    assert after.routing == before.routing
    # Read without its sidecar, the tree has no routing: nothing is made up.
    (bare,) = linearize(loads(text)).samples
    assert bare.routing is None


@pytest.mark.parametrize("damage", ["flipped", "truncated", "other_session"])
def test_a_sidecar_that_is_not_the_one_written_is_refused(damage: str) -> None:
    s = routed_session()
    text, sidecar = dumps(s.tree), dump_routing(s.tree)
    if damage == "flipped":
        broken = bytearray(sidecar)
        broken[len(broken) // 2] ^= 1
        sidecar = bytes(broken)
    elif damage == "truncated":
        sidecar = sidecar[:-4]
    else:
        other = Session()
        other.finish(routed(other, other.start(prompt(*task()), reply("other"))))
        sidecar = dump_routing(other.tree)
    with pytest.raises(FormatError, match="routing sidecar"):
        loads(text, routing=sidecar)


def test_truncation_keeps_the_routing_of_the_kept_tokens() -> None:
    s = routed_session()
    (full,) = linearize(s.tree).samples
    cut = len(full.tokens) - 7
    (sample,) = linearize(s.tree, limit=LengthLimit(cut)).samples
    assert sample.truncated
    assert len(sample.tokens) == cut
    assert sample.routing is not None
    assert sample.routing.rows == cut - 1
    check_rows(sample)


# -- weight versions ------------------------------------------------------------------------------


def completion(runs: tuple[tuple[int, str], ...], version: str | None, n: int = 6) -> Completion:
    return Completion([1] * n, [-0.5] * n, FinishReason.STOP, version, runs)


@pytest.mark.parametrize(
    ("runs", "version", "message"),
    [
        (((1, "1"),), "1", "starts at token 1"),
        (((0, "1"), (3, "2"), (2, "3")), "3", "out of order"),
        (((0, "1"), (6, "2")), "2", "past the end"),
        (((0, "1"), (3, "1")), "1", "consecutive"),
        (((0, "1"), (3, "2")), "1", "finished on '1'"),
    ],
)
def test_version_runs_must_describe_the_output(
    runs: tuple[tuple[int, str], ...], version: str, message: str
) -> None:
    with pytest.raises(InvalidTurn, match=message):
        completion(runs, version)


def test_a_call_resumed_after_a_weight_update_spans_two_versions() -> None:
    s = Session()
    pending = s.start(prompt(*task()), reply("a reply long enough to span an update"))
    n = len(pending.completion.output_ids)
    spanning = dataclasses.replace(
        pending.completion, weight_version="4", version_runs=((0, "3"), (5, "4"))
    )
    turn = s.finish(dataclasses.replace(pending, completion=spanning))
    assert turn.token_versions() == ((0, 5, "3"), (5, n, "4"))
    assert turn.versions == ("3", "4")
    back = loads(dumps(s.tree))
    assert back.turns[0].version_runs == ((0, "3"), (5, "4"))
    single = Session()
    plain = single.turn(prompt(*task()), reply("done"))
    assert plain.token_versions() == ((0, plain.output_length, None),)
