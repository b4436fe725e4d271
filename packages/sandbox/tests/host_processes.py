"""What the host sees of sandboxed processes, read from the host's /proc (never the sandbox's)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path


def host_pids_with(marker: str) -> list[int]:
    """Live (non-zombie) host pids whose command line contains `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def host_uid_of(pid: int) -> int:
    """The real uid of a host pid, as the host's kernel accounts it."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid line for pid {pid}")


async def wait_for_process(marker: str) -> list[int]:
    for _ in range(300):
        if found := host_pids_with(marker):
            return found
        await asyncio.sleep(0.01)
    raise AssertionError(f"no process with {marker!r} appeared")


async def until_no_process(marker: str) -> None:
    for _ in range(300):
        if not host_pids_with(marker):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"processes with {marker!r} still alive: {host_pids_with(marker)}")


def unique_sleep() -> str:
    """A sleep duration that doubles as a unique marker in /proc/*/cmdline."""
    return f"{1000 + uuid.uuid4().int % 10**6}.{uuid.uuid4().int % 997}"
