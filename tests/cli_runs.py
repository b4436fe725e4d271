"""Real CLI sessions on the host or in a local bubblewrap sandbox, several at once if need be,
with a hook that acts while they run (kill the CLI, close its session).

``run_cli_session`` (``cli_session.py``) runs one CLI on the host; this module runs the same
thing either there or in a sandbox, as an RL rollout does: ``harness.run`` in a
``LocalBackend`` sandbox that sees only the forwarded adapter port, with the CLI's install
bind-mounted read-only. Both reach the adapter through the recording relay, so refusals are
seen either way. What the CLI left in its working directory is copied back to the host (a
sandbox's workspace vanishes with it), so a test reads it the same way in both places.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Literal, TypeVar

import pytest

from harness import (
    AgentEndpoint,
    CliMount,
    Harness,
    InstalledCli,
    summarize_lines,
)
from protocol_adapters import AdapterConfig, RendererConfig, Session, SessionLimits
from protocol_adapters.testing import Faults
from protocol_adapters.testing.stack import LocalStack, local_stack
from sandbox import (
    KILLED_EXIT_CODE,
    EmptyWorkspace,
    ForwardedEndpoint,
    LocalBackend,
    LocalConfig,
    SandboxSpec,
)

from .cli_session import CLI_TIMEOUT, ENGINE_CONTEXT, POLICY_MODEL, CliSession, engine_logprob
from .host_cli import HostRun, host_environment
from .reading import ScriptedModel
from .recording_proxy import RecordingProxy

ModelT = TypeVar("ModelT", bound=ScriptedModel)
Where = Literal["host", "sandbox"]
WHERE = (
    pytest.param("host", id="host"),
    pytest.param("sandbox", id="sandbox", marks=pytest.mark.slow),
)
"""``@pytest.mark.parametrize("where", WHERE)``: on the host, and in a sandbox (``slow``: the
sandbox variants repeat the host's checks through harness and bubblewrap, about half of these
tests' time)."""
KILLED: dict[Where, int] = {"host": -signal.SIGKILL, "sandbox": KILLED_EXIT_CODE}
"""The CLI's exit code after ``Cli.kill``: a host process's return code after SIGKILL, and
what a sandbox reports for a process killed with SIGKILL (128 + 9)."""


@dataclass(slots=True)
class Cli:
    """One running CLI, for a test's ``during`` hook: its session, and ``kill`` (SIGKILL to
    the CLI's process group on the host, to every process of its sandbox in a sandbox), which
    sets ``killed``."""

    session: Session
    kill: Callable[[], Awaitable[None]]
    killed: bool = False


During = Callable[[Cli], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Served:
    """The adapter stack (``stack``) and the recording relay in front of it (``proxy``),
    shared by every CLI of a test."""

    stack: LocalStack
    proxy: RecordingProxy
    context: int


@contextlib.asynccontextmanager
async def serving(
    agent: ScriptedModel,
    tmp_path: Path,
    *,
    context: int = ENGINE_CONTEXT,
    config: AdapterConfig | None = None,
    faults: Faults | None = None,
) -> AsyncIterator[Served]:
    """The real adapter in front of the engine double that ``agent`` scripts, as
    ``run_cli_session`` builds it (every turn checked against a full render)."""
    config = config or AdapterConfig(limits=SessionLimits(context_tokens=context))
    async with (
        local_stack(
            agent,
            tokenizer_cache=tmp_path,  # unused: the vocabulary is given
            vocabulary=agent.vocabulary,
            config=config,
            renderer_config=RendererConfig(check_sample_rate=1.0),
            logprob=engine_logprob,
            faults=faults,
            engine_context_length=context,
        ) as stack,
        RecordingProxy(stack.server.url) as proxy,
    ):
        yield Served(stack, proxy, context)


async def run_cli(
    where: Where,
    served: Served,
    harness: Harness,
    installed: InstalledCli,
    agent: ModelT,
    directory: Path,
    *,
    task: str,
    during: During | None = None,
    name: str | None = None,
) -> CliSession[ModelT]:
    """Open a session (named ``name``) and run the CLI on ``task`` in ``where`` until it exits,
    ``during`` acting meanwhile; ``directory`` is this run's own (the CLI's working directory
    ends up in ``directory/work``, wherever it ran)."""
    session = served.stack.server.sessions.open(name or f"{harness.name}-{where}")
    directory.mkdir(parents=True, exist_ok=True)
    workdir = directory / "work"
    workdir.mkdir()
    runner = _on_host if where == "host" else _in_sandbox
    run = await runner(served, harness, installed, session, directory, task, during)
    events = summarize_lines(run.stdout.splitlines(), harness.new_tally())
    return CliSession(harness, run, events, served.stack, session, agent, workdir, served.proxy)


async def _watch(cli: Cli, during: During | None, exited: asyncio.Future[Any]) -> None:
    """Run the hook while the CLI runs. The CLI may exit before the hook is done only because
    the hook killed it (the hook then finishes); otherwise that is a failure, as is a CLI and
    hook both still waiting after ``CLI_TIMEOUT``."""
    if during is None:
        return
    hook = asyncio.ensure_future(during(cli))
    await asyncio.wait([hook, exited], timeout=CLI_TIMEOUT, return_when=asyncio.FIRST_COMPLETED)
    if not hook.done() and cli.killed:
        await hook
    if not hook.done():
        hook.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await hook
        what = "exited" if exited.done() else f"was still running after {CLI_TIMEOUT:.0f} s"
        raise AssertionError(f"the CLI {what} while the test's hook still waited")
    await hook  # its failure is the test's


async def _on_host(
    served: Served,
    harness: Harness,
    installed: InstalledCli,
    session: Session,
    directory: Path,
    task: str,
    during: During | None,
) -> HostRun:
    """As ``run_on_host``: the plan's argv, environment and files, a private TMPDIR, its own
    process group (killed with SIGKILL by ``cli.kill`` and at the end)."""
    endpoint = AgentEndpoint(served.proxy.url, session.token, POLICY_MODEL, served.context)
    plan = harness.launch(
        bin_path=PurePosixPath(installed.program_path),
        endpoint=endpoint,
        task=task,
        state_dir=PurePosixPath(directory / "state"),
    )
    tmpdir = directory / "tmp"
    tmpdir.mkdir()
    for folder in plan.dirs:
        Path(folder).mkdir(parents=True, exist_ok=True)
    for path, text in plan.files.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)
    process = await asyncio.create_subprocess_exec(
        *plan.argv,
        cwd=directory / "work",
        env=host_environment(plan, tmpdir),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )

    async def kill() -> None:
        cli.killed = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)

    cli = Cli(session, kill)
    exited = asyncio.ensure_future(process.communicate())
    try:
        await _watch(cli, during, exited)
        stdout, stderr = await asyncio.wait_for(exited, CLI_TIMEOUT)
    except TimeoutError:
        raise TimeoutError(f"{plan.argv[0]} did not exit within {CLI_TIMEOUT:.0f} s") from None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.wait()
    assert process.returncode is not None
    return HostRun(process.returncode, stdout, stderr)


async def _in_sandbox(
    served: Served,
    harness: Harness,
    installed: InstalledCli,
    session: Session,
    directory: Path,
    task: str,
    during: During | None,
) -> HostRun:
    """``harness.run`` in a fresh bubblewrap sandbox; ``cli.kill`` kills every process in the
    sandbox with SIGKILL (the CLI among them), and harness collects what the CLI wrote as it
    does for any exit. The workspace is copied to ``directory/work`` before the sandbox
    closes."""
    state = directory / "sandbox-state"
    state.mkdir()
    backend = LocalBackend(LocalConfig(state_root=state))
    mount = CliMount.under(installed, PurePosixPath(f"/opt/cli-{uuid.uuid4().hex}"))
    host, port = _host_port(served.proxy.url)
    spec = SandboxSpec(
        workspace=EmptyWorkspace(),
        network=ForwardedEndpoint(host, port),
        read_only_binds=(mount.bind,),
    )
    async with await backend.create(spec) as box:
        assert box.isolated, "the local backend must isolate (bubblewrap)"
        assert box.endpoint_url is not None
        endpoint = AgentEndpoint(box.endpoint_url, session.token, POLICY_MODEL, served.context)
        running = asyncio.ensure_future(
            harness.run(
                box, mount, endpoint, task, budget=CLI_TIMEOUT, output_dir=directory / "run"
            )
        )

        async def kill() -> None:
            cli.killed = True
            await box.kill_all()

        cli = Cli(session, kill)
        try:
            await _watch(cli, during, running)
            run = await running
        finally:
            if not running.done():  # the hook failed: harness kills the CLI on cancellation
                running.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await running
        assert not run.timed_out, f"{harness.name} did not exit within {CLI_TIMEOUT:.0f} s"
        listing = await box.exec("find . -type f -printf '%P\\n'", cwd=box.workspace)
        for name in listing.stdout.split():
            data = await box.read_file(f"{box.workspace}/{name}")
            target = directory / "work" / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    return HostRun(run.exit_code, run.events_path.read_bytes(), run.stderr_path.read_bytes())


def _host_port(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


async def run_one(
    where: Where,
    harness: Harness,
    installed: InstalledCli,
    agent: ModelT,
    tmp_path: Path,
    *,
    task: str,
    context: int = ENGINE_CONTEXT,
    config: AdapterConfig | None = None,
    faults: Faults | None = None,
    during: During | None = None,
) -> CliSession[ModelT]:
    """One CLI session on its own stack (``run_cli_session``, on the host or in a sandbox)."""
    async with serving(agent, tmp_path, context=context, config=config, faults=faults) as served:
        return await run_cli(
            where, served, harness, installed, agent, tmp_path / "cli", task=task, during=during
        )


async def received(served: Served, count: int) -> None:
    """Wait until the engine has received ``count`` requests (changing ``double.faults`` then
    changes them for the requests after those: each request reads them when it arrives)."""
    while len(served.stack.double.requests) < count:
        await asyncio.sleep(0.01)


async def generating(served: Served, session: Session, *, reply: int) -> str:
    """Wait until the ``reply``-th streamed reply of the session (counted from 1, one engine
    request each) is reaching the CLI while the engine still generates it; return its rid.
    (The adapter writes nothing of a streamed reply before the engine's first token.)"""
    streamed = served.proxy.streamed
    while len(streamed) < reply or streamed[reply - 1] == 0:
        await asyncio.sleep(0.01)
    rid = served.stack.double.requests[reply - 1].rid
    assert rid in session.in_flight, f"reply {reply} was over before the test could act"
    return rid
