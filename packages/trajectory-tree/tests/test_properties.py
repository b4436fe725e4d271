"""Property-based: random sessions, every invariant checked after linearize().

A session is a random interleaving of clients (main agents, sub-agents with their own system
prompts or tools, forks that continue an earlier interior point, edited histories, compaction
restarts), each waiting for its own answer before its next request, as real agent loops do.
Answers are echoed back verbatim, re-serialized or without reasoning; some are empty, cut by the
length limit, aborted, or not what the template would render; some prompts are full re-renders
(with a template that may drop earlier reasoning); some requests are retried.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st
from invariants import check_linearization, check_recorded, check_session
from session_kit import (
    TOOLS_A,
    TOOLS_B,
    VOCAB_SIZE,
    ChatFormat,
    Pending,
    Session,
    call,
    reply,
    reserialized,
    system,
    tool_result,
    user,
    without_reasoning,
)

from trajectory_tree import (
    FinishReason,
    LengthLimit,
    LengthMode,
    Linearization,
    LossReason,
    Message,
    Prompt,
    RewardPolicy,
    ToolSpec,
    TurnMeta,
    assign_reward,
    dumps,
    linearize,
    loads,
    render_tree,
    summarize,
)

PROPERTY_SETTINGS = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

WORDS = ["ok", "ls", "é", "🙂", "a\nb", "fix", ""]
TOOLSETS: list[tuple[ToolSpec, ...]] = [TOOLS_A, TOOLS_B, ()]
SYSTEMS = ["main agent", "sub-agent", "helper"]
OUTPUTS = ["template"] * 6 + ["empty", "length", "abort", "noise"]


@dataclass
class Client:
    """A conversation some client keeps sending; it waits for each answer."""

    tools: tuple[ToolSpec, ...]
    history: list[Message]
    last: Prompt | None = None
    pending: Pending | None = None
    calls: int = 0
    prompts: list[Prompt] = field(default_factory=list)

    def prompt(self) -> Prompt:
        return Prompt(tuple(self.history), self.tools)


def _reply(data: st.DataObject, client: Client) -> Message:
    calls = []
    for _ in range(data.draw(st.integers(0, 2))):
        client.calls += 1
        arguments = {"cmd": data.draw(st.sampled_from(WORDS)), "n": client.calls}
        calls.append(call(f"c{id(client) % 997}-{client.calls}", "bash", arguments))
    reasoning = data.draw(st.sampled_from([None, "think", "plan é"]))
    return reply(data.draw(st.sampled_from(WORDS)), *calls, reasoning=reasoning)


def _send(data: st.DataObject, s: Session, client: Client, retry: bool) -> None:
    p = client.last if retry and client.last is not None else client.prompt()
    answer = _reply(data, client)
    rendered = s.fmt.assistant_output(answer)
    kind = data.draw(st.sampled_from(OUTPUTS))
    finish = FinishReason.STOP
    output = rendered
    if kind == "empty":
        output = []
    elif kind in ("length", "abort"):
        output = rendered[: data.draw(st.integers(0, len(rendered) - 1))]
        finish = FinishReason.LENGTH if kind == "length" else FinishReason.ABORT
    elif kind == "noise":
        output = data.draw(st.lists(st.integers(0, VOCAB_SIZE - 1), max_size=6))
    full = "fallback" if data.draw(st.integers(0, 3)) == 0 else None
    meta = TurnMeta(side_request=data.draw(st.integers(0, 19)) == 0)
    client.pending = s.start(p, answer, output=output, finish=finish, full=full, meta=meta)
    client.last = p
    client.prompts.append(p)


def _receive(data: st.DataObject, s: Session, client: Client) -> None:
    pending = client.pending
    assert pending is not None
    client.pending = None
    s.finish(pending)
    if pending.completion.finish_reason is FinishReason.ABORT:
        return  # the client never saw an answer
    answer = pending.reply
    echo = data.draw(st.sampled_from([lambda m: m, reserialized, without_reasoning]))
    client.history = [*pending.route.prompt.messages, echo(answer)]
    results = [tool_result(c.id, data.draw(st.sampled_from(WORDS))) for c in answer.tool_calls]
    results = data.draw(st.permutations(results))
    client.history += results or [user(data.draw(st.sampled_from(WORDS)) or "go on")]


def _derived(data: st.DataObject, source: Client) -> Client:
    """A fork at an interior point, an edited history, or a compaction restart of ``source``."""
    history = source.history
    kind = data.draw(st.sampled_from(["fork", "edit", "compact"]))
    if kind == "compact":
        return Client(source.tools, [history[0], user("summary: " + str(len(history)))])
    # Interior points after a generated reply, where a fork shares generated turns.
    cuts = [i for i in range(3, len(history)) if history[i].role != "assistant"]
    cut = data.draw(st.sampled_from(cuts)) + 1 if cuts else len(history)
    copied = list(history[:cut])
    if kind == "edit":
        users = [i for i, m in enumerate(copied) if m.role == "user"]
        if users:
            copied[data.draw(st.sampled_from(users))] = user("edited")
    else:
        copied.append(user("another way"))
    return Client(source.tools, copied)


def _session(data: st.DataObject) -> tuple[Session, list[Client]]:
    s = Session(fmt=ChatFormat(strip_history_reasoning=data.draw(st.booleans())))
    clients: list[Client] = []
    for _ in range(data.draw(st.integers(1, 45))):
        idle = [c for c in clients if c.pending is None]
        busy = [c for c in clients if c.pending is not None]
        ops = ["new", *["send"] * 4, "retry", "derive"] if idle else ["new"]
        ops += ["receive"] * 4 * bool(busy)
        op = data.draw(st.sampled_from(ops))
        if op == "new":
            tools = data.draw(st.sampled_from(TOOLSETS))
            first = [system(data.draw(st.sampled_from(SYSTEMS))), user("task")]
            clients.append(Client(tools, first))
        elif op == "receive":
            _receive(data, s, data.draw(st.sampled_from(busy)))
        elif op == "derive":
            clients.append(_derived(data, data.draw(st.sampled_from(idle))))
        else:
            _send(data, s, data.draw(st.sampled_from(idle)), retry=op == "retry")
    for client in clients:
        if client.pending is not None:
            _receive(data, s, client)
    return s, clients


def _label(s: Session, lin: Linearization) -> None:
    """Hypothesis statistics (``--hypothesis-show-statistics``): what the sessions exercised."""
    turns = s.tree.turns
    reasons = {e.reason for e in lin.exclusions}
    event(f"turns>={min(len(turns) // 5 * 5, 20)}")
    event(f"samples>={min(len(lin.samples), 4)}")
    for reason in reasons:
        event(f"excluded {reason}")
    if any(t.rerendered for t in turns):
        event("re-rendered lineage")
    if len(s.tree.roots) > 1:
        event("several context roots")
    if any(sp.reason is LossReason.TRAINED_IN_OTHER_SAMPLE for x in lin.samples for sp in x.spans):
        event("shared turns")


@PROPERTY_SETTINGS
@given(st.data())
def test_every_invariant_holds_for_random_sessions(data: st.DataObject) -> None:
    s, _ = _session(data)
    note(render_tree(s.tree))  # shown with a failing example
    _label(s, lin := linearize(s.tree))
    lin = check_session(s)
    summary = summarize(s.tree, lin)
    assert summary.trained_tokens + sum(summary.excluded_tokens.values()) == sum(
        t.output_length for t in s.tree.turns
    )
    final = assign_reward(lin, 1.0, rollout_id="ep", policy=RewardPolicy.FINAL_BRANCH)
    check_linearization(s, final)


@PROPERTY_SETTINGS
@given(st.data())
def test_every_invariant_holds_under_length_limits(data: st.DataObject) -> None:
    s, _ = _session(data)
    longest = max((len(x.tokens) for x in linearize(s.tree).samples), default=1)
    mode = data.draw(st.sampled_from(list(LengthMode)))
    limit = LengthLimit(data.draw(st.integers(1, longest + 1)), mode)
    check_session(s, limit=limit)


@PROPERTY_SETTINGS
@given(st.data())
def test_json_round_trip_preserves_everything(data: st.DataObject) -> None:
    s, clients = _session(data)
    text = dumps(s.tree)
    loaded = loads(text)
    assert dumps(loaded) == text
    assert linearize(loaded) == linearize(s.tree)
    check_recorded(Session(tree=loaded, calls=s.calls))
    for client in clients:
        for p in [client.prompt(), *client.prompts]:
            a, b = s.tree.route(p), loaded.route(p)
            assert (a.anchor.id, a.matched, a.prefix_length) == (
                b.anchor.id,
                b.matched,
                b.prefix_length,
            )
            assert [t.id for t in a.recorded] == [t.id for t in b.recorded]
    assert json.loads(text)["session_id"] == s.tree.session_id
