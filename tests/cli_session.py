"""One real agent CLI session through the real adapter, and what must hold afterwards.

The CLI runs on the host against ``local_stack`` (real tokenizer, template, server and SGLang
client; the engine double behind them, its script a :class:`ScriptedModel` that reads each
prompt) with exactly the settings harness builds for a sandbox: fresh HOME (and CODEX_HOME),
quiet and offline variables, the session token as API key, a model name the CLI does not know
and the compaction settings harness derives from the engine's context length. A recording relay
sits between the CLI and the adapter so a test can see every refusal the CLI got.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Generic, TypeVar

from harness import AgentEndpoint, EventStats, Harness, InstalledCli, summarize_lines
from protocol_adapters import AdapterConfig, RendererConfig, Session, SessionLimits
from protocol_adapters.testing.stack import LocalStack, local_stack
from trajectory_tree import (
    FinishReason,
    Linearization,
    LossReason,
    SessionTree,
    Turn,
    linearize,
    render_tree,
)

from .host_cli import HostRun, run_on_host
from .reading import ScriptedModel
from .recording_proxy import RecordingProxy
from .scripted_agent import ALL_COMMANDS, FINAL_ANSWER, STEPS, ShellSessionAgent
from .trust_checks import assert_engine_tokens_trained, assert_outputs_are_generations

ENGINE_CONTEXT = 32768
"""The engine double's default context length: the adapter's limit, from which harness derives
the CLI's compaction settings."""
POLICY_MODEL = "policy-under-training"
"""A model name neither CLI knows (a known name changes their behaviour: see the harness's
docs/clients.md)."""
TASK = "Create the three marker files with the shell tool, then say that you are done."
CLI_TIMEOUT = 60.0


def engine_logprob(position: int, token_id: int) -> float:
    """A logprob that differs from token to token (multiples of 1/64, exact in JSON), so any
    misalignment between ids and logprobs shows."""
    return -(1 + (token_id * 7 + position) % 50) / 64


ModelT = TypeVar("ModelT", bound=ScriptedModel)


@dataclass(frozen=True, slots=True)
class CliSession(Generic[ModelT]):
    harness: Harness
    run: HostRun
    events: EventStats
    stack: LocalStack
    session: Session
    agent: ModelT
    workdir: Path
    proxy: RecordingProxy

    @property
    def tree(self) -> SessionTree:
        return self.session.tree


async def run_cli_session(
    harness: Harness,
    installed: InstalledCli,
    agent: ModelT,
    tmp_path: Path,
    *,
    task: str = TASK,
    context: int = ENGINE_CONTEXT,
) -> CliSession[ModelT]:
    """Run the CLI once on ``task``, against an engine of ``context`` tokens that ``agent``
    scripts."""
    config = AdapterConfig(limits=SessionLimits(context_tokens=context))
    workdir = tmp_path / "work"
    workdir.mkdir()
    async with local_stack(
        agent,
        tokenizer_cache=tmp_path,  # unused: the vocabulary is given
        vocabulary=agent.vocabulary,
        config=config,
        renderer_config=RendererConfig(check_sample_rate=1.0),
        logprob=engine_logprob,
        engine_context_length=context,
    ) as stack:
        assert stack.double.context_length == context
        session = stack.server.sessions.open(f"{harness.name}-host")
        async with RecordingProxy(stack.server.url) as proxy:
            endpoint = AgentEndpoint(
                base_url=proxy.url,
                token=session.token,
                model=POLICY_MODEL,
                context_window=context,
            )
            plan = harness.launch(
                bin_path=PurePosixPath(installed.program_path),
                endpoint=endpoint,
                task=task,
                state_dir=PurePosixPath(tmp_path / "state"),
            )
            run = await run_on_host(plan, workdir, tmp_path / "tmp", CLI_TIMEOUT)
    events = summarize_lines(run.stdout.splitlines(), harness.new_tally())
    return CliSession(harness, run, events, stack, session, agent, workdir, proxy)


def codex_notices(stdout: bytes) -> list[str]:
    """The messages of the `error` items in a `codex exec --json` stream: Codex's notices
    about its configuration (a deprecated setting, an unknown model), one per line."""
    notices = []
    for line in stdout.splitlines():
        event = json.loads(line)
        item = event.get("item", {})
        if event.get("type") == "item.completed" and item.get("type") == "error":
            notices.append(item["message"])
    return notices


@contextlib.contextmanager
def explained(done: CliSession[ModelT]) -> Iterator[None]:
    """On a failed assertion, show the session tree, the refusals and the CLI's output."""
    try:
        yield
    except AssertionError as error:
        picture = render_tree(done.tree, width=110)
        raise AssertionError(
            f"{error}\n\n{picture}\n\nscript problems: {done.agent.problems}\n"
            f"refusals: {done.proxy.refusals}\n{done.harness.name}: {done.run.describe()}"
        ) from error


def chain(tree: SessionTree, turn: Turn) -> list[int]:
    """The ids of the turns on ``turn``'s path: the branch it continues, itself included."""
    return [n.turn.id for n in tree.node(turn.node).path() if n.turn is not None]


def assert_trained_once_as_generated(
    done: CliSession[ModelT], *, excluded: Mapping[int, LossReason] | None = None
) -> Linearization:
    """The trust property over the whole tree, whatever its branches: each turn's prompt is what
    the engine received, each generated token is trained exactly once with its logprob (the
    ``excluded`` turns', and only theirs, nowhere, for the reason given), and the output of each
    turn is what the double generated for that prompt; every turn was bridged and checked
    against a full render without a mismatch."""
    tree = done.tree
    lin = linearize(tree)
    assert {e.turn: e.reason for e in lin.exclusions} == dict(excluded or {})
    assert len({e.turn for e in lin.exclusions}) == len(lin.exclusions)
    assert all(t.finish_reason is FinishReason.STOP for t in tree.turns)
    assert_engine_tokens_trained(done.stack, tree, lin)
    assert_outputs_are_generations(done.stack, tree, done.agent.replies)
    stats = done.stack.renderer.stats
    assert stats.mismatches == 0
    assert stats.checked == len(tree.turns)
    return lin


def samples_by_leaf_turn(lin: Linearization) -> dict[int, Sequence[int]]:
    """Each sample's trained turns, keyed by the last one (the branch's leaf)."""
    return {sample.trained_turns[-1]: sample.trained_turns for sample in lin.samples}


def assert_shell_session_recorded(done: CliSession[ShellSessionAgent]) -> None:
    """The CLI ran every scripted command and finished cleanly, and the adapter recorded the
    session as one bridged chain whose trained tokens are exactly the engine's."""
    assert done.run.returncode == 0
    assert done.agent.problems == []
    for command in ALL_COMMANDS:
        marker = done.workdir / command.marker
        assert marker.is_file(), f"the CLI did not run {command.line!r}"
        assert marker.read_text().strip() == command.output
    assert done.events.result_text == FINAL_ANSWER

    tree = done.tree
    turns = tree.turns
    assert len(turns) == len(STEPS) + 1
    assert all(t.finish_reason is FinishReason.STOP for t in turns)
    assert all(t.meta.malformed_tool_calls == 0 for t in turns)
    assert all(t.meta.extra["model"] == POLICY_MODEL for t in turns)
    # One chain: the last reply's path holds every turn, none of them re-rendered.
    chain = tree.node(turns[-1].node).path()
    assert [n.turn.id for n in chain if n.turn is not None] == [t.id for t in turns]
    assert all(t.rerendered is None for t in turns)

    # Every scripted call reached the tree as a tool call, with the tool the CLI offered.
    shell = {tool.name for tool in done.agent.shell_tools}
    assert len(shell) == 1, f"the offered shell tool changed between turns: {shell}"
    calls = [call for t in turns for call in t.reply.tool_calls]
    assert [len(t.reply.tool_calls) for t in turns] == [len(s) for s in STEPS] + [0]
    assert {call.name for call in calls} == shell
    tool = done.agent.shell_tools[0]
    assert [json.loads(call.arguments) for call in calls] == [
        {tool.argument: command.line} for command in ALL_COMMANDS
    ]
    assert done.events.tool_calls == len(ALL_COMMANDS)
    # ...and each result came back as the answer to its own call.
    results = {
        n.message.tool_call_id: n.message for n in chain if n.message and n.message.role == "tool"
    }
    assert set(results) == {call.id for call in calls}
    for call, command in zip(calls, ALL_COMMANDS, strict=True):
        assert command.output in results[call.id].plain_text
    assert turns[-1].reply.plain_text == FINAL_ANSWER

    lin = linearize(tree)
    assert len(lin.samples) == 1, "the CLI's echo must continue one branch"
    assert lin.exclusions == ()
    assert all(s.reason is not LossReason.RERENDERED_HISTORY for s in lin.samples[0].spans)
    assert lin.samples[0].trained_turns == tuple(t.id for t in turns)
    assert_engine_tokens_trained(done.stack, tree, lin)
    assert_outputs_are_generations(done.stack, tree, done.agent.replies)
    stats = done.stack.renderer.stats
    assert stats.full_renders == 0
    assert stats.mismatches == 0
    assert stats.bridged == stats.checked == len(turns)  # each checked against a full render
