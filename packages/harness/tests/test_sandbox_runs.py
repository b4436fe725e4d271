"""The real CLIs inside a local sandbox (bubblewrap when it works here), talking to a
recording endpoint on the host through the sandbox's forwarded port."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pytest
from machine_load import slowdown

from harness import (
    AgentEndpoint,
    AgentRun,
    ClaudeCode,
    CliMount,
    Codex,
    Harness,
    InstalledCli,
    LaunchError,
)
from harness.testing import RecordingEndpoint
from sandbox import (
    KILLED_EXIT_CODE,
    ForwardedEndpoint,
    GitWorkspace,
    LocalBackend,
    LocalConfig,
    ResourceLimits,
    Sandbox,
    SandboxSpec,
)

from .conftest import mount_for, processes_running_from, wait_until_gone

TOKEN = "sess-7f3a9c0d1e2b"
POLICY = "policy-under-test"
TASK = "Reply with the single word done."


@dataclass
class Agent:
    harness: Harness
    installed: InstalledCli
    path: str


@pytest.fixture(params=["claude-code", "codex"])
def agent(
    request: pytest.FixtureRequest, claude_install: InstalledCli, codex_install: InstalledCli
) -> Agent:
    if request.param == "claude-code":
        return Agent(ClaudeCode(), claude_install, "/v1/messages?beta=true")
    return Agent(Codex(), codex_install, "/v1/responses")


@dataclass
class Setup:
    box: Sandbox
    mount: CliMount
    endpoint: AgentEndpoint
    server: RecordingEndpoint


@pytest.fixture
def server_mode() -> str:
    return "answer"


@pytest.fixture
def output_cap() -> int | None:
    return ResourceLimits().max_output_bytes


@pytest.fixture
async def setup(
    backend: LocalBackend,
    agent: Agent,
    tiny_repo: tuple[Path, str],
    server_mode: str,
    output_cap: int | None,
) -> AsyncIterator[Setup]:
    repo, commit = tiny_repo
    mount = await mount_for(backend, agent.installed)
    isolated = backend.isolated
    async with RecordingEndpoint(mode="hang" if server_mode == "hang" else "answer") as server:
        spec = SandboxSpec(
            workspace=GitWorkspace(repo, commit),
            network=ForwardedEndpoint("127.0.0.1", server.port),
            read_only_binds=(mount.bind,) if isolated else (),
            limits=ResourceLimits(max_output_bytes=output_cap),
        )
        async with await backend.create(spec) as box:
            assert box.endpoint_url is not None
            endpoint = AgentEndpoint(box.endpoint_url, TOKEN, POLICY, context_window=32768)
            yield Setup(box, mount, endpoint, server)


async def run_agent(agent: Agent, setup: Setup, tmp_path: Path, budget: float) -> AgentRun:
    return await agent.harness.run(
        setup.box, setup.mount, setup.endpoint, TASK, budget=budget, output_dir=tmp_path / "out"
    )


async def test_cli_runs_in_the_sandbox_and_reaches_the_forwarded_endpoint(
    agent: Agent, setup: Setup, tmp_path: Path
) -> None:
    run = await run_agent(agent, setup, tmp_path, budget=60)
    assert (run.exit_code, run.timed_out) == (0, False), run.stderr_tail
    assert run.stats.result_text == "done"
    assert run.stats.error is None
    assert run.stats.malformed_lines == 0
    assert run.stats.main_agent_turns == 1
    assert run.ok
    requests = setup.server.requests
    assert [r.path for r in requests] == [agent.path]
    assert [(r.method, r.bearer, r.model) for r in requests] == [("POST", TOKEN, POLICY)]
    body = requests[0].body
    assert body["stream"] is True
    if isinstance(agent.harness, Codex):
        tool_names = {tool.get("name") or tool.get("type") for tool in body["tools"]}
        assert "exec_command" in tool_names
        assert tool_names.isdisjoint({"web_search", "multi_agent_v1", "create_goal"})
    else:
        assert "x-api-key" not in {key.lower() for key in requests[0].headers}
    lines = list(run.event_lines())
    assert len(lines) == run.stats.events
    assert run.events_path.parent == tmp_path / "out"
    # Nothing we configure is deprecated (Codex reports that as `error` items on stdout).
    assert not [line for line in lines if "deprecated" in line.lower()]
    assert "deprecated" not in run.stderr_path.read_text().lower()


@pytest.mark.parametrize("output_cap", [300])
async def test_an_event_stream_past_the_output_cap_is_cut_and_said_so(
    agent: Agent, setup: Setup, tmp_path: Path
) -> None:
    run = await run_agent(agent, setup, tmp_path, budget=60)
    assert run.limits_hit == ("max_output_bytes",)
    assert run.events_path.stat().st_size == 300
    assert "max_output_bytes" not in (await setup.box.exec("echo small")).limits_hit


@pytest.mark.parametrize("server_mode", ["hang"])
async def test_a_hung_endpoint_is_killed_at_the_budget(
    agent: Agent, setup: Setup, tmp_path: Path
) -> None:
    budget = 4.0
    started = time.monotonic()
    run = await run_agent(agent, setup, tmp_path, budget=budget)
    elapsed = time.monotonic() - started
    # The CLI reached the endpoint, then waited on it until our budget ran out.
    assert [r.path for r in setup.server.requests][:1] == [agent.path]
    assert run.timed_out
    assert run.exit_code == KILLED_EXIT_CODE
    assert not run.ok
    # Killing the CLI and reading what it left take seconds at most, more on a busy machine.
    busy = slowdown()
    assert budget <= run.duration < budget + 3 * busy
    assert elapsed < budget + 5 * busy
    # Nothing of the CLI is left, checked before the sandbox closes (the budget did it).
    assert await wait_until_gone(str(setup.mount.sandbox_prefix)) == []
    assert run.stats.result_text is None


@pytest.mark.parametrize("server_mode", ["hang"])
async def test_cancelling_a_run_kills_the_agent(agent: Agent, setup: Setup, tmp_path: Path) -> None:
    task = asyncio.create_task(run_agent(agent, setup, tmp_path, budget=120))
    await setup.server.wait_for_request(timeout=30)
    assert processes_running_from(str(setup.mount.sandbox_prefix)) != []
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await wait_until_gone(str(setup.mount.sandbox_prefix)) == []


async def test_the_cli_install_is_read_only_inside(
    agent: Agent, setup: Setup, backend: LocalBackend
) -> None:
    if not backend.isolated:
        pytest.skip("without bubblewrap the install is the host directory itself (no bind)")
    target = setup.mount.sandbox_prefix / "node_modules" / ".bin"
    result = await setup.box.exec(f"touch {target}/planted || rm -f {setup.mount.bin_path}")
    assert result.exit_code != 0
    assert "Read-only file system" in result.stderr
    assert setup.mount.installed.bin_path.exists()
    assert not (setup.mount.installed.bin_path.parent / "planted").exists()


async def test_bad_run_arguments_fail_before_anything_starts(
    agent: Agent, setup: Setup, tmp_path: Path, claude_install: InstalledCli
) -> None:
    with pytest.raises(ValueError, match="budget"):
        await run_agent(agent, setup, tmp_path, budget=0)
    with pytest.raises(LaunchError, match="empty task"):
        await agent.harness.run(
            setup.box, setup.mount, setup.endpoint, "  ", budget=5, output_dir=tmp_path / "x"
        )
    other = CliMount.at_host_path(claude_install)
    if not isinstance(agent.harness, ClaudeCode):
        with pytest.raises(LaunchError, match="pins"):
            await agent.harness.run(
                setup.box, other, setup.endpoint, TASK, budget=5, output_dir=tmp_path / "x"
            )
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "events.jsonl").write_text("earlier run\n")
    with pytest.raises(FileExistsError, match="own output directory"):
        await agent.harness.run(
            setup.box, setup.mount, setup.endpoint, TASK, budget=5, output_dir=tmp_path / "used"
        )
    assert (tmp_path / "used" / "events.jsonl").read_text() == "earlier run\n"
    assert setup.server.requests == []


async def test_a_non_isolated_run_leaves_no_per_run_state_on_the_host(
    tmp_path: Path, claude_install: InstalledCli
) -> None:
    # The loud plain-process fallback: the run's HOME is a real host directory.
    host_backend = LocalBackend(LocalConfig(isolation="none", state_root=tmp_path))
    state_root = tmp_path / "agent-state"
    async with RecordingEndpoint() as server:
        spec = SandboxSpec(network=ForwardedEndpoint("127.0.0.1", server.port))
        async with await host_backend.create(spec) as box:
            assert box.endpoint_url is not None
            run = await ClaudeCode().run(
                box,
                CliMount.at_host_path(claude_install),
                AgentEndpoint(box.endpoint_url, TOKEN, POLICY, 32768),
                TASK,
                budget=60,
                output_dir=tmp_path / "out",
                state_root=PurePosixPath(state_root),
            )
    assert run.ok, run.stderr_tail
    assert [r.bearer for r in server.requests] == [TOKEN]
    assert list(state_root.iterdir()) == []
