"""`kill_all` and `run_python` of the E2B backend, through the real e2b SDK against the fake.

The fake (e2b_fake.py) runs commands as host processes on the host's disk, so each check looks
at the host's /proc and files, not only at what a command printed. `capture_diff`, which
needs the task's repository mounted read-only inside, refuses an E2B sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import re
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from machine_load import slowdown

from sandbox import (
    E2BBackend,
    E2BConfig,
    E2BSandbox,
    Sandbox,
    SandboxClosedError,
    SandboxCommandError,
    SandboxSpec,
    UnsupportedSpecError,
    capture_diff,
)
from sandbox._e2b_backend import _OutputSink

from .e2b_fake import FakeState, backend_config, serve_fake_e2b
from .host_processes import host_pids_with, unique_sleep, until_no_process, wait_for_process


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


async def envd_lists(box: E2BSandbox) -> list[int]:
    return [process.pid for process in await box._sdk.commands.list()]


def sleeps(duration: str) -> list[int]:
    """Live host pids running exactly `sleep DURATION` (not a shell whose line names it)."""
    found = []
    for pid in host_pids_with(duration):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/cmdline").read_bytes() == f"sleep\0{duration}\0".encode():
                found.append(pid)
    return found


async def wait_for_sleep(duration: str) -> int:
    for _ in range(300):
        if found := sleeps(duration):
            (pid,) = found
            return pid
        await asyncio.sleep(0.01)
    raise AssertionError(f"no `sleep {duration}` appeared")


async def test_the_e2b_sandbox_satisfies_the_protocol(box: E2BSandbox) -> None:
    typed: Sandbox = box  # checked statically by mypy, at run time below
    assert isinstance(typed, Sandbox)


# -- kill_all ---------------------------------------------------------------------------------


async def test_kill_all_kills_commands_their_children_and_daemons(box: E2BSandbox) -> None:
    started, child, daemon = unique_sleep(), unique_sleep(), unique_sleep()
    detached = await box.start(f"sleep {started}")
    parent = await box.start(f"sleep {child} & echo up; wait")
    # A daemon that left envd's process tree: envd does not list it.
    await box.exec(f"setsid sleep {daemon} </dev/null >/dev/null 2>&1 &")
    for marker in (started, child, daemon):
        await wait_for_process(marker)
    assert await wait_for_sleep(daemon) not in await envd_lists(box)

    await box.kill_all()

    for marker in (started, child, daemon):
        assert host_pids_with(marker) == []
    assert await envd_lists(box) == []
    for process in (detached, parent):
        killed = await process.wait(timeout=10)
        assert (killed.exit_code, killed.timed_out) == (137, False)
    again = await box.exec("echo still here")
    assert (again.exit_code, again.stdout) == (0, "still here\n")
    await box.kill_all()  # nothing left to kill is not a failure


async def test_kill_all_leaves_other_sandboxes_alone(config: E2BConfig, box: E2BSandbox) -> None:
    async with await E2BBackend(config).create(SandboxSpec()) as other:
        mine, theirs = unique_sleep(), unique_sleep()
        await box.start(f"sleep {mine}")
        await other.start(f"setsid sleep {theirs} </dev/null >/dev/null 2>&1 & wait")
        await wait_for_process(mine)
        daemon = await wait_for_sleep(theirs)
        await box.kill_all()
        assert host_pids_with(mine) == []
        assert sleeps(theirs) == [daemon]
        assert (await other.exec("true")).ok


async def test_a_daemon_that_dropped_the_sandbox_id_survives_kill_all(box: E2BSandbox) -> None:
    # The documented gap: outside envd's process tree and without E2B_SANDBOX_ID, nothing
    # finds it (the fake's own kill cannot either, so the test kills it itself).
    marker = unique_sleep()
    await box.exec(f"env -i setsid sleep {marker} </dev/null >/dev/null 2>&1 &")
    escaped = await wait_for_sleep(marker)
    try:
        await box.kill_all()
        assert sleeps(marker) == [escaped]
    finally:
        os.kill(escaped, signal.SIGKILL)
        await until_no_process(marker)


async def test_kill_all_reports_what_envd_still_lists_at_its_deadline(
    config: E2BConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A process envd keeps listing whatever is sent to it (pid 999999999 never exists).
    quick = dataclasses.replace(config, kill_timeout=1.0)
    async with await E2BBackend(quick).create(SandboxSpec()) as sandbox:
        listing = sandbox._sdk.commands.list

        async def with_a_survivor(**kwargs: Any) -> list[Any]:
            return [*await listing(**kwargs), SimpleNamespace(pid=999999999)]

        monkeypatch.setattr(sandbox._sdk.commands, "list", with_a_survivor)
        begun = time.monotonic()
        with pytest.raises(SandboxCommandError, match="envd lists \\[999999999\\]"):
            await sandbox.kill_all()
        assert time.monotonic() - begun < 5 * slowdown()
        monkeypatch.undo()
        assert (await sandbox.exec("true")).ok


async def test_kill_all_on_a_closed_sandbox_is_refused(config: E2BConfig) -> None:
    sandbox = await E2BBackend(config).create(SandboxSpec())
    await sandbox.close()
    with pytest.raises(SandboxClosedError):
        await sandbox.kill_all()
    with pytest.raises(SandboxClosedError):
        await sandbox.run_python("pass")


# -- run_python -------------------------------------------------------------------------------

REPORT = """
import json, os, sys
json.dump({
    "env": dict(os.environ),
    "isolated": sys.flags.isolated,
    "no_site": sys.flags.no_site,
    "cwd": os.getcwd(),
    "argv": sys.argv[1:],
}, sys.stdout)
"""


async def test_run_python_is_isolated_in_an_empty_environment(box: E2BSandbox) -> None:
    args = ["a b", "'quoted'", "$HOME", "--flag", ""]
    result = await box.run_python(REPORT, args)
    assert result.ok
    assert (result.exit_code, result.timed_out, result.truncated) == (0, False, False)
    report = json.loads(result.stdout)
    # env -i removes envd's E2B_SANDBOX / E2B_SANDBOX_ID and the spec's GREETING alike.
    assert report["env"] == {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C.UTF-8"}
    assert (report["isolated"], report["no_site"]) == (1, 1)
    assert report["cwd"] == "/"
    assert report["argv"] == args


async def test_run_python_carries_bytes_both_ways(box: E2BSandbox, state: FakeState) -> None:
    data = bytes(range(256)) * 64
    echo = "import sys; sys.stdout.buffer.write(sys.stdin.buffer.read())"
    echoed = await box.run_python(echo, stdin=data)
    assert (echoed.ok, echoed.stdout) == (True, data)
    written = await box.run_python("import sys; sys.stdout.buffer.write(bytes(range(256)))")
    assert (written.ok, written.stdout) == (True, bytes(range(256)))
    silent = await box.run_python(echo)
    assert (silent.ok, silent.stdout) == (True, b"")
    # Every temporary file (stdin, stdout) named in the commands envd ran is gone again.
    commands = " ".join(" ".join(started.args) for started in state.started)
    temporary = set(re.findall(r"/tmp/sandbox-script-[0-9a-f]+\.(?:in|out)", commands))
    assert len(temporary) >= 4
    assert not [path for path in temporary if Path(path).exists()]


async def test_run_python_reports_exit_code_and_bounded_stderr(box: E2BSandbox) -> None:
    failed = await box.run_python("import sys; sys.stderr.write('boom'); sys.exit(5)")
    assert (failed.exit_code, failed.stderr, failed.ok) == (5, "boom", False)
    loud = await box.run_python("import sys; sys.stderr.write('e' * (1 << 20))")
    assert loud.ok
    assert loud.stderr == "e" * (64 << 10)


async def test_run_python_truncates_stdout_at_the_bound(box: E2BSandbox) -> None:
    script = "import sys; sys.stdout.buffer.write(bytes(range(256)) * 8)"
    cut = await box.run_python(script, max_output_bytes=100)
    assert (cut.exit_code, cut.stdout, cut.truncated, cut.ok) == (0, bytes(range(100)), True, False)
    exact = await box.run_python(script, max_output_bytes=2048)
    assert (exact.stdout, exact.truncated) == (bytes(range(256)) * 8, False)


async def test_run_python_times_out_and_kills_the_script(box: E2BSandbox) -> None:
    marker = unique_sleep()
    begun = time.monotonic()
    script = "import sys, time; print('partial', flush=True); time.sleep(float(sys.argv[1]))"
    result = await box.run_python(script, [marker], timeout=0.5)
    assert (result.exit_code, result.timed_out, result.ok) == (137, True, False)
    assert result.stdout == b"partial\n"
    assert time.monotonic() - begun < 10 * slowdown()
    assert host_pids_with(marker) == []


async def test_a_cancelled_run_python_kills_the_script(box: E2BSandbox) -> None:
    marker = unique_sleep()
    running = asyncio.create_task(
        box.run_python("import sys, time; time.sleep(float(sys.argv[1]))", [marker])
    )
    await wait_for_process(marker)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert host_pids_with(marker) == []


def test_the_stderr_cap_counts_utf8_bytes_and_never_splits_a_character() -> None:
    sink = _OutputSink(None, 5)
    for chunk in ("ééé", "a", "b"):
        sink(chunk)
    assert sink.text(None) == "éé" + "a"


# -- capture_diff ---------------------------------------------------------------------------


async def test_capture_diff_refuses_e2b_before_killing_anything(
    box: E2BSandbox, source_repo: tuple[Path, str]
) -> None:
    # The capture needs the task's repository mounted read-only inside; E2B has no such mount.
    repo, base = source_repo
    assert box.base_repository is None
    marker = unique_sleep()
    await box.start(f"sleep {marker}")
    running = await wait_for_sleep(marker)
    with pytest.raises(UnsupportedSpecError, match="repository"):
        await capture_diff(box, repo, base)
    assert sleeps(marker) == [running]
