"""Branching: sub-agents, compactions, edited histories and tool-result order become leaves."""

from __future__ import annotations

from invariants import check_session
from session_kit import (
    TOOLS_A,
    TOOLS_B,
    Session,
    call,
    prompt,
    reply,
    reserialized,
    system,
    tool_result,
    user,
)

from trajectory_tree import LossReason, Message, TurnMeta

SYS = system("You are the main agent.")
TASK = user("Fix the bug in parser.py")


def run_main(s: Session, turns: int, *, echo: bool = False) -> list[Message]:
    """``turns`` main-agent turns, each calling a tool; returns the conversation so far."""
    history = [SYS, TASK]
    for i in range(turns):
        answer = reply(f"step {i}", call(f"m{i}", "bash", {"cmd": f"run {i}", "n": i}))
        s.turn(prompt(*history), answer)
        history += [reserialized(answer) if echo else answer, tool_result(f"m{i}", f"out {i}")]
    return history


def leaves(s: Session) -> int:
    return sum(1 for _ in s.tree.leaves())


def test_a_linear_session_is_one_sample_training_every_turn() -> None:
    s = Session()
    run_main(s, 4)
    lin = check_session(s)
    assert len(lin.samples) == 1
    assert lin.samples[0].trained_turns == (0, 1, 2, 3)
    assert lin.exclusions == ()
    # the response is everything from the first generated token on: the prompt of turn 0 is not
    sample = lin.samples[0]
    assert sample.prompt_length == s.tree.turns[0].prompt_length
    assert sample.response_length == len(sample.tokens) - s.tree.turns[0].prompt_length


def test_reserialized_tool_arguments_do_not_branch() -> None:
    s = Session()
    history = run_main(s, 5, echo=True)
    s.turn(prompt(*history), reply("done"))
    assert leaves(s) == 1
    lin = check_session(s)
    assert [x.trained_turns for x in lin.samples] == [(0, 1, 2, 3, 4, 5)]


def test_sub_agent_with_its_own_system_prompt_is_a_new_branch() -> None:
    s = Session()
    history = run_main(s, 2)
    sub = [system("You are a sub-agent."), user("Find where tokens are parsed")]
    grep = reply("", call("s0", "bash", {"cmd": "grep -r token"}))
    s.turn(prompt(*sub), grep)
    s.turn(prompt(*sub, grep, tool_result("s0", "parser.py:12")), reply("In parser.py line 12."))
    handback = tool_result("m1", "[Subagent hand-back] In parser.py line 12.")
    s.turn(prompt(*history[:-1], handback), reply("Fixed."))
    assert len(s.tree.roots) == 1, "same tools: same context root"
    root = s.tree.roots[0]
    assert [c.message for c in root.children] == [SYS, sub[0]]
    lin = check_session(s)
    # One sample per leaf, in the order of their last turns.
    assert [x.trained_turns for x in lin.samples] == [(2, 3), (0, 1, 4)]
    sub_sample = lin.samples[0]
    assert sub_sample.tokens[: len(s.calls[2].input_ids)].tolist() == s.calls[2].input_ids


def test_sub_agent_with_fewer_tools_gets_its_own_context_root() -> None:
    s = Session()
    run_main(s, 1)
    s.turn(prompt(system("sub"), user("look"), tools=TOOLS_B), reply("looked"))
    assert len(s.tree.roots) == 2
    lin = check_session(s)
    assert len(lin.samples) == 2


def test_compaction_restarts_history_after_the_system_prompt() -> None:
    s = Session()
    history = run_main(s, 3)
    summarize = user("CRITICAL: Respond with TEXT ONLY. <summary>")
    summary = reply("<summary>We ran 3 steps.</summary>")
    s.turn(prompt(*history, summarize), summary)
    restarted = [SYS, user("This session is being continued. Summary: we ran 3 steps.")]
    route = s.tree.route(prompt(*restarted))
    assert route.matched == 0, "the system prompt alone was no token boundary"
    s.finish(s.start(route.prompt, reply("", call("k0", "bash", {"cmd": "pytest"}))))
    first = reply("", call("k0", "bash", {"cmd": "pytest"}))
    s.turn(prompt(*restarted, first, tool_result("k0", "1 passed")), reply("All green."))
    root = s.tree.roots[0]
    assert len(root.children) == 1, "both histories share the system prompt node"
    assert len(root.children[0].children) == 2
    lin = check_session(s)
    assert [x.trained_turns for x in lin.samples] == [(0, 1, 2, 3), (4, 5)]
    compacted = lin.samples[1]
    assert len(compacted.tokens) < len(lin.samples[0].tokens)


def test_edited_history_branches_and_never_trains_the_rendered_copy() -> None:
    s = Session()
    history = run_main(s, 2)
    edited = [SYS, user("Fix the bug in lexer.py"), *history[2:]]
    s.turn(prompt(*edited), reply("ok"))
    assert leaves(s) == 2
    lin = check_session(s)
    assert [x.trained_turns for x in lin.samples] == [(0, 1), (2,)]
    branch = lin.samples[1]
    copy = s.fmt.content(history[2])
    text = branch.tokens.tolist()
    start = next(i for i in range(len(text)) if text[i : i + len(copy)] == copy)
    span = next(sp for sp in branch.spans if sp.start <= start < sp.end)
    assert span.reason is LossReason.CONTEXT, "the client's copy of a reply is context"
    assert branch.trained_tokens == s.tree.turns[2].output_length


def test_parallel_tool_results_are_ordered_messages() -> None:
    """Results come back in completion order. The tree takes them as ordered messages: the order
    a client sent first is the path, and a request with another order is another path."""
    s = Session()
    both = reply("", call("a", "bash", {"cmd": "slow"}), call("b", "bash", {"cmd": "fast"}))
    s.turn(prompt(SYS, TASK), both)
    completion_order = [tool_result("b", "fast done"), tool_result("a", "slow done")]
    s.turn(prompt(SYS, TASK, both, *completion_order), reply("both ran"))
    again = prompt(SYS, TASK, both, *completion_order, reply("both ran"), user("and?"))
    s.turn(again, reply("nothing else"))
    assert leaves(s) == 1, "a client that keeps its order never branches"
    call_order = prompt(SYS, TASK, both, *reversed(completion_order))
    route = s.tree.route(call_order)
    assert route.previous_generated is s.tree.turns[0]
    s.finish(s.start(call_order, reply("other order")))
    assert leaves(s) == 2
    reply_node = s.tree.node(s.tree.turns[0].node)
    firsts = [c.message.tool_call_id for c in reply_node.children if c.message is not None]
    assert firsts == ["b", "a"]
    check_session(s)


def test_side_request_is_recorded_and_never_trained() -> None:
    s = Session()
    run_main(s, 1)
    title = s.turn(
        prompt(user("Write a 5-word title for: fix parser"), tools=()),
        reply("Fix the parser bug"),
        meta=TurnMeta(side_request=True),
    )
    lin = check_session(s)
    assert [x.trained_turns for x in lin.samples] == [(0,)]
    assert [(e.turn, e.reason) for e in lin.exclusions] == [(title.id, LossReason.SIDE_REQUEST)]


def test_client_written_assistant_message_is_context() -> None:
    """An assistant message the engine never produced (a prefill, a few-shot example)."""
    s = Session()
    shot = reply("Example answer.")
    s.turn(prompt(SYS, user("example"), shot, TASK), reply("real answer"))
    lin = check_session(s)
    reasons = [sp.reason for sp in lin.samples[0].spans]
    assert reasons.count(LossReason.GENERATED) == 1
    assert LossReason.CONTEXT in reasons
    assert s.tree.turns[0].prompt_length == len(
        s.fmt.full(prompt(SYS, user("example"), shot, TASK), "").ids
    )


def test_tools_of_a_turn_are_kept_with_its_context() -> None:
    s = Session()
    turn = s.turn(prompt(SYS, TASK, tools=TOOLS_A, enable_thinking="true"), reply("x"))
    context = s.tree.request_context(turn)
    assert tuple(context.tools) == TOOLS_A
    assert dict(context.options) == {"enable_thinking": "true"}
    assert s.tree.request_messages(turn) == [SYS, TASK]


def test_a_fork_sub_agent_never_takes_the_parent_turns_it_copies() -> None:
    """Claude Code's fork sub-agent (an Agent call with `subagent_type: "fork"`) starts from a
    copy of the parent's history, whose last reply it takes without its text, and finishes
    first. The parent's earlier turns, on the fork's path too, are still trained in its own
    sample: a reward per sample credits each agent with its own work, never the fork with the
    parent's."""
    s = Session()
    main = TurnMeta(agent_id=None)
    first = reply("Reading.", call("m0", "bash", {"cmd": "cat parser.py"}))
    s.turn(prompt(SYS, TASK), first, meta=main)
    history = [SYS, TASK, first, tool_result("m0", "def parse(): ...")]
    delegate = reply("I will delegate.", call("m1", "Agent", {"prompt": "look"}))
    s.turn(prompt(*history), delegate, meta=main)
    copied = Message("assistant", delegate.tool_calls)  # the text block left out
    fork = TurnMeta(agent_id="a0f1")
    s.turn(prompt(*history, copied, user("Look around.")), reply("Found it."), meta=fork)
    done = prompt(*history, delegate, tool_result("m1", "Found it."))
    s.turn(done, reply("Done."), meta=main)
    lin = check_session(s)
    by_leaf = {sample.leaf_turn: sample for sample in lin.samples}
    assert sorted(by_leaf) == [2, 3]

    def trained(leaf: int) -> set[int | None]:
        return {sp.turn for sp in by_leaf[leaf].spans if sp.reason is LossReason.GENERATED}

    assert trained(3) == {0, 1, 3}  # the main agent's sample: all of its own turns
    assert trained(2) == {2}  # the fork's: only its own


def test_the_request_of_a_turn_is_read_back_as_routed() -> None:
    """A turn's request: every message before its reply in order (routing-only nodes included;
    echoes as the replies were generated), without the reply itself or the context root."""
    s = Session()
    history = run_main(s, 2, echo=True)
    last = s.turn(prompt(*history), reply("done"))
    first, second = s.tree.turns[:2]
    assert s.tree.request_messages(first) == [SYS, TASK]
    assert s.tree.request_messages(last) == [
        SYS,
        TASK,
        first.reply,
        history[3],
        second.reply,
        history[5],
    ]
    assert history[2].key != first.reply.key, "the client's echo really differs"
