"""Interleaving: a main agent and background sub-agents share one session without a lock."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
from invariants import check_session
from session_kit import (
    Pending,
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


@dataclass
class Agent:
    """A client that waits for each answer before its next request, like an agent loop."""

    name: str
    history: list[Message]
    steps: int = 0
    pending: Pending | None = None
    turns: list[int] = field(default_factory=list)

    def send(self, s: Session) -> None:
        assert self.pending is None
        answer = reply(
            f"{self.name} step {self.steps}",
            call(f"{self.name}-{self.steps}", "bash", {"cmd": f"echo {self.steps}", "x": 1}),
        )
        meta = TurnMeta(request_id=f"{self.name}-{self.steps}", agent_id=self.name)
        self.pending = s.start(prompt(*self.history), answer, meta=meta)

    def receive(self, s: Session) -> None:
        assert self.pending is not None
        turn = s.finish(self.pending)
        self.turns.append(turn.id)
        answer = reserialized(self.pending.reply)  # the client's echo, as Claude Code sends it
        self.history += [answer, tool_result(f"{self.name}-{self.steps}", f"{self.steps} ok")]
        self.steps += 1
        self.pending = None


def agents() -> dict[str, Agent]:
    return {
        "A": Agent("A", [system("main agent"), user("fix the bug")]),
        "B": Agent("B", [system("sub-agent"), user("find the parser")]),
        "C": Agent("C", [system("sub-agent"), user("run the tests")]),
    }


def run(schedule: str) -> tuple[Session, dict[str, Agent]]:
    """``schedule``: ``rX`` routes (sends) agent X's next request, ``fX`` records its answer."""
    s = Session()
    team = agents()
    for op in schedule.split():
        agent = team[op[1]]
        (agent.send if op[0] == "r" else agent.receive)(s)
    return s, team


def check_one_sample_per_agent(s: Session, team: dict[str, Agent]) -> None:
    lin = check_session(s)
    assert len(s.tree.turns) == sum(len(a.turns) for a in team.values())
    by_leaf = {x.leaf_turn: x.trained_turns for x in lin.samples}
    for agent in team.values():
        if agent.turns:
            assert by_leaf[agent.turns[-1]] == tuple(agent.turns), agent.name
    assert len(lin.samples) == sum(1 for a in team.values() if a.turns)
    assert lin.exclusions == ()


@pytest.mark.parametrize(
    "schedule",
    [
        "rA rB fB rC fA fC rA rB fA fB rC rA fC fA",
        "rB rC rA fA rA fC fB rB rC fA fC fB rA fA",
        "rA fA rA rB rC fC fB rB fA rC fC fB",
    ],
)
def test_interleaved_agents_each_become_one_sample(schedule: str) -> None:
    s, team = run(schedule)
    check_one_sample_per_agent(s, team)


@pytest.mark.parametrize("seed", range(20))
def test_random_interleavings(seed: int) -> None:
    rng = random.Random(seed)
    s = Session()
    team = agents()
    for _ in range(40):
        agent = rng.choice(list(team.values()))
        (agent.receive if agent.pending else agent.send)(s)
    for agent in team.values():
        if agent.pending:
            agent.receive(s)
    check_one_sample_per_agent(s, team)


def test_two_concurrent_identical_first_requests_share_their_prefix() -> None:
    """Two sub-agents launched with the same prompt: routed before either is recorded."""
    s = Session()
    first = [system("sub-agent"), user("look around")]
    one = s.start(prompt(*first), reply("", call("x1", "bash", {"cmd": "ls"})))
    two = s.start(prompt(*first), reply("", call("y1", "bash", {"cmd": "pwd"})))
    assert s.tree.roots == [], "routing alone leaves the tree unchanged"
    s.finish(two)
    s.finish(one)
    root = s.tree.roots[0]
    assert len(root.children) == 1
    task = root.children[0].children[0]
    assert task.message == first[1]
    assert len(task.children) == 2, "the prompt chunk is shared; the answers are siblings"
    for turn, pending in zip(list(s.tree.turns), (two, one), strict=True):
        tool = tool_result(pending.reply.tool_calls[0].id, "ok")
        s.turn(prompt(*first, pending.reply, tool), reply(f"done after turn {turn.id}"))
    lin = check_session(s)
    assert sorted(x.trained_turns for x in lin.samples) == [(0, 2), (1, 3)]


def test_identical_requests_of_two_agents_are_not_a_retry() -> None:
    """Two sub-agents sending the same first request each did their own work: when neither
    answer is continued, both are still trained (the agent id tells them from a retry)."""
    s = Session()
    first = [system("sub-agent"), user("say hi")]
    one = s.start(prompt(*first), reply("hi"), meta=TurnMeta(agent_id="a1"))
    two = s.start(prompt(*first), reply("hello"), meta=TurnMeta(agent_id="a2"))
    s.finish(one)
    s.finish(two)
    lin = check_session(s)
    assert sorted(x.trained_turns for x in lin.samples) == [(0,), (1,)]
    assert lin.exclusions == ()


def test_the_same_agent_asking_again_is_a_retry() -> None:
    s = Session()
    first = [system("sub-agent"), user("say hi")]
    s.turn(prompt(*first), reply("hi"), meta=TurnMeta(agent_id="a1"))
    s.turn(prompt(*first), reply("hello"), meta=TurnMeta(agent_id="a1"))
    lin = check_session(s)
    assert [x.trained_turns for x in lin.samples] == [(1,)]
    assert [(e.turn, e.reason) for e in lin.exclusions] == [(0, LossReason.ABANDONED_RETRY)]


def test_a_route_stays_valid_while_other_turns_are_recorded() -> None:
    s = Session()
    main = [system("main"), user("task")]
    s.turn(prompt(*main), reply("", call("m0", "bash", {"cmd": "a"})))
    echo = reply("", call("m0", "bash", {"cmd": "a"}))
    early = s.start(prompt(*main, echo, tool_result("m0", "a")), reply("main 1"))
    for i in range(5):  # a sub-agent runs five turns meanwhile
        history = [system("sub"), user("sub task")]
        for j in range(i):
            history += [reply(f"s{j}"), user(f"more {j}")]
        s.turn(prompt(*history), reply(f"s{i}"))
    turn = s.finish(early)
    assert s.tree.prompt_ids(turn).tolist() == early.call.input_ids
    lin = check_session(s)
    assert sorted(x.trained_turns for x in lin.samples) == [(0, 6), (1, 2, 3, 4, 5)]
