"""Failure paths: re-rendered prompts, empty and aborted outputs, and input the tree refuses."""

from __future__ import annotations

import dataclasses
import json
import math
from array import array
from collections.abc import Callable

import pytest
from invariants import check_session
from session_kit import (
    IM_END,
    ChatFormat,
    Session,
    call,
    prompt,
    reply,
    system,
    tool_result,
    user,
)

from trajectory_tree import (
    BridgedPrompt,
    Completion,
    FinishReason,
    ForeignRoute,
    FormatError,
    FullPrompt,
    InvalidTurn,
    LossReason,
    Message,
    Prompt,
    Segment,
    SessionTree,
    TrajectoryError,
    dumps,
    loads,
)

SYS = system("agent")
TASK = user("task")
THINKING = reply("Let me run it.", call("c1", "bash", {"cmd": "make"}), reasoning="make builds it")
AFTER = [SYS, TASK, THINKING, tool_result("c1", "built")]


def test_full_prompt_that_contradicts_the_path_starts_a_new_lineage() -> None:
    """A template that drops earlier reasoning (like Qwen3's) cannot extend the engine's ids."""
    s = Session(fmt=ChatFormat(strip_history_reasoning=True))
    s.turn(prompt(SYS, TASK), THINKING)
    second = s.turn(prompt(*AFTER), reply("", call("c2", "bash", {"cmd": "test"})), full="qwen3")
    assert second.rerendered == "qwen3"
    assert s.tree.route(prompt(*AFTER)).recorded == (second,)
    assert s.tree.prompt_ids(second).tolist() == list(s.fmt.full(prompt(*AFTER), "").ids)
    root = s.tree.roots[0]
    assert len(root.children) == 2, "the new lineage starts at the context root"
    lin = check_session(s)
    assert [x.trained_turns for x in lin.samples] == [(0,), (1,)]
    rerendered = lin.samples[1]
    assert [sp.reason for sp in rerendered.spans] == [
        LossReason.RERENDERED_HISTORY,
        LossReason.TEMPLATE_SCAFFOLD,
        LossReason.GENERATED,
    ]
    # Later bridged turns continue on the new lineage.
    third_prompt = prompt(*AFTER, s.tree.turns[1].reply, tool_result("c2", "ok"))
    route = s.tree.route(third_prompt)
    assert route.previous_generated is second
    third = s.finish(s.start(third_prompt, reply("done")))
    assert third.rerendered is None
    lin = check_session(s)
    assert [x.trained_turns for x in lin.samples] == [(0,), (1, 2)]


def test_full_prompt_that_extends_the_path_keeps_the_lineage() -> None:
    s = Session()
    s.turn(prompt(SYS, TASK), THINKING)
    second = s.turn(prompt(*AFTER), reply("ok"), full="no bridge for this template")
    assert second.rerendered is None
    assert s.tree.route(prompt(*AFTER, reply("ok"))).previous_generated is second
    lin = check_session(s)
    assert [x.trained_turns for x in lin.samples] == [(0, 1)]
    reasons = [sp.reason for sp in lin.samples[0].spans]
    assert LossReason.RERENDERED_HISTORY not in reasons
    assert reasons.count(LossReason.GENERATED) == 2


def test_full_prompt_for_a_replayed_request_on_an_equal_path() -> None:
    s = Session()
    s.turn(prompt(SYS, TASK), reply("a"))
    retry = s.turn(prompt(SYS, TASK), reply("b"), full="fallback")
    assert retry.rerendered is None
    assert s.tree.node(retry.node).parent is s.tree.node(s.tree.turns[0].node).parent
    check_session(s)


@dataclasses.dataclass(frozen=True)
class SkipsEmptySystem(ChatFormat):
    """A template that renders an empty system message as no text at all."""

    def message(self, message: Message, *, reasoning: bool = True) -> list[int]:
        if message.role == "system" and not message.content:
            return []
        return super().message(message, reasoning=reasoning)


def test_full_prompt_whose_new_messages_add_no_tokens_still_extends_the_path() -> None:
    """The full render's history is exactly the path's ids (the new message renders as
    nothing): it extends the path, so the message is attached there, holding no tokens, and
    nothing is re-rendered history."""
    s = Session(fmt=SkipsEmptySystem())
    s.turn(prompt(SYS, TASK), reply("a"))
    quiet = Message("system")
    route = s.tree.route(prompt(SYS, TASK, quiet))
    assert (route.matched, len(route.new_messages)) == (2, 1)
    second = s.turn(prompt(SYS, TASK, quiet), reply("b"), full="fallback")
    assert second.rerendered is None
    attached = s.tree.node(second.node).parent
    assert attached is not None
    assert (attached.message, attached.parent) == (quiet, route.anchor)
    assert attached.delta is not None, "a boundary: the prefix is known there"
    assert (len(attached.delta), attached.spans) == (0, ())
    lin = check_session(s)
    assert [x.trained_turns for x in lin.samples] == [(0,), (1,)]
    assert LossReason.RERENDERED_HISTORY not in lin.samples[1].masked_tokens()


def test_full_prompt_extending_a_cut_output_keeps_the_lineage() -> None:
    """Token-wise extension is what counts: the engine's cut output is a prefix of the
    template's rendering of the whole reply, so the rest of that rendering is context."""
    s = Session()
    cut = s.fmt.assistant_output(THINKING)[:10]
    s.turn(prompt(SYS, TASK), THINKING, output=cut, finish=FinishReason.LENGTH)
    turn = s.turn(prompt(*AFTER), reply("ok"), full="fallback")
    assert turn.rerendered is None
    lin = check_session(s)
    assert [x.trained_turns for x in lin.samples] == [(0, 1)]
    spans = lin.samples[0].spans
    first = next(i for i, sp in enumerate(spans) if sp.turn == 0)
    assert spans[first + 1].reason is LossReason.CONTEXT
    assert spans[first + 1].start == len(s.calls[0].input_ids) + 10


def test_length_cut_output_is_closed_by_the_scaffold_and_trained() -> None:
    s = Session()
    cut = s.fmt.assistant_output(THINKING)[:10]
    s.turn(prompt(SYS, TASK), THINKING, output=cut, finish=FinishReason.LENGTH)
    s.turn(prompt(*AFTER), reply("ok"))
    sent = s.calls[1].input_ids
    assert sent[len(s.calls[0].input_ids) + 10 :][:2] == [IM_END, ord("\n")]
    lin = check_session(s)
    assert [x.trained_turns for x in lin.samples] == [(0, 1)]


def test_empty_outputs_are_recorded_and_owe_nothing() -> None:
    s = Session()
    empty = s.turn(prompt(SYS, TASK), reply(), output=[])
    assert empty.output_length == 0
    lin = check_session(s)
    assert lin.samples == ()
    assert lin.exclusions == ()
    s.turn(prompt(SYS, TASK, reply(), user("again")), reply("now"))
    assert s.calls[1].input_ids[len(s.calls[0].input_ids) :][:2] == [IM_END, ord("\n")]
    lin = check_session(s)
    assert [x.trained_turns for x in lin.samples] == [(1,)]


def test_empty_output_leaf_behind_trained_turns() -> None:
    s = Session()
    s.turn(prompt(SYS, TASK), THINKING)
    s.turn(prompt(*AFTER), reply(), output=[])
    lin = check_session(s)
    assert [(x.leaf_turn, x.trained_turns) for x in lin.samples] == [(1, (0,))]


def test_aborted_turns_are_excluded() -> None:
    s = Session()
    s.turn(prompt(SYS, TASK), THINKING)
    partial = s.fmt.assistant_output(reply("half"))[:3]
    s.turn(prompt(*AFTER), reply("hal"), output=partial, finish=FinishReason.ABORT)
    lin = check_session(s)
    assert [(e.turn, e.reason, e.tokens) for e in lin.exclusions] == [(1, LossReason.ABORTED, 3)]


def test_an_episode_whose_last_turn_is_aborted_still_trains_its_earlier_turns() -> None:
    s = Session()
    history = [SYS, TASK]
    for i in range(3):
        answer = reply(f"{i}", call(f"c{i}", "bash", {"cmd": "x"}))
        s.turn(prompt(*history), answer)
        history += [answer, tool_result(f"c{i}", "ok")]
    s.turn(prompt(*history), reply("abo"), output=[*b"abo"], finish=FinishReason.ABORT)
    lin = check_session(s)
    assert len(lin.samples) == 1
    sample = lin.samples[0]
    assert (sample.leaf_turn, sample.trained_turns) == (3, (0, 1, 2))
    assert sample.spans[-1].reason is LossReason.ABORTED
    assert [e.reason for e in lin.exclusions] == [LossReason.ABORTED]


def test_aborted_retry_next_to_a_live_branch_is_not_trained() -> None:
    s = Session()
    s.turn(prompt(SYS, TASK), reply("a"))
    s.turn(prompt(SYS, TASK, reply("a"), user("b")), reply("ok"))
    s.turn(prompt(SYS, TASK), reply("x"), output=[1, 2], finish=FinishReason.ABORT)
    lin = check_session(s)
    assert [x.trained_turns for x in lin.samples] == [(0, 1)]


def test_ids_given_as_64_bit_arrays_are_recorded_as_given() -> None:
    """numpy-style int64 buffers (``array('q')``) are converted, not stored as they come: the
    tree's arrays are int32, and ids from either path read back exactly."""
    s = Session()
    wide = s.start(prompt(SYS, TASK), THINKING)
    assert isinstance(wide.prompt, BridgedPrompt)
    wide.prompt = BridgedPrompt(
        [Segment(g.reason, array("q", g.ids)) for g in wide.prompt.segments],
        array("q", wide.prompt.generation_prompt),
    )
    wide.completion = dataclasses.replace(
        wide.completion, output_ids=array("q", wide.completion.output_ids)
    )
    first = s.finish(wide)
    full = s.start(prompt(*AFTER), reply("ok"), full="fallback")
    assert isinstance(full.prompt, FullPrompt)
    full.prompt = dataclasses.replace(full.prompt, ids=array("q", full.prompt.ids))
    full.completion = dataclasses.replace(
        full.completion, output_ids=array("q", full.completion.output_ids)
    )
    second = s.finish(full)
    assert second.rerendered is None
    for turn in (first, second):
        assert s.tree.output_ids(turn).typecode == "i"
        assert s.tree.prompt_ids(turn).typecode == "i"
    lin = check_session(s)
    assert [x.trained_turns for x in lin.samples] == [(0, 1)]
    route = s.tree.route(prompt(*AFTER))
    wider = Completion(array("q", [2**40]), [-0.5], FinishReason.STOP)
    with pytest.raises(InvalidTurn, match="int32"):
        s.tree.record(route, s.fmt.bridge(route), wider, reply("x"))


# -- input the tree refuses --------------------------------------------------------------------


def _state(tree: SessionTree) -> tuple[str, int, int]:
    return dumps(tree), len(tree.nodes), len(tree.turns)


@pytest.fixture
def session() -> Session:
    s = Session()
    s.turn(prompt(SYS, TASK), THINKING)
    return s


def completion(ids: list[int], lps: list[float] | None = None) -> Completion:
    return Completion(ids, [-0.5] * len(ids) if lps is None else lps, FinishReason.STOP)


@pytest.mark.parametrize(
    ("ids", "logprobs"),
    [
        pytest.param([1, 2, 3], [-0.1, -0.2], id="count-mismatch"),
        pytest.param([1], [0.5], id="positive-logprob"),
        pytest.param([1], [math.nan], id="nan-logprob"),
        pytest.param([1], [math.inf], id="inf-logprob"),
        pytest.param([1], ["x"], id="non-number-logprob"),
    ],
)
def test_inconsistent_completions_are_refused(ids: list[int], logprobs: list[float]) -> None:
    with pytest.raises(InvalidTurn):
        Completion(ids, logprobs, FinishReason.STOP)


def test_rounding_above_zero_is_kept_as_returned() -> None:
    completion = Completion([7], [1e-7], FinishReason.STOP)
    assert completion.output_logprobs == [1e-7]


def test_rounding_is_tolerated_up_to_1e_4_and_no_further() -> None:
    """+1e-4 is the most low-precision log-softmax is allowed to round a certain token to: kept
    when recorded and when read back; the next float up is refused by both."""
    bound = 1e-4
    s = Session()
    s.turn(prompt(SYS, TASK), reply("a"))
    pending = s.start(prompt(SYS, TASK, reply("a"), user("b")), reply("c"), output=[7])
    pending.completion = Completion([7], [bound], FinishReason.STOP)
    s.finish(pending)
    again = loads(dumps(s.tree))
    assert again.turns[1].output_logprobs.tolist() == [bound]
    above = math.nextafter(bound, 1.0)
    with pytest.raises(InvalidTurn, match="not a log-probability"):
        Completion([7], [above], FinishReason.STOP)
    document = json.loads(dumps(s.tree))
    document["nodes"][-1]["turn"]["output_logprobs"] = [above]
    with pytest.raises(FormatError, match="log-probabilities"):
        loads(json.dumps(document))


def _refusals(s: Session) -> dict[str, Callable[[], object]]:
    tree = s.tree
    new = tree.route(prompt(*AFTER))
    same = tree.route(prompt(SYS, TASK))
    gen = s.fmt.generation_prompt()
    bridged = s.fmt.bridge(new)
    ok = completion([1, 2])
    answer = reply("x")
    return {
        "negative-output-id": lambda: tree.record(new, bridged, completion([1, -2]), answer),
        "output-id-beyond-int32": lambda: tree.record(new, bridged, completion([2**31]), answer),
        "negative-segment-id": lambda: tree.record(
            new, BridgedPrompt([Segment(LossReason.TOOL_OUTPUT, [5, -1])], gen), ok, answer
        ),
        "negative-generation-prompt-id": lambda: tree.record(
            new, BridgedPrompt(bridged.segments, [-3]), ok, answer
        ),
        "negative-full-prompt-id": lambda: tree.record(
            new, FullPrompt([1, -1, 2], 1, "x"), ok, answer
        ),
        "segments-without-new-messages": lambda: tree.record(
            same, BridgedPrompt([Segment(LossReason.CONTEXT, [1])], gen), ok, answer
        ),
        "non-assistant-reply": lambda: tree.record(new, bridged, ok, user("x")),
        "unknown-finish-reason": lambda: tree.record(
            new,
            bridged,
            Completion([1], [-1.0], "cancelled"),  # type: ignore[arg-type]
            answer,
        ),
        "full-prompt-without-messages": lambda: tree.record(
            tree.route(prompt()), FullPrompt([1, 2], 1, "x"), ok, answer
        ),
        "non-integer-ids": lambda: tree.record(new, bridged, completion(["a"]), answer),  # type: ignore[list-item]
    }


REFUSALS = [
    "negative-output-id",
    "output-id-beyond-int32",
    "negative-segment-id",
    "negative-generation-prompt-id",
    "negative-full-prompt-id",
    "segments-without-new-messages",
    "non-assistant-reply",
    "unknown-finish-reason",
    "full-prompt-without-messages",
    "non-integer-ids",
]


@pytest.mark.parametrize("case", REFUSALS)
def test_invalid_input_raises_and_leaves_the_tree_unchanged(session: Session, case: str) -> None:
    attempt = _refusals(session)[case]
    before = _state(session.tree)
    with pytest.raises(InvalidTurn) as info:
        attempt()
    assert str(info.value)
    assert _state(session.tree) == before
    check_session(session)


def test_route_from_another_tree_is_refused(session: Session) -> None:
    other = SessionTree("other")
    foreign = other.route(prompt(SYS, TASK))
    before = _state(session.tree)
    with pytest.raises(ForeignRoute) as info:
        session.tree.record(foreign, session.fmt.bridge(foreign), completion([1]), reply("x"))
    assert isinstance(info.value, TrajectoryError)
    assert _state(session.tree) == before
    assert len(other.turns) == 0


def test_prompt_building_blocks_refuse_nonsense() -> None:
    with pytest.raises(ValueError, match="not a reason for prompt tokens"):
        Segment(LossReason.GENERATED, [1])
    with pytest.raises(ValueError, match="generation_prompt_length"):
        FullPrompt([1, 2], 3, "x")
    with pytest.raises(ValueError, match="generation_prompt_length"):
        FullPrompt([1, 2], -1, "x")
    assert [FullPrompt([1, 2], n, "x").generation_prompt_length for n in (0, 2)] == [0, 2]
    with pytest.raises(ValueError, match="tool_call_id"):
        Message("tool", ())
    with pytest.raises(ValueError, match="unknown role"):
        Message("robot", ())  # type: ignore[arg-type]


def test_a_refused_first_turn_leaves_no_context_root() -> None:
    tree = SessionTree()
    route = tree.route(Prompt([Message.text("user", "hi")]))
    assert tree.nodes == []
    bad = BridgedPrompt([Segment(LossReason.CONTEXT, [1, -2])], [3])
    with pytest.raises(InvalidTurn):
        tree.record(
            route, bad, Completion([4], [-0.1], FinishReason.STOP), Message.text("assistant", "x")
        )
    assert tree.nodes == []
    assert tree.roots == []


def test_a_refused_turn_undoes_no_root_another_turn_registered_meanwhile() -> None:
    """Two first requests of a new context, routed before either is recorded: the first
    recorded registers the root; the second, refused, leaves that root and its turn alone (a
    refusal undoes only a root it registered itself), and once fixed it records under it."""
    tree = SessionTree()
    first = tree.route(Prompt([Message.text("user", "hi")]))
    second = tree.route(Prompt([Message.text("user", "hello")]))
    tree.record(
        first, BridgedPrompt([Segment(LossReason.CONTEXT, [1])], [3]), completion([4]), reply("x")
    )
    before = _state(tree)
    bad = BridgedPrompt([Segment(LossReason.CONTEXT, [5, -2])], [3])
    with pytest.raises(InvalidTurn):
        tree.record(second, bad, completion([6]), reply("y"))
    assert _state(tree) == before
    good = BridgedPrompt([Segment(LossReason.CONTEXT, [5])], [3])
    turn = tree.record(second, good, completion([6]), reply("y"))
    assert len(tree.roots) == 1
    assert tree.node(turn.node).path()[0] is tree.roots[0]
