"""A real Claude Code interrupted while the engine is still generating, through the real
adapter, on the host and in a local bubblewrap sandbox: the CLI killed with SIGKILL (its
process group on the host; every process of its sandbox, while ``harness.run`` waits for it),
or its session closed with the adapter's ``close_session``.

One agent: the session runs one shell command, then a long answer streamed slowly (one token
every 30 ms); the test acts once the answer's first tokens have reached the CLI. Either way
the partial answer is recorded as an aborted turn, holding exactly the tokens the engine
produced until then, trained nowhere (excluded as aborted); the engine is told to stop; the
session's other turn is still trained, once; nothing is left running.

Several agents at once: Claude Code starts a sub-agent as soon as the ``Agent`` call in the
main agent's reply is complete, while the rest of that reply is still streaming. Interrupted
then, every generation in flight (the main agent's and the sub-agents') is stopped on the
engine and kept as an aborted turn, and only the finished first turn trains.

Closing a session is final at once: ``close_session`` returns with the tree complete, and the
CLI's retries are refused (401) without reaching the engine. Claude Code 2.1.330 retries a 401
up to 9 times with growing delays (minutes in all), so whoever closes a session must also stop
its CLI; the test kills it once the first retry was refused.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from machine_load import slowdown

from harness import ClaudeCode, InstalledCli
from protocol_adapters import Vocabulary
from protocol_adapters.testing import Faults, ScriptedReply
from trajectory_tree import FinishReason, LossReason, summarize

from .cli_runs import KILLED, WHERE, Cli, Where, generating, received, run_cli, serving
from .cli_session import CliSession, explained
from .long_reply_agent import COMMAND_OUTPUT, LONG_ANSWER, TASK, LongReplyAgent
from .session_checks import assert_each_engine_token_trained_once
from .team_agent import TASK as TEAM_TASK
from .team_agent import Part, TeamAgent

SLOW = Faults(chunk_delay=0.03)
"""One token every 30 ms, from the second request on: the long answer (hundreds of tokens)
streams for many seconds, and the main agent's delegating reply for over a second after its
first ``Agent`` call is complete."""


def assert_interrupted_at(done: CliSession[LongReplyAgent], where: Where, rid: str) -> None:
    """The first turn is whole and trained; the second, the engine request ``rid``, holds part
    of the long answer, aborted and trained nowhere; the engine was told to stop it; the
    session has nothing running."""
    assert done.run.returncode == KILLED[where]
    assert done.agent.problems == []
    assert (done.workdir / "marker").read_text().strip() == COMMAND_OUTPUT
    assert done.events.result_text is None

    tree = done.tree
    first, partial = tree.turns
    assert first.finish_reason is FinishReason.STOP
    assert [c.name for c in first.reply.tool_calls] == ["Bash"]
    assert partial.meta.request_id == rid
    assert partial.finish_reason is FinishReason.ABORT
    whole = done.stack.double.reply_ids(ScriptedReply(text=LONG_ANSWER))
    assert 0 < partial.output_length < len(whole)
    assert LONG_ANSWER.startswith(partial.reply.plain_text)
    assert done.stack.double.aborts == [rid]

    session = done.session
    assert session.in_flight == set()
    assert session.pending == 0
    assert session.answered == 1  # an aborted generation is no answered call

    lin = assert_each_engine_token_trained_once(done, aborted={partial.id})
    # The session's one branch ends in the aborted turn; its sample trains the first turn.
    assert [s.trained_turns for s in lin.samples] == [(first.id,)]
    assert lin.samples[0].leaf_turn == partial.id
    summary = summarize(tree, lin)
    assert summary.aborted_turns == 1
    assert summary.excluded_tokens == {LossReason.ABORTED: partial.output_length}
    assert summary.trained_tokens == first.output_length
    assert summary.masked_tokens[LossReason.ABORTED] == partial.output_length


@pytest.mark.parametrize("where", WHERE)
async def test_a_cli_killed_mid_generation_leaves_an_aborted_turn_trained_nowhere(
    where: Where, tmp_path: Path, claude_code_cli: InstalledCli, qwen_vocabulary: Vocabulary
) -> None:
    agent = LongReplyAgent(qwen_vocabulary)
    killed: list[str] = []
    async with serving(agent, tmp_path) as served:

        async def kill_while_generating(cli: Cli) -> None:
            await received(served, 1)
            served.stack.double.faults = SLOW
            killed.append(await generating(served, cli.session, reply=2))
            await asyncio.sleep(0.2)
            await cli.kill()

        done = await run_cli(
            where,
            served,
            ClaudeCode(),
            claude_code_cli,
            agent,
            tmp_path / "cli",
            task=TASK,
            during=kill_while_generating,
        )
        # The adapter settles the killed call on its own: the session is still open here.
        assert await done.session.settled(5.0 * slowdown())  # an idle machine's 5 s
        with explained(done):
            (rid,) = killed
            assert not done.session.closed
            # The client went away: the adapter closed the engine stream and told the engine
            # to stop. Which of the two the engine handles first is a race (the abort travels
            # on another connection): on a busy machine it may end the stream before it
            # notices the drop.
            assert done.stack.double.aborts == [rid]
            assert done.stack.double.disconnects in ([rid], [])
            assert_interrupted_at(done, where, rid)
            assert len(done.stack.double.requests) == 2


@pytest.mark.parametrize("where", WHERE)
async def test_a_session_closed_mid_generation_is_final_at_once(
    where: Where, tmp_path: Path, claude_code_cli: InstalledCli, qwen_vocabulary: Vocabulary
) -> None:
    agent = LongReplyAgent(qwen_vocabulary)
    closed: list[tuple[str, int, int]] = []
    async with serving(agent, tmp_path) as served:

        async def close_while_generating(cli: Cli) -> None:
            await received(served, 1)
            served.stack.double.faults = SLOW
            rid = await generating(served, cli.session, reply=2)
            await asyncio.sleep(0.2)
            await served.stack.server.close_session(cli.session.token)
            # Final at once: the aborted turn recorded, nothing running.
            assert cli.session.closed
            assert cli.session.in_flight == set()
            assert cli.session.pending == 0
            closed.append((rid, len(cli.session.tree.turns), len(served.stack.double.requests)))
            while not served.proxy.refusals:  # the CLI's retry, refused
                await asyncio.sleep(0.05)
            await cli.kill()

        done = await run_cli(
            where,
            served,
            ClaudeCode(),
            claude_code_cli,
            agent,
            tmp_path / "cli",
            task=TASK,
            during=close_while_generating,
        )
        with explained(done):
            (rid, turns, requests) = closed[0]
            assert (turns, requests) == (2, 2)
            # Stopped by the abort the close sent, not by the client going away.
            assert done.stack.double.disconnects == []
            assert_interrupted_at(done, where, rid)
            # Nothing reached the engine or the tree after the close; every retry was refused.
            assert len(done.tree.turns) == 2
            assert len(done.stack.double.requests) == 2
            assert done.proxy.refusals
            assert {(r.status, r.error) for r in done.proxy.refusals} == {
                (401, "unknown or expired session token")
            }


@pytest.mark.parametrize("action", ["kill", "close"])
@pytest.mark.parametrize("where", WHERE)
async def test_every_generation_in_flight_is_aborted_when_agents_generate_at_once(
    where: Where,
    action: str,
    tmp_path: Path,
    claude_code_cli: InstalledCli,
    qwen_vocabulary: Vocabulary,
) -> None:
    # A wordy second call keeps the delegating reply streaming well after the first is complete.
    wordy = "Run part beta, " + " ".join(["which is the second part of this job"] * 8)
    agent = TeamAgent(qwen_vocabulary, parts=(Part("alpha"), Part("beta", description=wordy)))
    in_flight: set[str] = set()
    async with serving(agent, tmp_path) as served:

        async def interrupt(cli: Cli) -> None:
            await received(served, 1)
            served.stack.double.faults = SLOW
            # The third reply is a sub-agent's, started while the main agent's delegating
            # reply (the second) still streams: act once both are generating.
            await generating(served, cli.session, reply=3)
            in_flight.update(cli.session.in_flight)
            if action == "close":
                await served.stack.server.close_session(cli.session.token)
                while not served.proxy.refusals:
                    await asyncio.sleep(0.05)
            await cli.kill()

        done = await run_cli(
            where,
            served,
            ClaudeCode(),
            claude_code_cli,
            agent,
            tmp_path / "cli",
            task=TEAM_TASK,
            during=interrupt,
        )
        assert await done.session.settled(5.0 * slowdown())  # an idle machine's 5 s
        with explained(done):
            assert done.run.returncode == KILLED[where]
            assert agent.problems == []
            tree = done.tree
            first, *rest = tree.turns
            delegating = served.stack.double.requests[1].rid
            assert len(in_flight) >= 2
            assert delegating in in_flight
            # Every engine request but the first was stopped on the engine; each that had
            # produced tokens is an aborted turn: the main agent's delegating reply and the
            # sub-agents' first replies.
            requests = {r.rid for r in served.stack.double.requests}
            assert set(served.stack.double.aborts) == requests - {first.meta.request_id}
            assert all(t.finish_reason is FinishReason.ABORT for t in rest)
            assert {t.meta.request_id for t in rest} >= in_flight
            assert {t.meta.agent_id is None for t in rest} == {True, False}
            assert done.session.in_flight == set()
            assert done.session.answered == 1
            lin = assert_each_engine_token_trained_once(done, aborted={t.id for t in rest})
            assert [s.trained_turns for s in lin.samples] == [(first.id,)]
            if action == "close":
                assert {r.status for r in done.proxy.refusals} == {401}
                assert len(served.stack.double.requests) == len(requests)
