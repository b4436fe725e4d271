"""The escape suite against the E2B backend, as far as its fake allows.

On E2B the boundary is the virtual machine: every sandbox is its own Firecracker microVM with
its own kernel, file system, process table and network stack, and its egress firewall sits on
the host side, out of the guest's reach (docs/e2b.md). The fake (e2b_fake.py) runs commands as
plain host processes on the host's file system and network, so the local suite's attacks on
privileges, file systems, the kernel, namespaces, seccomp and loopback (test_escape.py) would
probe this test machine, not E2B, and are left out.

What is tested here is what our backend decides and E2B then enforces: the network the create
request asks for, the environment that reaches a command, that `close()` leaves no process
behind (the fake's DELETE kills like a VM's death), and that one sandbox's API reaches only its
own sandbox. Each check looks at what the fake received or at the host's /proc, not only at
what a command printed.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandbox import (
    E2BBackend,
    E2BConfig,
    E2BSandbox,
    ForwardedEndpoint,
    SandboxFileNotFoundError,
    SandboxSpec,
)

from .e2b_fake import FakeState, backend_config, serve_fake_e2b
from .host_processes import host_pids_with, unique_sleep, until_no_process, wait_for_process


@pytest.fixture
def state(tmp_path: Path) -> FakeState:
    home = tmp_path / "home"
    home.mkdir()
    return FakeState(home=home)


@pytest.fixture
async def fake_url(state: FakeState) -> AsyncIterator[str]:
    async with serve_fake_e2b(state) as url:
        yield url


@pytest.fixture
def config(fake_url: str, tmp_path: Path) -> E2BConfig:
    return backend_config(fake_url, tmp_path)


async def attack(box: E2BSandbox, script: str) -> str:
    """Run `script` inside; return its stdout, where each attack prints what it achieved."""
    result = await box.exec(script, timeout=30)
    assert not result.timed_out, f"attack hung:\n{script}"
    return result.stdout


# -- the network the sandbox is given -----------------------------------------------------------


async def test_no_network_asks_for_no_egress_and_no_public_ingress(
    config: E2BConfig, state: FakeState
) -> None:
    async with await E2BBackend(config).create(SandboxSpec()) as box:
        assert box.endpoint_url is None
    (request,) = state.create_requests
    assert request["allow_internet_access"] is False
    assert request["network"] == {"allowPublicTraffic": False}


async def test_a_forwarded_endpoint_is_the_only_egress(config: E2BConfig, state: FakeState) -> None:
    spec = SandboxSpec(network=ForwardedEndpoint("203.0.113.7", 8000))
    async with await E2BBackend(config).create(spec) as box:
        assert box.endpoint_url == "http://203.0.113.7:8000"
    (request,) = state.create_requests
    assert request["network"] == {
        "allowOut": ["203.0.113.7"],  # allow beats deny in E2B's firewall
        "denyOut": ["0.0.0.0/0"],
        "allowPublicTraffic": False,
    }
    assert "allow_internet_access" not in request


# -- the environment a command sees ---------------------------------------------------------------


async def test_the_host_environment_does_not_leak(
    config: E2BConfig, state: FakeState, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = f"sk-escape-{uuid.uuid4().hex}"
    monkeypatch.setenv("ANTHROPIC_API_KEY", secret)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    spec = SandboxSpec(env={"SPEC_VAR": "from-spec"})
    script = "env; tr '\\0' '\\n' < /proc/self/environ"
    async with await E2BBackend(config).create(spec) as box:
        printed = await attack(box, script)
        detached = await box.start(script, env={"CMD_VAR": "from-command"})
        printed += (await detached.wait(timeout=30)).stdout
        received = [c for c in state.started if c.sandbox_id == box.sandbox_id]
    # What envd was sent: the spec's env, plus a command's own env for that command only.
    by_script = [c.envs for c in received if script in c.args]
    assert by_script == [
        {"SPEC_VAR": "from-spec"},
        {"SPEC_VAR": "from-spec", "CMD_VAR": "from-command"},
    ]
    assert all(c.envs == {"SPEC_VAR": "from-spec"} for c in received if script not in c.args)
    assert secret not in json.dumps(state.create_requests)
    # What the processes saw: the variables we sent arrived, the host's did not.
    assert "SPEC_VAR=from-spec" in printed
    assert "CMD_VAR=from-command" in printed
    assert secret not in printed


# -- nothing survives close -----------------------------------------------------------------------


async def test_nothing_survives_close(config: E2BConfig, state: FakeState, tmp_path: Path) -> None:
    box = await E2BBackend(config).create(SandboxSpec())
    markers = [unique_sleep() for _ in range(5)]
    # Each one lets go of the command's output: envd, like the fake, ends a command only once
    # its output pipes close.
    await attack(
        box,
        f"setsid sleep {markers[0]} </dev/null >/dev/null 2>&1 & "
        f"nohup sleep {markers[1]} </dev/null >/dev/null 2>&1 & "
        f"(setsid bash -c '(sleep {markers[2]} &)' </dev/null >/dev/null 2>&1 &) ; "
        f"trap '' HUP TERM; bash -c 'trap \"\" TERM HUP; exec -a x{markers[3]} sleep 10000' "
        "</dev/null >/dev/null 2>&1 &",
    )
    await box.start(f"sleep {markers[4]}")  # detached, never waited for
    for marker in markers:
        await wait_for_process(marker)
    await box.close()
    for marker in markers:
        await until_no_process(marker)
    assert state.killed_sandboxes == [box.sandbox_id]
    assert not list(tmp_path.glob("e2b-sandbox-*"))  # the detached output files are gone too


# -- one sandbox's API reaches only that sandbox --------------------------------------------------


async def test_a_sandbox_cannot_reach_another_through_the_api(
    fake_url: str, state: FakeState, tmp_path: Path
) -> None:
    # The fake shares the host's file system, so each sandbox gets its own workspace path; on
    # E2B the same path lies on two separate disks.
    backends = [
        E2BBackend(backend_config(fake_url, tmp_path, workspace_path=str(tmp_path / name)))
        for name in ("one", "two")
    ]
    marker = unique_sleep()
    async with (
        await backends[0].create(SandboxSpec()) as one,
        await backends[1].create(SandboxSpec()) as two,
    ):
        await two.write_file("secret.txt", "two's secret\n")
        theirs = await two.start(f"sleep {marker}")
        await wait_for_process(marker)

        with pytest.raises(SandboxFileNotFoundError):
            await one.read_file("secret.txt")
        assert await attack(one, "ls -A; cat secret.txt") == ""
        # envd's process API, as one's connection presents it, sees and signals only one's own.
        assert theirs.pid not in {p.pid for p in await one._sdk.commands.list()}
        assert not await one._sdk.commands.kill(theirs.pid)

        await one.close()
        assert host_pids_with(marker), "closing one killed a process of two"
        assert (await two.read_text("secret.txt")) == "two's secret\n"
    await until_no_process(marker)
    assert state.killed_sandboxes == [one.sandbox_id, two.sandbox_id]
