"""JSON round trip of whole trees, and malformed documents refused with FormatError."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Callable
from typing import Any

import pytest
from invariants import check_session
from session_kit import (
    TOOLS_B,
    ChatFormat,
    ScriptedEngine,
    Session,
    call,
    prompt,
    reply,
    reserialized,
    system,
    tool_result,
    user,
)

from trajectory_tree import (
    BridgedPrompt,
    Completion,
    FinishReason,
    FormatError,
    LengthLimit,
    LossReason,
    Media,
    Message,
    Prompt,
    Reasoning,
    Route,
    Segment,
    SessionTree,
    Text,
    ToolCall,
    TurnMeta,
    dumps,
    linearize,
    loads,
    message_to_dict,
    tree_from_dict,
    tree_to_dict,
)

SYS = system("agent")
TASK = Message("user", (Text("fix this"), Media("image/png", "aGVsbG8=")))
THINK = reply("run", call("c1", "bash", {"cmd": "make", "j": 2}), reasoning="hm", signature="sg")
AFTER = [SYS, TASK, reserialized(THINK), tool_result("c1", "boom", error=True)]


def busy_session() -> tuple[Session, list[Prompt]]:
    """Every kind of node and turn; returns the session and prompts to route afterwards."""
    s = Session(fmt=ChatFormat(strip_history_reasoning=True))
    meta = TurnMeta("r0", 1, 1.5, 2.5, "main", False, 1, {"k": "v"})
    s.turn(prompt(SYS, TASK, enable_thinking="true"), THINK, meta=meta)
    s.turn(prompt(*AFTER, enable_thinking="true"), reply("again"), full="drops reasoning")
    s.turn(prompt(*AFTER, enable_thinking="true"), reply("retry"))
    s.turn(prompt(system("sub"), user("look"), tools=TOOLS_B), reply("sub"))
    s.turn(prompt(user("title"), tools=()), reply("T"), meta=TurnMeta(side_request=True))
    s.turn(prompt(SYS, user("x")), reply("ab"), output=[1, 2], finish=FinishReason.ABORT)
    s.turn(prompt(SYS, user("y")), reply(), output=[])
    s.turn(prompt(SYS, user("z")), reply("cut"), output=[*b"cu"], finish=FinishReason.LENGTH)
    probes = [
        prompt(*AFTER, enable_thinking="true"),
        prompt(*AFTER, reply("retry"), user("go"), enable_thinking="true"),
        prompt(SYS, TASK, THINK, user("other"), enable_thinking="true"),
        prompt(system("sub"), user("look"), reply("sub"), user("more"), tools=TOOLS_B),
        prompt(SYS, user("z"), reply("cut"), user("on")),
        prompt(user("never seen"), tools=()),
    ]
    return s, probes


def where(route: Route) -> tuple[int, int, int, list[int], list[int]]:
    return (
        route.anchor.id,
        route.matched,
        route.prefix_length,
        route.prefix_ids().tolist(),
        [t.id for t in route.recorded],
    )


def test_text_that_is_not_unicode_still_serializes_and_round_trips() -> None:
    """A lone surrogate (JSON ``"\\ud800"`` from a client) anywhere in a tree: the document is
    still valid UTF-8 and reads back to the very same strings."""
    lone = "bad \ud800 text"
    s = Session()
    task = user(f"task {lone}")
    meta = TurnMeta("r0", extra={"x-claude-code-session-id": lone})
    answer = reply(lone, call(f"id-{lone}", "bash", {"cmd": lone}), reasoning=lone)
    s.turn(prompt(system(lone), task), answer, meta=meta)
    text = dumps(s.tree)
    text.encode("utf-8")  # what writing it to a file or an HTTP body does
    again = loads(text)
    assert again.turns[0].reply == s.tree.turns[0].reply
    assert again.turns[0].meta.extra == meta.extra
    assert again.request_messages(again.turns[0]) == s.tree.request_messages(s.tree.turns[0])
    assert [x.tokens for x in linearize(again).samples] == [
        x.tokens for x in linearize(s.tree).samples
    ]


def test_valid_unicode_is_written_as_itself() -> None:
    s = Session()
    s.turn(prompt(system("agent"), user("naïve 猫")), reply("ok"))
    text = dumps(s.tree)
    assert "naïve 猫" in text
    assert loads(text).request_messages(s.tree.turns[0])[1].plain_text == "naïve 猫"


def test_round_trip_is_exact() -> None:
    s, _ = busy_session()
    text = dumps(s.tree)
    again = loads(text)
    assert dumps(again) == text
    assert tree_to_dict(tree_from_dict(json.loads(text))) == json.loads(text)
    assert again.session_id == s.tree.session_id
    assert list(again.turns) == list(s.tree.turns)
    for turn in s.tree.turns:
        assert again.prompt_ids(turn).tolist() == s.tree.prompt_ids(turn).tolist()
    first = again.turns[0]
    assert first.reply.reasoning[0].signature == "sg"
    assert first.meta.extra == {"k": "v"}


def test_a_snapshot_is_the_tree_then_and_stays_so() -> None:
    """A snapshot serializes, routes and linearizes as the tree did when it was taken, and the
    session recording more turns (a retry touches an old branch, a new turn adds nodes and a
    child to an existing one) changes nothing in it."""
    s, probes = busy_session()
    before = dumps(s.tree)
    snapshot = s.tree.snapshot()
    assert dumps(snapshot) == before
    assert linearize(snapshot) == linearize(s.tree)
    routes = [where(s.tree.route(probe)) for probe in probes]
    assert [where(snapshot.route(probe)) for probe in probes] == routes
    s.turn(prompt(*AFTER, enable_thinking="true"), reply("third try"))
    s.turn(prompt(SYS, user("z"), reply("cut"), user("on")), reply("more"))
    assert dumps(s.tree) != before
    assert dumps(snapshot) == before
    assert [where(snapshot.route(probe)) for probe in probes] == routes
    assert len(snapshot.nodes) < len(s.tree.nodes)


@pytest.mark.parametrize("limit", [None, LengthLimit(40)])
def test_round_trip_gives_identical_samples(limit: LengthLimit | None) -> None:
    s, _ = busy_session()
    again = loads(dumps(s.tree))
    assert linearize(again, limit=limit) == check_session(s, limit=limit)


def test_round_trip_gives_identical_routing() -> None:
    s, probes = busy_session()
    again = loads(dumps(s.tree))
    for probe in probes[:-1]:
        assert where(again.route(probe)) == where(s.tree.route(probe))
    unseen = probes[-1]
    assert again.route(unseen).matched == s.tree.route(unseen).matched == 0


@pytest.mark.parametrize("copy_of", [lambda t: loads(dumps(t)), SessionTree.snapshot])
def test_a_loaded_or_snapshotted_tree_keeps_recording_like_the_original(
    copy_of: Callable[[SessionTree], SessionTree],
) -> None:
    """Recording goes on in the copy as in the tree: a retry and a continuation are the most
    recent lineages (the recency clock carries on), and the same nodes and turns are added."""
    s, probes = busy_session()
    loaded = Session(tree=copy_of(s.tree), fmt=s.fmt, calls=dict(s.calls))
    for session in (s, loaded):
        session.engine = ScriptedEngine(seed=7)
        session.turn(probes[1], reply("continued"))
        session.turn(probes[0], reply("yet another retry"))
    assert dumps(loaded.tree) == dumps(s.tree)
    assert linearize(loaded.tree) == check_session(s)


def test_a_node_read_without_a_message_matches_no_message() -> None:
    """A document may hold a node below a root without a message (edited by hand, or written
    by a later version): routing never walks through it, whatever the request says."""
    s = Session()
    s.turn(prompt(SYS, user("a")), reply("x"))
    doc = tree_to_dict(s.tree)
    assert doc["nodes"][1]["message"] == message_to_dict(SYS)
    del doc["nodes"][1]["message"]
    tree = tree_from_dict(doc)
    assert tree.route(prompt(SYS, user("a"))).matched == 0
    assert s.tree.route(prompt(SYS, user("a"))).matched == 2


def test_a_retry_and_the_answer_it_retried_read_without_stamps_route_to_the_first() -> None:
    """A document without recency stamps (written by hand, or by another writer) says only in
    which order a retry and the answer it retried were recorded: the first is the lineage a
    follow-up continues, as the equally recent siblings' order is all routing has to go by."""
    s = Session()
    answer = reply("same text")
    s.turn(prompt(SYS, TASK), answer)
    s.turn(prompt(SYS, TASK), answer, output=[*b"same", *b" text", 257, 257])
    follow = prompt(SYS, TASK, answer, user("go on"))
    assert s.tree.route(follow).previous_generated is s.tree.turns[1]  # stamped: the retry
    doc = tree_to_dict(s.tree)
    for node in doc["nodes"]:
        del node["touched"]
    routed = tree_from_dict(doc).route(follow).previous_generated
    assert routed is not None
    assert routed.id == 0


def test_every_message_field_survives_a_round_trip() -> None:
    """Names, call ids, error flags, media, reasoning signatures and encrypted reasoning read
    back as recorded (signatures take no part in equality, so they are compared apart); a field
    a message does not have is not written."""
    s = Session()
    thought = Message(
        "assistant",
        (Reasoning("look", "sig", "enc"), ToolCall("c1", "bash", '{"cmd": "ls"}')),
    )
    result = dataclasses.replace(tool_result("c1", "no such file", error=True), name="bash")
    history = [SYS, TASK, thought, result]
    s.turn(prompt(SYS, TASK), thought)
    s.turn(prompt(*history), reply("done"))
    again = loads(dumps(s.tree))
    read = again.request_messages(again.turns[1])
    assert read == history
    assert [(m.name, m.tool_call_id, m.is_error) for m in read] == [
        (None, None, False),
        (None, None, False),
        (None, None, False),
        ("bash", "c1", True),
    ]
    reasoning = read[2].reasoning[0]
    assert (reasoning.signature, reasoning.encrypted) == ("sig", "enc")
    assert message_to_dict(SYS) == {
        "role": "system",
        "content": [{"type": "text", "text": "agent"}],
    }


def test_an_unknown_block_type_is_named_in_the_error() -> None:
    doc = _doc()
    MUTATIONS["unknown-block"](doc)
    with pytest.raises(FormatError) as refused:
        tree_from_dict(doc)
    assert str(refused.value) == "unknown block type 'video'"


def test_round_trip_keeps_logprobs_rounded_above_zero() -> None:
    """Engines may return +1e-7 for a certain token; a tree that recorded it must load."""
    tree = SessionTree("rounding")
    route = tree.route(prompt(user("x")))
    completion = Completion([1, 2], [1e-7, -0.0], FinishReason.STOP)
    tree.record(
        route, BridgedPrompt([Segment(LossReason.CONTEXT, [5])], [6]), completion, reply("a")
    )
    again = loads(dumps(tree))
    assert again.turns[0].output_logprobs.tolist() == [1e-7, -0.0]


def test_round_trip_of_an_empty_tree() -> None:
    tree = SessionTree("empty")
    assert dumps(loads(dumps(tree))) == dumps(tree)


# -- malformed documents -----------------------------------------------------------------------


def _doc() -> dict[str, Any]:
    s, _ = busy_session()
    return tree_to_dict(s.tree)


def _generated(doc: dict[str, Any]) -> dict[str, Any]:
    return next(n for n in doc["nodes"] if "turn" in n and n["turn"]["output_length"])


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """A mutation of the first generated node: ``path`` like ``turn.meta.extra``."""

    def mutate(doc: dict[str, Any]) -> None:
        target = _generated(doc)
        *parents, last = path.split(".")
        for key in parents:
            target = target[key]
        target[last] = value

    return mutate


MUTATIONS: dict[str, Callable[[dict[str, Any]], None]] = {
    "format": lambda d: d.update(format="trajectory-tree/0"),
    "no-nodes": lambda d: d.pop("nodes"),
    "nodes-not-a-list": lambda d: d.update(nodes=7),
    "node-not-an-object": lambda d: d["nodes"].append(3),
    "forward-parent": lambda d: d["nodes"][1].update(parent=5),
    "self-parent": lambda d: d["nodes"][1].update(parent=1),
    "negative-parent": lambda d: d["nodes"][2].update(parent=-1),
    "unknown-block": _set("message.content", [{"type": "video"}]),
    "block-not-an-object": _set("message.content", ["text"]),
    "unknown-role": _set("message.role", "robot"),
    "tool-message-without-call-id": _set("message.role", "tool"),
    "unknown-span-reason": _set("spans", [["vibes", 1]]),
    "spans-short-of-tokens": lambda d: _generated(d)["spans"].pop(),
    "context-spans-short-of-tokens": lambda d: d["nodes"][2]["spans"].pop(),
    "token-beyond-int32": _set("tokens", [2**40]),
    "token-not-an-int": _set("tokens", ["a"]),
    "negative-token": lambda d: _generated(d)["tokens"].__setitem__(0, -1),
    "turn-without-message": lambda d: _generated(d).pop("message"),
    "turn-ids-out-of-order": _set("turn.id", 99),
    "output-longer-than-tokens": _set("turn.output_length", 10**6),
    "logprob-count": lambda d: _generated(d)["turn"]["output_logprobs"].append(-1.0),
    "unknown-finish-reason": _set("turn.finish_reason", "cancelled"),
    "positive-logprob": lambda d: _generated(d)["turn"]["output_logprobs"].__setitem__(0, 0.5),
    "generated-span-without-turn": lambda d: d["nodes"][2].update(
        spans=[["generated", len(d["nodes"][2]["tokens"])]]
    ),
    "meta-not-an-object": _set("turn.meta", 5),
    "tools-not-objects": lambda d: d["nodes"][0].update(tools=[1]),
    "prompt-length-disagrees-with-path": _set("turn.prompt_length", 3),
    "generated-span-disagrees-with-output": lambda d: _generated(d).update(
        spans=[["template_scaffold", len(_generated(d)["tokens"])]]
    ),
    "generated-span-not-last": lambda d: _generated(d)["spans"].reverse(),
    "output-not-at-the-end": lambda d: _generated(d).update(
        spans=[
            ["template_scaffold", _generated(d)["spans"][0][1] - 1],
            _generated(d)["spans"][1],
            ["template_scaffold", 1],
        ]
    ),
    "generated-span-split": lambda d: _generated(d).update(
        spans=[
            ["template_scaffold", _generated(d)["spans"][0][1]],
            ["generated", 1],
            ["generated", _generated(d)["spans"][1][1] - 1],
        ]
    ),
}


@pytest.mark.parametrize("case", sorted(MUTATIONS))
def test_malformed_documents_raise_format_error(case: str) -> None:
    doc = copy.deepcopy(_doc())
    MUTATIONS[case](doc)
    with pytest.raises(FormatError):
        tree_from_dict(doc)
    with pytest.raises(FormatError):
        loads(json.dumps(doc))


@pytest.mark.parametrize(
    "text",
    ["", "not json", "[1, 2]", '"a tree"', "null", "[" * 100_000 + "]" * 100_000],
    ids=["empty", "garbage", "array", "string", "null", "deeply-nested"],
)
def test_non_documents_raise_format_error(text: str) -> None:
    with pytest.raises(FormatError):
        loads(text)


@pytest.mark.parametrize(("parent", "index"), [(5, 1), (1, 1), (-1, 2)])
def test_a_parent_that_does_not_precede_its_node_is_named(parent: int, index: int) -> None:
    doc = _doc()
    doc["nodes"][index]["parent"] = parent
    with pytest.raises(FormatError) as refused:
        tree_from_dict(doc)
    assert str(refused.value) == f"node {index} names parent {parent}, which does not precede it"


def test_turn_metadata_left_out_of_a_document_reads_as_the_defaults() -> None:
    """A document may carry a turn without its ``meta`` (a writer that had none): the turn
    reads back as a first attempt of the policy's own work, trained like any other."""
    s = Session()
    s.turn(prompt(SYS, TASK), reply("a"))
    doc = tree_to_dict(s.tree)
    del doc["nodes"][-1]["turn"]["meta"]
    tree = tree_from_dict(doc)
    assert tree.turns[0].meta == TurnMeta()
    assert [x.trained_turns for x in linearize(tree).samples] == [(0,)]


def test_a_turn_with_an_empty_generation_prompt_round_trips() -> None:
    """A template may append nothing before the reply (a raw completion): the reply's node
    holds the output alone, and the document reads back."""
    tree = SessionTree("bare")
    route = tree.route(prompt(user("x")))
    completion = Completion([7, 8], [-0.5, -0.25], FinishReason.STOP)
    prompt_ids = BridgedPrompt([Segment(LossReason.CONTEXT, [5, 6])], [])
    turn = tree.record(route, prompt_ids, completion, reply("a"))
    again = loads(dumps(tree))
    assert again.output_ids(again.turns[0]).tolist() == [7, 8]
    assert again.prompt_ids(again.turns[0]).tolist() == tree.prompt_ids(turn).tolist() == [5, 6]
