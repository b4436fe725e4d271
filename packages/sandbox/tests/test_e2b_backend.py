"""The E2B backend through the real e2b SDK against a local fake of E2B's wire (e2b_fake.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandbox.e2b_backend import E2BBackend, E2BConfig, E2BSandbox, exit_code_from_envd
from sandbox.errors import SandboxBootError, SandboxFileNotFoundError, UnsupportedSpecError
from sandbox.retry import RetryPolicy
from sandbox.spec import (
    DirectoryWorkspace,
    ForwardedEndpoint,
    GitWorkspace,
    ResourceLimits,
    SandboxSpec,
)

from .e2b_fake import FakeState, serve_fake_e2b

FAST_RETRY = RetryPolicy(attempts=3, initial_delay=0.01, multiplier=2.0, max_delay=0.05)


@pytest.fixture
def state(tmp_path: Path) -> FakeState:
    home = tmp_path / "home"
    home.mkdir()
    return FakeState(home=home)


@pytest.fixture
async def config(state: FakeState, tmp_path: Path) -> AsyncIterator[E2BConfig]:
    async with serve_fake_e2b(state) as url:
        yield E2BConfig(
            api_key="e2b_test_key",
            api_url=url,
            sandbox_url=url,
            http_version="1.1",
            request_timeout=10.0,
            boot_retry=FAST_RETRY,
            workspace_path=str(tmp_path / "workspace"),
            output_root=tmp_path,
        )


@pytest.fixture
async def box(config: E2BConfig) -> AsyncIterator[E2BSandbox]:
    async with await E2BBackend(config).create(SandboxSpec(env={"GREETING": "hi"})) as sandbox:
        yield sandbox


async def test_create_sends_the_spec_and_close_kills(config: E2BConfig, state: FakeState) -> None:
    sandbox = await E2BBackend(config).create(SandboxSpec())
    assert state.create_requests[0]["allow_internet_access"] is False
    assert Path(sandbox.workspace).is_dir()
    await sandbox.close()
    await sandbox.close()
    assert state.killed_sandboxes == [sandbox.sandbox_id]


async def test_forwarded_endpoint_maps_to_an_egress_allow_list(
    config: E2BConfig, state: FakeState
) -> None:
    spec = SandboxSpec(network=ForwardedEndpoint("10.1.2.3", 8000))
    async with await E2BBackend(config).create(spec) as sandbox:
        assert sandbox.endpoint_url == "http://10.1.2.3:8000"
    network = state.create_requests[0]["network"]
    assert network["allowOut"] == ["10.1.2.3"]
    assert network["denyOut"] == ["0.0.0.0/0"]


async def test_run_reports_output_and_exit_codes(box: E2BSandbox) -> None:
    ok = await box.exec("echo $GREETING; echo oops >&2; pwd")
    assert (ok.exit_code, ok.stdout, ok.stderr, ok.timed_out) == (
        0,
        f"hi\n{box.workspace}\n",
        "oops\n",
        False,
    )
    failed = await box.exec("echo partial; exit 7", env={"X": "1"})
    assert (failed.exit_code, failed.stdout, failed.timed_out) == (7, "partial\n", False)
    killed = await box.exec("kill -9 $$")
    assert (killed.exit_code, killed.timed_out) == (137, False)


async def test_timeout_kills_the_command_and_its_children(box: E2BSandbox, tmp_path: Path) -> None:
    marker = tmp_path / "child.pid"
    started = time.monotonic()
    result = await box.exec(f"sleep 30 & echo $! > {marker}; echo before; wait", timeout=0.5)
    assert result.timed_out
    assert result.exit_code == 137
    assert result.stdout == "before\n"
    assert time.monotonic() - started < 10
    child = int(marker.read_text())
    await _until_gone(child)


async def test_background_process_wait_and_kill(box: E2BSandbox) -> None:
    quick = await box.start("echo one; sleep 0.2; echo two >&2")
    done = await quick.wait(timeout=10)
    assert (done.exit_code, done.stdout, done.stderr) == (0, "one\n", "two\n")
    assert quick.stdout_path.read_text() == "one\n"

    slow = await box.start("echo started; exec sleep 60")
    await asyncio.sleep(0.3)
    assert slow.stdout_path.read_text() == "started\n"
    await slow.kill()
    killed = await slow.wait()
    assert (killed.exit_code, killed.timed_out) == (137, False)
    await _until_gone(slow.pid)

    budget = await box.start("sleep 60")
    over = await budget.wait(timeout=0.3)
    assert (over.exit_code, over.timed_out) == (137, True)


async def test_files_round_trip_and_missing_file(box: E2BSandbox) -> None:
    await box.write_file("sub/dir/data.bin", bytes(range(256)))
    assert await box.read_file("sub/dir/data.bin") == bytes(range(256))
    await box.write_file(f"{box.workspace}/t.txt", "héllo")
    assert await box.read_text("t.txt") == "héllo"
    with pytest.raises(SandboxFileNotFoundError) as caught:
        await box.read_file("missing.txt")
    assert isinstance(caught.value, FileNotFoundError)


async def test_directory_workspace_is_uploaded(config: E2BConfig, tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "pkg").mkdir(parents=True)
    (source / "pkg" / "mod.py").write_text("X = 1\n")
    spec = SandboxSpec(workspace=DirectoryWorkspace(source))
    async with await E2BBackend(config).create(spec) as sandbox:
        assert await sandbox.read_text("pkg/mod.py") == "X = 1\n"


async def test_boot_failure_is_retried_with_backoff(config: E2BConfig, state: FakeState) -> None:
    state.fail_creates = 2
    async with await E2BBackend(config).create(SandboxSpec()) as sandbox:
        assert (await sandbox.exec("true")).ok
    assert len(state.create_requests) == 3
    # One idempotency key across attempts: a retry can never leak a second sandbox.
    assert len(set(state.idempotency_keys)) == 1
    assert state.idempotency_keys[0]


async def test_boot_failure_gives_up_after_the_policy(config: E2BConfig, state: FakeState) -> None:
    state.fail_creates = 10
    with pytest.raises(SandboxBootError, match="after 3 attempts"):
        await E2BBackend(config).create(SandboxSpec())
    assert len(state.create_requests) == 3


@pytest.mark.parametrize(
    "spec",
    [
        SandboxSpec(workspace=GitWorkspace(Path("/repo"), "abc1234")),
        SandboxSpec(limits=ResourceLimits(max_open_files=10)),
    ],
)
async def test_unsupported_specs_are_refused(config: E2BConfig, spec: SandboxSpec) -> None:
    with pytest.raises(UnsupportedSpecError):
        await E2BBackend(config).create(spec)


@pytest.mark.parametrize(
    ("code", "error", "expected"),
    [
        (0, None, 0),
        (3, "exit status 3", 3),
        (-1, "signal: killed", 137),
        (-1, "signal: terminated", 143),
        (-1, None, 137),
    ],
)
def test_envd_exit_codes_map_to_shell_convention(
    code: int, error: str | None, expected: int
) -> None:
    assert exit_code_from_envd(code, error) == expected


async def _until_gone(pid: int) -> None:
    for _ in range(200):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"process {pid} still alive")


async def test_boots_are_bounded_and_carry_metadata(config: E2BConfig, state: FakeState) -> None:
    state.create_delay = 0.05
    bounded = dataclasses.replace(config, max_concurrent_boots=2, metadata={"run": "r1"})
    backend = E2BBackend(bounded)
    sandboxes = await asyncio.gather(*(backend.create(SandboxSpec()) for _ in range(6)))
    for sandbox in sandboxes:
        await sandbox.close()
    assert len(state.create_requests) == 6
    assert state.max_creating == 2
    assert all(r.get("metadata") == {"run": "r1"} for r in state.create_requests)
