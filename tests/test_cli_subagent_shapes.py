"""Real Claude Code sub-agents of every shape through the real adapter, on the host and in a
local bubblewrap sandbox: twins, identical twins, forks (foreground and background), a bare
``Agent`` call, nested sub-agents.

The main agent runs one command of its own, then starts the sub-agents (``team_agent.py``).
Whatever the shape, every agent must come out trained once, in samples of its own: a sample
trains only turns of its leaf's agent, every engine token is trained exactly once with its
logprob, and the output of every turn is what the engine generated for that turn's request.

- Twins: two sub-agents with the same description, whose prompts differ only in their name.
- Identical twins: two ``Agent`` calls with exactly the same input. Their first requests are
  the same bytes (only ``x-claude-code-agent-id`` differs), so they get the same reply; with
  the adapter's retry replay on, neither may be served the other's answer as a retry.
- Fork (``subagent_type: "fork"``): the fork copies the main agent's history, its last reply
  without the text, so its branch passes through the main agent's first turn and leaves the
  main agent's where that text was. The fork's sample, whose leaf comes first,
  trains only the fork's turns and the main agent's sample trains every turn of the main
  agent, the one on the fork's path too (a reward per sample credits each with its own work).
- Bare ``Agent`` call (no ``subagent_type``): in Claude Code 2.1.330 this is NOT a fork, with
  or without the fork gate ``CLAUDE_CODE_FORK_SUBAGENT=1``: the tool's own description says
  "any other type — or omitting it — starts a fresh agent (general-purpose by default)", and
  it does (a conversation of its own, none of the parent's history). Pinned here so a new pin
  that forks on a bare call shows up.
- Nested: a sub-agent that itself calls ``Agent`` (depth 2).
"""

from __future__ import annotations

import json
import re
from pathlib import Path, PurePosixPath

import pytest

from harness import AgentEndpoint, ClaudeCode, InstalledCli
from protocol_adapters import AdapterConfig, SessionLimits, Vocabulary
from trajectory_tree import LossReason, Message, Turn

from .cli_runs import WHERE, Where, run_one
from .cli_session import (
    ENGINE_CONTEXT,
    POLICY_MODEL,
    CliSession,
    chain,
    explained,
)
from .reading import Prompt
from .session_checks import (
    assert_each_engine_token_trained_once,
    assert_one_sample_per_agent,
    turns_by_agent,
)
from .team_agent import AGENT_TOOL, PREPARED, TASK, Part, TeamAgent, directive, marker, output

AGENT_ID = re.compile(r"a[0-9a-f]{16}")


class ForkGateClaudeCode(ClaudeCode):
    """Claude Code with its fork sub-agent's own gate set: ``CLAUDE_CODE_FORK_SUBAGENT=1``."""

    def environment(self, endpoint: AgentEndpoint, home: PurePosixPath) -> dict[str, str]:
        return {**super().environment(endpoint, home), "CLAUDE_CODE_FORK_SUBAGENT": "1"}


async def run_team(
    where: Where,
    installed: InstalledCli,
    vocabulary: Vocabulary,
    tmp_path: Path,
    *parts: Part,
    harness: ClaudeCode | None = None,
    replay_retries: bool = False,
) -> CliSession[TeamAgent]:
    agent = TeamAgent(vocabulary, parts=parts)
    config = AdapterConfig(
        limits=SessionLimits(context_tokens=ENGINE_CONTEXT), replay_retries=replay_retries
    )
    return await run_one(
        where, harness or ClaudeCode(), installed, agent, tmp_path, task=TASK, config=config
    )


def assert_team_finished(done: CliSession[TeamAgent], agents: int) -> dict[str, list[Turn]]:
    """The CLI finished cleanly with every part reported, ``agents`` sub-agents ran (each with
    an agent id), each agent is trained once in samples of its own, and the trust property
    holds over the whole tree. Returns the sub-agents' turns by agent id."""
    assert done.run.returncode == 0
    assert done.agent.problems == []
    assert done.proxy.refusals == []
    assert (done.workdir / "main-marker").read_text().strip() == PREPARED
    assert done.events.result_text is not None
    assert done.events.result_text.startswith("Done. REPORT")
    tree = done.tree
    assert all(t.meta.extra["model"] == POLICY_MODEL for t in tree.turns)
    by_agent = turns_by_agent(tree)
    main = by_agent.pop(None)
    assert len(by_agent) == agents
    assert all(AGENT_ID.fullmatch(agent or "") for agent in by_agent)
    # The stream counts the main agent's replies; the model calls are the tree's.
    assert done.events.main_agent_turns == len(main)
    assert [json.loads(c.arguments)["command"] for c in main[0].reply.tool_calls] == [
        f"echo {PREPARED} > main-marker && echo {PREPARED}"
    ]
    assert chain(tree, main[-1]) == [t.id for t in main]
    lin = assert_each_engine_token_trained_once(done)
    assert_one_sample_per_agent(tree, lin)
    return {agent: turns for agent, turns in by_agent.items() if agent is not None}


def assert_fresh_conversations(done: CliSession[TeamAgent], names: tuple[str, ...]) -> None:
    """The sub-agents' conversations are their own: another system prompt than the main
    agent's, and none of its history (the main agent's first command is not in them)."""
    main_system = done.agent.system_prompts["main"]
    assert len(main_system) == 1
    for name in names:
        assert done.agent.system_prompts[name].isdisjoint(main_system)
    for agent, turns in turns_by_agent(done.tree).items():
        if agent is not None:
            messages = done.tree.request_messages(turns[0])
            assert PREPARED not in "\n".join(m.plain_text for m in messages)


@pytest.mark.parametrize("where", WHERE)
async def test_twins_with_the_same_description_are_kept_apart(
    where: Where, tmp_path: Path, claude_code_cli: InstalledCli, qwen_vocabulary: Vocabulary
) -> None:
    same = "Run one part"
    done = await run_team(
        where,
        claude_code_cli,
        qwen_vocabulary,
        tmp_path,
        Part("alpha", description=same),
        Part("beta", description=same),
    )
    with explained(done):
        subs = assert_team_finished(done, agents=2)
        for name in ("alpha", "beta"):
            assert (done.workdir / marker(name)).read_text().strip() == output(name)
        assert_fresh_conversations(done, ("alpha", "beta"))
        tree = done.tree
        # Same description, prompts one name apart: each twin is a chain of its own turns...
        reports = set()
        for turns in subs.values():
            assert len(turns) == 2
            assert chain(tree, turns[-1]) == [t.id for t in turns]
            reports.add(turns[-1].reply.plain_text)
        assert reports == {f"REPORT {n}: {output(n)}" for n in ("alpha", "beta")}
        # ...though their first requests share everything up to the prompt, in one context.
        first = [tree.node(turns[0].node).path()[0] for turns in subs.values()]
        assert first[0] is first[1]


@pytest.mark.parametrize("where", WHERE)
async def test_identical_twins_each_get_and_train_their_own_generation(
    where: Where, tmp_path: Path, claude_code_cli: InstalledCli, qwen_vocabulary: Vocabulary
) -> None:
    twin = Part("twin", "fresh-dir")
    done = await run_team(
        where, claude_code_cli, qwen_vocabulary, tmp_path, twin, twin, replay_retries=True
    )
    with explained(done):
        subs = assert_team_finished(done, agents=2)
        tree = done.tree
        main = turns_by_agent(tree)[None]
        calls = main[1].reply.tool_calls
        assert [c.name for c in calls] == [AGENT_TOOL, AGENT_TOOL]
        assert calls[0].arguments == calls[1].arguments  # exactly the same Agent input
        first, second = subs.values()
        # Byte-identical first requests, told apart only by the agent-id header: both were
        # generated by the engine (never one replayed to the other), with the same reply...
        prompt = tuple(tree.prompt_ids(first[0]))
        assert tuple(tree.prompt_ids(second[0])) == prompt
        assert [r.input_ids for r in done.stack.double.requests].count(prompt) == 2
        assert first[0].meta.request_id != second[0].meta.request_id
        assert tree.output_ids(first[0]) == tree.output_ids(second[0])
        assert first[0].reply.tool_calls[0].id != second[0].reply.tool_calls[0].id
        # ...as two siblings in the tree, each continued by its own twin only.
        assert tree.node(first[0].node).parent is tree.node(second[0].node).parent
        # Every request the CLI sent was answered by a generation of its own: none replayed.
        assert len(done.proxy.exchanges) == len(tree.turns) == len(done.stack.double.requests)
        assert done.session.answered == len(tree.turns)
        directories = []
        for turns in (first, second):
            assert len(turns) == 2
            assert chain(tree, turns[-1]) == [t.id for t in turns]
            report = turns[-1].reply.plain_text
            assert report.startswith("REPORT twin: twin-")
            directories.append(report.removeprefix("REPORT twin: "))
        # Each ran its own command: two directories, each reported by one twin.
        assert len(set(directories)) == 2
        for directory in directories:
            assert (done.workdir / directory / "marker").read_text().strip() == output("twin")
        assert set(re.findall(r"REPORT twin: (\S+)", done.events.result_text or "")) == set(
            directories
        )


def copied_reply(messages: list[Message]) -> Message:
    """The fork's copy of its parent's delegating reply: the last assistant message before the
    fork's own turns."""
    return next(m for m in reversed(messages) if m.role == "assistant")


@pytest.mark.parametrize("background", [False, None], ids=["foreground", "background"])
@pytest.mark.parametrize("where", WHERE)
async def test_a_fork_trains_only_its_own_turns_though_it_copies_the_parents(
    where: Where,
    background: bool | None,
    tmp_path: Path,
    claude_code_cli: InstalledCli,
    qwen_vocabulary: Vocabulary,
) -> None:
    fork = Part("alpha", subagent_type="fork", background=background)
    done = await run_team(where, claude_code_cli, qwen_vocabulary, tmp_path, fork)
    with explained(done):
        subs = assert_team_finished(done, agents=1)
        assert (done.workdir / marker("alpha")).read_text().strip() == output("alpha")
        tree = done.tree
        main = turns_by_agent(tree)[None]
        (forked,) = subs.values()
        assert [t.reply.plain_text for t in forked] == [
            "Running it.",
            f"REPORT alpha: {output('alpha')}",
        ]
        # The fork inherits the parent's system prompt and history: its branch passes through
        # the main agent's first turn...
        assert done.agent.system_prompts["alpha"] == done.agent.system_prompts["main"]
        assert chain(tree, forked[-1]) == [main[0].id, *(t.id for t in forked)]
        # ...and leaves the main agent's where the delegating reply's text was: the fork's
        # copy of that reply holds its Agent call and no text.
        delegating = main[1]
        copy = copied_reply(tree.request_messages(forked[0]))
        assert copy.plain_text == ""
        assert [(c.name, json.loads(c.arguments)) for c in copy.tool_calls] == [
            (AGENT_TOOL, json.loads(delegating.reply.tool_calls[0].arguments))
        ]
        assert delegating.reply.plain_text == "Each part goes to its own sub-agent."
        fork_path = tree.node(forked[0].node).path()
        main_path = tree.node(delegating.node).path()
        pairs = zip(fork_path, main_path, strict=False)
        split = next(i for i, (a, b) in enumerate(pairs) if a is not b)
        shared = fork_path[split - 1]  # the first turn's tool result
        assert shared.message is not None
        assert shared.message.role == "tool"
        assert shared.parent is tree.node(main[0].node)
        assert fork_path[split].turn is None  # the copy, written by the client
        assert directive(fork) in "\n".join(
            m.plain_text for m in tree.request_messages(forked[0]) if m.role == "user"
        )
        # The fork's leaf comes first, yet its sample trains only the fork's turns; the main
        # agent's first turn, on both paths, is trained once: in the main agent's sample.
        lin = assert_each_engine_token_trained_once(done)
        by_leaf = {s.leaf_turn: s for s in lin.samples}
        fork_sample = by_leaf[forked[-1].id]
        assert forked[-1].id < main[-1].id
        assert fork_sample.trained_turns == tuple(t.id for t in forked)
        assert by_leaf[main[-1].id].trained_turns == tuple(t.id for t in main)
        masked = [s for s in fork_sample.spans if s.turn == main[0].id]
        assert [s.reason for s in masked] == [LossReason.TRAINED_IN_OTHER_SAMPLE]
        assert len(masked[0]) == main[0].output_length


@pytest.mark.parametrize("fork_gate", [False, True], ids=["default", "fork-gate"])
@pytest.mark.parametrize("where", WHERE)
async def test_a_bare_agent_call_starts_a_fresh_agent_not_a_fork(
    where: Where,
    fork_gate: bool,
    tmp_path: Path,
    claude_code_cli: InstalledCli,
    qwen_vocabulary: Vocabulary,
) -> None:
    bare = Part("alpha", background=None)  # only `description` and `prompt`
    assert set(bare.agent_input()) == {"description", "prompt"}
    harness = ForkGateClaudeCode() if fork_gate else ClaudeCode()
    done = await run_team(where, claude_code_cli, qwen_vocabulary, tmp_path, bare, harness=harness)
    with explained(done):
        subs = assert_team_finished(done, agents=1)
        assert (done.workdir / marker("alpha")).read_text().strip() == output("alpha")
        assert_fresh_conversations(done, ("alpha",))
        tree = done.tree
        (turns,) = subs.values()
        assert chain(tree, turns[-1]) == [t.id for t in turns]
        messages = tree.request_messages(turns[0])
        assert "fork-boilerplate" not in "\n".join(m.plain_text for m in messages)
        # A bare call runs in the background (Claude Code's default; the fork gate also
        # takes run_in_background out of the schema): the main agent's call came back at once.
        main = turns_by_agent(tree)[None]
        answer = next(
            n.message
            for n in tree.node(main[-1].node).path()
            if n.message is not None
            and n.message.role == "tool"
            and n.message.tool_call_id == main[1].reply.tool_calls[0].id
        )
        assert "Async agent launched successfully" in answer.plain_text
        first_prompt = Prompt(done.agent.vocabulary.decode(list(tree.prompt_ids(main[0]))))
        agent_tool = first_prompt.tool(AGENT_TOOL)
        assert agent_tool is not None
        parameters = agent_tool["parameters"]
        assert isinstance(parameters, dict)
        assert ("run_in_background" in parameters["properties"]) is not fork_gate


@pytest.mark.parametrize("where", WHERE)
async def test_nested_sub_agents_are_each_a_branch_of_their_own(
    where: Where, tmp_path: Path, claude_code_cli: InstalledCli, qwen_vocabulary: Vocabulary
) -> None:
    nested = Part("alpha", "spawn", child=Part("beta"))
    done = await run_team(where, claude_code_cli, qwen_vocabulary, tmp_path, nested)
    with explained(done):
        subs = assert_team_finished(done, agents=2)
        assert (done.workdir / marker("beta")).read_text().strip() == output("beta")
        assert not (done.workdir / marker("alpha")).exists()
        assert_fresh_conversations(done, ("alpha", "beta"))
        tree = done.tree
        by_first = {turns[0].reply.plain_text: turns for turns in subs.values()}
        alpha, beta = by_first["Handing it over."], by_first["Running it."]
        # Depth 1 delegates with the Agent tool it was offered; depth 2 does the work.
        assert [c.name for c in alpha[0].reply.tool_calls] == [AGENT_TOOL]
        assert json.loads(alpha[0].reply.tool_calls[0].arguments)["prompt"] == directive(
            Part("beta")
        )
        assert alpha[0].meta.agent_id != beta[0].meta.agent_id
        assert [t.reply.plain_text for t in (alpha[-1], beta[-1])] == [
            f"REPORT alpha: {output('alpha')}",
            f"REPORT beta: {output('beta')}",
        ]
        # The child's report came back to its parent as the answer to its Agent call.
        answered = [
            n.message
            for n in tree.node(alpha[-1].node).path()
            if n.message is not None and n.message.role == "tool"
        ]
        assert [m.tool_call_id for m in answered] == [alpha[0].reply.tool_calls[0].id]
        assert f"REPORT beta: {output('beta')}" in answered[0].plain_text
        for turns in (alpha, beta):
            assert chain(tree, turns[-1]) == [t.id for t in turns]
