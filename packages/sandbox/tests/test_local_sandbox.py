"""The local bubblewrap sandbox: real processes, real namespaces, checked from the host."""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path, PurePosixPath

import pytest

from sandbox.errors import (
    SandboxClosedError,
    SandboxCommandError,
    SandboxFileNotFoundError,
)
from sandbox.local import LocalBackend, LocalConfig, LocalSandbox
from sandbox.spec import (
    DirectoryWorkspace,
    ForwardedEndpoint,
    ReadOnlyBind,
    ResourceLimits,
    SandboxSpec,
)

from .conftest import requires_bwrap


def host_pids_with(marker: str) -> list[int]:
    """Host pids whose command line contains `marker` (seen through the host's /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state != "Z":
            found.append(int(entry))
    return found


async def until_no_process(marker: str) -> None:
    for _ in range(300):
        if not host_pids_with(marker):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"processes with {marker!r} still alive: {host_pids_with(marker)}")


def unique_sleep() -> str:
    """A sleep duration that doubles as a unique marker in /proc/*/cmdline."""
    return f"{1000 + uuid.uuid4().int % 10**6}.{uuid.uuid4().int % 997}"


@pytest.fixture
async def tcp_server() -> AsyncIterator[tuple[int, list[bytes]]]:
    """A host TCP echo server on 127.0.0.1 that records what it received."""
    received: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = await reader.readline()
        received.append(line)
        writer.write(b"echo:" + line)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield port, received


# -- commands ---------------------------------------------------------------------------------


async def test_exec_reports_exit_codes_output_and_env(box: LocalSandbox) -> None:
    result = await box.exec("echo out; echo err >&2; echo $FOO; pwd; exit 3", env={"FOO": "bar"})
    assert (result.exit_code, result.stdout, result.stderr, result.timed_out) == (
        3,
        f"out\nbar\n{box.workspace}\n",
        "err\n",
        False,
    )
    assert (await box.exec("shopt -q login_shell")).ok  # bash -lc, like E2B
    assert (await box.exec("pwd", cwd="/tmp")).stdout == "/tmp\n"
    assert (await box.exec("mkdir -p sub && cd sub && pwd")).stdout == f"{box.workspace}/sub\n"
    assert (await box.exec("pwd", cwd="sub")).stdout == f"{box.workspace}/sub\n"


async def test_a_killed_command_is_137_but_not_timed_out(box: LocalSandbox) -> None:
    result = await box.exec("kill -9 $$")
    assert (result.exit_code, result.timed_out) == (137, False)


async def test_timeout_kills_the_command_and_its_children(box: LocalSandbox) -> None:
    marker = unique_sleep()
    result = await box.exec(
        f"echo before; sleep {marker} & sleep {marker}; echo never", timeout=0.5
    )
    assert (result.exit_code, result.timed_out, result.stdout) == (137, True, "before\n")
    assert 0.5 <= result.duration < 5
    await until_no_process(marker)


async def test_background_children_of_a_finished_command_keep_running(box: LocalSandbox) -> None:
    marker = unique_sleep()
    result = await box.exec(f"sleep {marker} > /dev/null 2>&1 &")
    assert result.ok
    assert host_pids_with(marker)  # E2B semantics: exec returns, the child lives on
    await box.close()
    await until_no_process(marker)


async def test_detached_process_wait_kill_and_output_files(box: LocalSandbox) -> None:
    quick = await box.start("echo one; echo two >&2; exit 4")
    done = await quick.wait(timeout=10)
    assert (done.exit_code, done.stdout, done.stderr, done.timed_out) == (
        4,
        "one\n",
        "two\n",
        False,
    )
    assert quick.stdout_path.read_text() == "one\n"

    marker = unique_sleep()
    slow = await box.start(f"echo started; sleep {marker}")
    over = await slow.wait(timeout=0.3)
    assert (over.exit_code, over.timed_out, over.stdout) == (137, True, "started\n")
    await until_no_process(marker)

    marker = unique_sleep()
    killed = await box.start(f"sleep {marker}")
    await killed.kill()
    assert (await killed.wait()).exit_code == 137
    await until_no_process(marker)


@requires_bwrap
async def test_close_kills_everything_even_escaped_daemons(backend: LocalBackend) -> None:
    box = await backend.create(SandboxSpec())
    markers = [unique_sleep() for _ in range(3)]
    await box.start(f"sleep {markers[0]}")
    await box.exec(f"setsid sleep {markers[1]} > /dev/null 2>&1 < /dev/null &")
    await box.exec(f"nohup setsid bash -c 'sleep {markers[2]}' > /dev/null 2>&1 &")
    for marker in markers:
        for _ in range(100):
            if host_pids_with(marker):
                break
            await asyncio.sleep(0.01)
        assert host_pids_with(marker)
    bwrap_pid = box.init_pid
    assert bwrap_pid is not None
    await box.close()
    for marker in markers:
        await until_no_process(marker)
    assert (
        not Path(f"/proc/{bwrap_pid}").exists()
        or "Z" in Path(f"/proc/{bwrap_pid}/stat").read_text()
    )
    with pytest.raises(SandboxClosedError):
        await box.exec("true")
    await box.close()  # idempotent


async def test_fifty_concurrent_sandboxes(backend: LocalBackend) -> None:
    async def one(index: int) -> str:
        async with await backend.create(SandboxSpec(env={"INDEX": str(index)})) as box:
            return (await box.exec("echo $INDEX; hostname")).stdout

    outputs = await asyncio.gather(*(one(i) for i in range(50)))
    for index, output in enumerate(outputs):
        assert output.split("\n")[0] == str(index)


# -- files ------------------------------------------------------------------------------------


async def test_file_round_trips_and_missing_files(box: LocalSandbox) -> None:
    payload = bytes(range(256)) * 100
    await box.write_file("deep/dir/blob.bin", payload)
    assert await box.read_file(f"{box.workspace}/deep/dir/blob.bin") == payload
    await box.write_file("/tmp/t.txt", "héllo\n")
    assert await box.read_text("/tmp/t.txt") == "héllo\n"
    assert (await box.exec("cat /tmp/t.txt")).stdout == "héllo\n"
    await box.write_file("name with 'quotes' and $x.txt", b"")
    assert await box.read_file("name with 'quotes' and $x.txt") == b""
    with pytest.raises(SandboxFileNotFoundError) as missing:
        await box.read_file("nope.txt")
    assert isinstance(missing.value, FileNotFoundError)
    with pytest.raises(SandboxCommandError, match="directory"):
        await box.read_file("deep")


async def test_directory_workspace_is_copied(backend: LocalBackend, tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "pkg").mkdir(parents=True)
    (source / "pkg" / "mod.py").write_text("X = 1\n")
    async with await backend.create(SandboxSpec(workspace=DirectoryWorkspace(source))) as box:
        assert await box.read_text("pkg/mod.py") == "X = 1\n"
        await box.write_file("pkg/mod.py", "X = 2\n")
    assert (source / "pkg" / "mod.py").read_text() == "X = 1\n"


# -- isolation --------------------------------------------------------------------------------


@requires_bwrap
async def test_host_files_outside_the_workspace_are_out_of_reach(
    box: LocalSandbox, tmp_path: Path
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret\n")
    assert not (await box.exec(f"cat {secret}")).ok
    for target in ("/etc/sandbox-probe", "/usr/sandbox-probe", "/etc/passwd"):
        assert not (await box.exec(f"echo x >> {target}")).ok, target
    assert not Path("/etc/sandbox-probe").exists()
    assert (await box.exec("cat /etc/shadow")).stdout == ""
    # A symlink planted by the agent resolves inside the sandbox, never to the host path.
    await box.exec(f"ln -s {secret} planted")
    with pytest.raises(SandboxCommandError):
        await box.write_file("planted", "overwritten")
    assert secret.read_text() == "host secret\n"
    # The workspace is the one writable host directory.
    await box.exec("echo from-inside > inside.txt")
    assert (box.workspace_host_path / "inside.txt").read_text() == "from-inside\n"
    await box.exec("echo private > /tmp/private.txt")
    assert not Path("/tmp/private.txt").exists()


@requires_bwrap
async def test_no_network_except_the_forwarded_endpoint(
    backend: LocalBackend, tcp_server: tuple[int, list[bytes]]
) -> None:
    forwarded_port, received = tcp_server
    other = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    other_port = other.sockets[0].getsockname()[1]
    talk = "exec 3<>/dev/tcp/127.0.0.1/{port} && echo ping-$RANDOM >&3 && head -n1 <&3"
    async with other:
        async with await backend.create(SandboxSpec()) as box:
            assert box.endpoint_url is None
            closed = await box.exec(talk.format(port=forwarded_port), timeout=5)
            assert not closed.ok
            assert not closed.timed_out
        spec = SandboxSpec(network=ForwardedEndpoint("127.0.0.1", forwarded_port, 8123))
        async with await backend.create(spec) as box:
            assert box.endpoint_url == "http://127.0.0.1:8123"
            reply = await box.exec(talk.format(port=8123), timeout=5)
            assert reply.ok, reply.stderr
            assert reply.stdout.startswith("echo:ping-")
            assert received
            assert received[-1].startswith(b"ping-")
            for port in (forwarded_port, other_port):
                blocked = await box.exec(talk.format(port=port), timeout=5)
                assert not blocked.ok
                assert not blocked.timed_out
            outside = await box.exec("exec 3<>/dev/tcp/1.1.1.1/80", timeout=5)
            assert not outside.ok


@requires_bwrap
async def test_read_only_binds_and_limits(backend: LocalBackend, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "pkg.txt").write_text("cached\n")
    spec = SandboxSpec(
        read_only_binds=(ReadOnlyBind(cache, PurePosixPath("/opt/cache")),),
        limits=ResourceLimits(max_file_size_bytes=1 << 20, tmp_size_bytes=4 << 20),
    )
    async with await backend.create(spec) as box:
        assert (await box.exec("cat /opt/cache/pkg.txt")).stdout == "cached\n"
        assert not (await box.exec("echo x > /opt/cache/new.txt")).ok
        too_big = await box.exec("head -c 2000000 /dev/zero > big.bin")
        assert too_big.exit_code == 128 + 25  # SIGXFSZ
        assert (await box.exec("head -c 500000 /dev/zero > ok.bin")).ok
        tmp_full = await box.exec(
            "for i in 1 2 3 4 5 6; do head -c 900000 /dev/zero > /tmp/$i; done"
        )
        assert not tmp_full.ok
    assert not (cache / "new.txt").exists()


# -- fallback ---------------------------------------------------------------------------------


async def test_fallback_is_loud_and_still_kills_what_it_started(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    backend = LocalBackend(LocalConfig(isolation="none", state_root=tmp_path))
    with caplog.at_level(logging.WARNING, logger="sandbox.local"):
        box = await backend.create(SandboxSpec())
    assert not box.isolated
    assert any("isolation disabled" in record.message for record in caplog.records)
    assert (await box.exec("pwd")).stdout == f"{box.workspace}\n"
    marker = unique_sleep()
    await box.start(f"sleep {marker}")
    timed = await box.exec(f"sleep {marker}", timeout=0.2)
    assert timed.timed_out
    await box.close()
    await until_no_process(marker)
    assert not Path(box.workspace).exists()
