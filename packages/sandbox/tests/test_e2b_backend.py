"""The E2B backend through the real e2b SDK against a local fake of E2B's wire (e2b_fake.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path, PurePosixPath

import pytest
from machine_load import slowdown

from sandbox import (
    DirectoryWorkspace,
    E2BTemplate,
    ForwardedEndpoint,
    GitWorkspace,
    ImageWorkspace,
    RegistryImage,
    ResourceLimits,
    RootfsImage,
    SandboxBootError,
    SandboxCommandError,
    SandboxFileNotFoundError,
    SandboxSpec,
    UnsupportedSpecError,
)
from sandbox._e2b_backend import E2BBackend, E2BConfig, E2BSandbox, exit_code_from_envd

from .e2b_fake import FakeState, backend_config, serve_fake_e2b
from .host_processes import host_pids_with, unique_sleep, wait_for_process


@pytest.fixture
def state(tmp_path: Path) -> FakeState:
    home = tmp_path / "home"
    home.mkdir()
    return FakeState(home=home)


@pytest.fixture
async def config(state: FakeState, tmp_path: Path) -> AsyncIterator[E2BConfig]:
    async with serve_fake_e2b(state) as url:
        yield backend_config(url, tmp_path)


@pytest.fixture
async def box(config: E2BConfig) -> AsyncIterator[E2BSandbox]:
    async with await E2BBackend(config).create(SandboxSpec(env={"GREETING": "hi"})) as sandbox:
        yield sandbox


async def test_create_makes_the_workspace_and_close_kills(
    config: E2BConfig, state: FakeState
) -> None:
    sandbox = await E2BBackend(config).create(SandboxSpec())
    assert Path(sandbox.workspace).is_dir()
    await sandbox.close()
    await sandbox.close()
    assert state.delete_requests == state.killed_sandboxes == [sandbox.sandbox_id]


async def test_forwarded_endpoint_is_reached_at_its_own_address(config: E2BConfig) -> None:
    # What the egress allow-list says is checked by the escape suite.
    spec = SandboxSpec(network=ForwardedEndpoint("10.1.2.3", 8000))
    async with await E2BBackend(config).create(spec) as sandbox:
        assert sandbox.endpoint_url == "http://10.1.2.3:8000"


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
    assert time.monotonic() - started < 10 * slowdown()
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


async def test_start_argv_passes_each_argument_verbatim_through_envds_shell(
    box: E2BSandbox,
) -> None:
    """envd has only a shell to start programs with: the argv is quoted into it, `unset_env`
    dropped by the shell itself, `env` winning over it."""
    words = ["a b", "$HOME", "it's", "*", "-n"]
    echo = await box.start_argv(["/usr/bin/printf", "[%s]", *words])
    assert (await echo.wait(timeout=10)).stdout == "".join(f"[{word}]" for word in words)
    listing = await box.start_argv(
        ["/usr/bin/env"], env={"ADDED": "call", "KEPT": "call"}, unset_env=("GREETING", "KEPT")
    )
    variables = dict(
        line.split("=", 1) for line in (await listing.wait(timeout=10)).stdout.splitlines()
    )
    assert "GREETING" not in variables
    assert (variables["ADDED"], variables["KEPT"]) == ("call", "call")
    assert box.host_program_argv("/opt/tool") == ("/opt/tool",)


async def test_files_round_trip_and_missing_file(box: E2BSandbox) -> None:
    await box.write_file("sub/dir/data.bin", bytes(range(256)))
    assert await box.read_file("sub/dir/data.bin") == bytes(range(256))
    await box.write_file(f"{box.workspace}/t.txt", "héllo")
    assert await box.read_text("t.txt") == "héllo"
    with pytest.raises(SandboxFileNotFoundError) as caught:
        await box.read_file("missing.txt")
    assert isinstance(caught.value, FileNotFoundError)


async def test_reads_refuse_what_is_not_a_small_regular_file(box: E2BSandbox) -> None:
    await box.exec("mkfifo pipe && ln -s /dev/zero zero && head -c 3000 /dev/zero > big")
    for path in ("pipe", "zero"):
        with pytest.raises(SandboxCommandError, match="not a regular file"):
            await asyncio.wait_for(box.read_file(path), 30)
    with pytest.raises(SandboxCommandError, match="larger than max_bytes"):
        await box.read_file("big", max_bytes=2999)
    assert len(await box.read_file("big", max_bytes=3000)) == 3000


async def test_output_past_the_cap_is_dropped_and_reported(config: E2BConfig) -> None:
    spec = SandboxSpec(limits=ResourceLimits(max_output_bytes=1000))
    async with await E2BBackend(config).create(spec) as sandbox:
        result = await sandbox.exec("head -c 5000 /dev/zero | tr '\\0' x; echo done >&2")
        assert result.stdout == "x" * 1000
        assert result.stderr == "done\n"
        assert result.limits_hit == ("max_output_bytes",)
        process = await sandbox.start("head -c 5000 /dev/zero | tr '\\0' y")
        assert "max_output_bytes" in (await process.wait(30)).limits_hit
        assert process.stdout_path.read_text() == "y" * 1000


async def test_directory_workspace_is_uploaded(config: E2BConfig, tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "pkg").mkdir(parents=True)
    (source / "pkg" / "mod.py").write_text("X = 1\n")
    spec = SandboxSpec(workspace=DirectoryWorkspace(source))
    async with await E2BBackend(config).create(spec) as sandbox:
        assert await sandbox.read_text("pkg/mod.py") == "X = 1\n"


async def test_a_task_template_is_booted_and_its_directory_is_the_workspace(
    config: E2BConfig, state: FakeState, tmp_path: Path
) -> None:
    """A task's own environment on E2B: its template (built from the task's image), and the
    workspace where the template keeps the repository."""
    testbed = tmp_path / "testbed"
    testbed.mkdir()
    (testbed / "calc.py").write_text("X = 1\n")
    spec = SandboxSpec(
        image=E2BTemplate("swe-task-42"), workspace=ImageWorkspace(PurePosixPath(str(testbed)))
    )
    async with await E2BBackend(config).create(spec) as sandbox:
        assert sandbox.workspace == str(testbed)
        assert await sandbox.read_text("calc.py") == "X = 1\n"
    assert [request["templateID"] for request in state.create_requests] == ["swe-task-42"]
    missing = SandboxSpec(
        image=E2BTemplate("swe-task-42"), workspace=ImageWorkspace(PurePosixPath("/no/such"))
    )
    with pytest.raises(SandboxBootError, match="no directory /no/such"):
        await E2BBackend(config).create(missing)
    assert state.delete_requests == state.killed_sandboxes  # the refused one killed too


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
        SandboxSpec(image=RegistryImage("python:3.11")),
        SandboxSpec(image=RootfsImage(Path("/srv/root"))),
        SandboxSpec(image=E2BTemplate("task"), workspace=ImageWorkspace()),
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


# -- cancellation: nothing is left running, whichever await a cancellation hits ----------------


async def _until(condition: Callable[[], object], what: str) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting until {what}")


async def test_create_cancelled_mid_boot_kills_the_sandbox_that_boot_makes(
    config: E2BConfig, state: FakeState
) -> None:
    state.create_delay = 0.5  # the boot finishes well after the cancellation
    creating = asyncio.create_task(E2BBackend(config).create(SandboxSpec()))
    await _until(lambda: state.creating == 1, "the boot is under way")
    creating.cancel()
    with pytest.raises(asyncio.CancelledError):
        await creating
    # By the time the cancellation surfaces, the sandbox booted for our key is already dead.
    (key,) = set(state.idempotency_keys)
    booted = state.booted_with(key)
    assert not booted.running
    assert state.killed_sandboxes == [booted.sandbox_id]
    assert state.running() == []


async def test_create_cancelled_before_its_request_left_boots_nothing(
    config: E2BConfig, state: FakeState
) -> None:
    state.create_delay = 0.3
    backend = E2BBackend(dataclasses.replace(config, max_concurrent_boots=1))
    first = asyncio.create_task(backend.create(SandboxSpec()))
    await _until(lambda: state.creating == 1, "the first boot is under way")
    queued = asyncio.create_task(backend.create(SandboxSpec()))
    await asyncio.sleep(0.05)  # waiting for a boot slot, nothing sent yet
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    async with await first:
        pass
    assert len(state.create_requests) == 1  # no request, so nothing to reap


async def test_create_cancelled_while_preparing_the_workspace_kills_the_sandbox(
    config: E2BConfig, state: FakeState, tmp_path: Path
) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "a.txt").write_text("a\n")
    state.envd_delay = 0.3  # the sandbox is up; its workspace is slow to prepare
    spec = SandboxSpec(workspace=DirectoryWorkspace(source))
    creating = asyncio.create_task(E2BBackend(config).create(spec))
    await _until(lambda: state.sandboxes, "the sandbox is booted")
    await asyncio.sleep(0.1)
    creating.cancel()
    with pytest.raises(asyncio.CancelledError):
        await creating
    (sandbox_id,) = state.sandboxes
    assert state.killed_sandboxes == [sandbox_id]
    assert not list(tmp_path.glob("e2b-sandbox-*"))


async def test_a_boot_given_up_on_is_reaped_once_it_finishes(
    config: E2BConfig, state: FakeState
) -> None:
    # Every attempt outlives our deadline or finds the first one still in progress (409).
    state.create_delay = 0.6
    slow = dataclasses.replace(config, boot_timeout=0.2, reap_timeout=10.0)
    with pytest.raises(SandboxBootError, match="after 3 attempts"):
        await E2BBackend(slow).create(SandboxSpec())
    (key,) = set(state.idempotency_keys)
    assert state.killed_sandboxes == [state.booted_with(key).sandbox_id]
    assert state.running() == []


@pytest.mark.parametrize("moment", ["before the request is sent", "while E2B kills"])
async def test_a_cancelled_close_still_kills_before_it_reraises(
    config: E2BConfig, state: FakeState, moment: str
) -> None:
    sandbox = await E2BBackend(config).create(SandboxSpec())
    marker = unique_sleep()
    await sandbox.start(f"sleep {marker}")
    await wait_for_process(marker)
    state.kill_delay = 0.3
    closing = asyncio.create_task(sandbox.close())
    if moment == "before the request is sent":
        await asyncio.sleep(0)
    else:
        await _until(lambda: state.delete_requests, "the DELETE arrived")
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert state.killed_sandboxes == [sandbox.sandbox_id]
    assert host_pids_with(marker) == []
    await sandbox.close()  # idempotent: no second DELETE
    assert state.delete_requests == [sandbox.sandbox_id]


@pytest.mark.parametrize(
    ("call", "moment"),
    [
        ("exec", "while envd reports its start"),
        ("exec", "while it runs"),
        # A started process outlives start() by design; only its start can be cancelled.
        ("start", "while envd reports its start"),
    ],
)
async def test_a_cancelled_command_is_killed_before_the_cancellation_surfaces(
    box: E2BSandbox, state: FakeState, call: str, moment: str
) -> None:
    if moment == "while envd reports its start":
        state.start_delay = 0.5
    marker = unique_sleep()
    launch = box.exec if call == "exec" else box.start
    running = asyncio.create_task(launch(f"sleep {marker}"))
    await wait_for_process(marker)
    if moment == "while it runs":
        await asyncio.sleep(0.3)  # the start event has long reached us: exec is waiting
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert host_pids_with(marker) == []
