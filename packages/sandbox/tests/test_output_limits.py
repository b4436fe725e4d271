"""What a sandbox's output and files can cost the host: bounded, and reported.

Attacks from inside, each once seen to work: a command printing 512 MiB put 512 MiB on the
host's disk and ~1 GiB in the host process; a background process kept writing to the unlinked
output file of a finished command; a FIFO or a link to /dev/zero where a file was expected made
the host's read wait forever or read without end.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from sandbox import (
    LocalBackend,
    LocalSandbox,
    ResourceLimits,
    SandboxCommandError,
    SandboxSpec,
)

MiB = 1 << 20
CAP = 1 * MiB


@pytest.fixture
async def capped(backend: LocalBackend) -> LocalSandbox:
    sandbox = await backend.create(SandboxSpec(limits=ResourceLimits(max_output_bytes=CAP)))
    assert isinstance(sandbox, LocalSandbox)
    return sandbox


def deleted_files_held(under: Path) -> list[str]:
    """Files under `under` this process holds open after they were unlinked (disk nobody
    sees)."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:  # the descriptor listdir itself used
            continue
        if target.startswith(f"{under}/") and target.endswith(" (deleted)"):
            held.append(target)
    return held


def largest_file(directory: Path) -> int:
    sizes = [entry.stat().st_size for entry in directory.rglob("*") if entry.is_file()]
    return max(sizes, default=0)


async def test_output_past_the_cap_is_dropped_and_reported(capped: LocalSandbox) -> None:
    async with capped:
        result = await capped.exec("head -c 512M /dev/zero; echo err >&2", timeout=120)
        assert result.exit_code == 0
        assert len(result.stdout) == CAP  # the first MiB, not 512
        assert result.stderr == "err\n"
        assert "max_output_bytes" in result.limits_hit
        small = await capped.exec("echo fine")
        assert small.stdout == "fine\n"
        assert "max_output_bytes" not in small.limits_hit


async def test_a_detached_command_never_puts_more_than_the_cap_on_disk(
    capped: LocalSandbox, tmp_path: Path
) -> None:
    async with capped:
        process = await capped.start("head -c 64M /dev/zero; sleep 30")
        for _ in range(200):  # while it runs, the file is already cut
            if process.stdout_path.stat().st_size >= CAP:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        assert process.stdout_path.stat().st_size == CAP
        assert largest_file(tmp_path / "state") == CAP
        result = await process.wait(timeout=0.5)
        assert result.timed_out
        assert "max_output_bytes" in result.limits_hit


async def test_a_background_writer_after_exit_costs_the_host_nothing(
    capped: LocalSandbox, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    async with capped:
        result = await capped.exec(
            "(sleep 2; head -c 200M /dev/zero; touch /tmp/finished) & echo $!"
        )
        assert "max_output_bytes" not in result.limits_hit
        # It holds the finished command's stdout: a pipe the host drains into nothing (it was
        # a host file, which it could fill after the host had unlinked it), so it never blocks
        # on a full pipe and nothing of it is stored on the host.
        held = await capped.exec(f"readlink /proc/{result.stdout.strip()}/fd/1")
        assert held.stdout.startswith("pipe:"), held.stdout
        finished = await capped.exec(
            "for i in $(seq 300); do [ -e /tmp/finished ] && exit 0; sleep 0.1; done; exit 1"
        )
        assert finished.ok, "the background writer blocked"
        assert deleted_files_held(state) == []
    assert deleted_files_held(state) == []


async def test_the_output_of_a_sandbox_of_default_limits_is_capped_too(
    backend: LocalBackend,
) -> None:
    assert ResourceLimits().max_output_bytes is not None
    async with await backend.create(SandboxSpec()) as sandbox:
        result = await sandbox.exec("head -c 80M /dev/zero | tr '\\0' x", timeout=120)
        assert len(result.stdout) == ResourceLimits().max_output_bytes
        assert "max_output_bytes" in result.limits_hit


async def test_reading_a_fifo_or_a_device_is_refused_not_waited_on(box: LocalSandbox) -> None:
    await box.exec("mkfifo pipe && ln -s /dev/zero zero && ln -s /dev/null null")
    for path in ("pipe", "zero", "null"):
        with pytest.raises(SandboxCommandError, match="not a regular file"):
            await asyncio.wait_for(box.read_file(path), 30)
        with pytest.raises(SandboxCommandError, match="not a regular file"):
            await asyncio.wait_for(box.write_file(path, "x"), 30)
    assert (await box.exec("ls -l pipe")).stdout.startswith("p")  # left as it was


async def test_a_file_larger_than_max_bytes_is_refused(box: LocalSandbox) -> None:
    await box.exec("head -c 3M /dev/zero > big")
    with pytest.raises(SandboxCommandError, match="larger than max_bytes"):
        await box.read_file("big", max_bytes=2 * MiB)
    assert len(await box.read_file("big", max_bytes=3 * MiB)) == 3 * MiB


async def test_files_still_read_and_write_through_links_inside(box: LocalSandbox) -> None:
    await box.write_file("real.txt", "one\n")
    await box.exec("ln -s real.txt link.txt")
    await box.write_file("link.txt", "two\n")
    assert await box.read_text("real.txt") == "two\n"
    await box.write_file("real.txt", "3")  # shorter: truncated, not overwritten in place
    assert await box.read_text("link.txt") == "3"
