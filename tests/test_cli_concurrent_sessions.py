"""Two real CLI sessions at once through one adapter and one engine, on the host and in local
bubblewrap sandboxes: Claude Code (Anthropic Messages) and Codex (OpenAI Responses), each with
its own session token, running the shell session of ``scripted_agent.py`` side by side.

Every request must land in its own session's tree and nowhere else, each tree must be the same
one bridged chain a session alone makes, and the token trust check must hold on each tree:
every prompt what the engine received for that turn, every generated token trained exactly once
with its logprob, every output what the engine generated for that request. The engine answers
each request after a second, so the two sessions' requests are in flight at the same time.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness import ClaudeCode, Codex, Harness, InstalledCli
from protocol_adapters import Vocabulary
from protocol_adapters.testing import Faults, ScriptedReply
from trajectory_tree import FinishReason, linearize

from .cli_runs import WHERE, Where, run_cli, serving
from .cli_session import TASK, CliSession, chain, explained
from .reading import ScriptedModel
from .scripted_agent import ALL_COMMANDS, FINAL_ANSWER, STEPS, ShellSessionAgent
from .session_checks import assert_outputs_are_the_requests_generations
from .trust_checks import assert_engine_tokens_trained

ENGINE_LATENCY = Faults(latency=1.0)
DIALECTS = {"claude-code": "anthropic", "codex": "openai_responses"}


@dataclass(slots=True)
class BySession(ScriptedModel):
    """The engine's script for several sessions: each request is answered by the scripted model
    of the session whose task its prompt holds (and recorded by that model too)."""

    sessions: Mapping[str, ShellSessionAgent] = field(default_factory=dict)

    def __call__(self, input_ids: Sequence[int]) -> ScriptedReply:
        text = self.vocabulary.decode(list(input_ids))
        owners = [agent for task, agent in self.sessions.items() if task in text]
        if len(owners) != 1:
            reply = self.problem(f"a prompt holding {len(owners)} of the sessions' tasks")
        else:
            reply = owners[0](input_ids)
        self.replies.append((tuple(input_ids), reply))
        return reply


def task_of(name: str) -> str:
    return f"{TASK} (This is session {name}.)"


def assert_session_alone(done: CliSession[ShellSessionAgent], other_task: str) -> None:
    """The session ran as it does alone, and its tree holds only its own requests, each
    trained once as the engine generated it."""
    assert done.run.returncode == 0
    assert done.agent.problems == []
    assert done.proxy.refusals == []
    for command in ALL_COMMANDS:
        assert (done.workdir / command.marker).read_text().strip() == command.output
    assert done.events.result_text == FINAL_ANSWER
    tree = done.tree
    turns = tree.turns
    assert len(turns) == len(STEPS) + 1
    assert all(t.finish_reason is FinishReason.STOP for t in turns)
    assert {t.meta.extra["dialect"] for t in turns} == {DIALECTS[done.harness.name]}
    assert chain(tree, turns[-1]) == [t.id for t in turns]
    assert all(t.rerendered is None for t in turns)
    decode = done.agent.vocabulary.decode
    for turn in turns:
        assert other_task not in decode(list(tree.prompt_ids(turn)))
    calls = [json.loads(c.arguments) for t in turns for c in t.reply.tool_calls]
    tool = done.agent.shell_tools[0]
    assert calls == [{tool.argument: command.line} for command in ALL_COMMANDS]
    lin = linearize(tree)
    assert lin.exclusions == ()
    assert [s.trained_turns for s in lin.samples] == [tuple(t.id for t in turns)]
    assert_engine_tokens_trained(done.stack, tree, lin)
    assert_outputs_are_the_requests_generations(done.stack, tree, done.agent.replies)


@pytest.mark.parametrize("where", WHERE)
async def test_two_sessions_at_once_each_train_exactly_their_own_engine_tokens(
    where: Where,
    tmp_path: Path,
    claude_code_cli: InstalledCli,
    codex_cli: InstalledCli,
    qwen_vocabulary: Vocabulary,
) -> None:
    clis: dict[str, tuple[Harness, InstalledCli]] = {
        "claude-code": (ClaudeCode(), claude_code_cli),
        "codex": (Codex(), codex_cli),
    }
    agents = {name: ShellSessionAgent(qwen_vocabulary) for name in clis}
    script = BySession(qwen_vocabulary, sessions={task_of(n): a for n, a in agents.items()})
    async with serving(script, tmp_path, faults=ENGINE_LATENCY) as served:
        runs = [
            run_cli(
                where,
                served,
                harness,
                installed,
                agents[name],
                tmp_path / name,
                task=task_of(name),
                name=f"{name}-{where}",
            )
            for name, (harness, installed) in clis.items()
        ]
        claude, codex = await asyncio.gather(*runs)
    assert script.problems == []
    with explained(claude), explained(codex):
        assert_session_alone(claude, task_of("codex"))
        assert_session_alone(codex, task_of("claude-code"))
        assert [tool.name for tool in claude.agent.shell_tools] == ["Bash", "Bash"]
        # Each engine request is in exactly one of the two trees.
        rids = [{t.meta.request_id for t in done.tree.turns} for done in (claude, codex)]
        assert rids[0].isdisjoint(rids[1])
        assert rids[0] | rids[1] == {r.rid for r in served.stack.double.requests}
        assert len(served.stack.double.requests) == len(claude.tree.turns) + len(codex.tree.turns)
        # They really ran at once: some request of each was generating while one of the
        # other's was.
        overlapping = [
            (a.id, b.id)
            for a in claude.tree.turns
            for b in codex.tree.turns
            if a.meta.started_at < b.meta.finished_at and b.meta.started_at < a.meta.finished_at
        ]
        assert overlapping, "the two sessions never had requests in flight together"
        stats = served.stack.renderer.stats
        assert stats.mismatches == 0
        assert stats.checked == len(served.stack.double.requests)
