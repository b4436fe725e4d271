"""Spawning commands in their own process group and killing that group.

Every command is started with `start_new_session=True`, so the process we spawn leads a
process group its children inherit; killing the group kills the command's whole tree
(except processes that deliberately left it with setsid: the local sandbox's pid namespace
catches those at close).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from sandbox._result import ExecResult, exit_code_from_returncode


async def spawn(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    stdout: IO[bytes] | int,
    stderr: IO[bytes] | int,
    stdin: int = asyncio.subprocess.DEVNULL,
    cwd: str | None = None,
) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *argv,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        env=dict(env),
        cwd=cwd,
        start_new_session=True,
    )


def kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the process group led by `proc`, if its leader has not been reaped yet.

    Only an unreaped leader proves the group id is still ours: once reaped, the number may
    be reused by an unrelated process group on the host.
    """
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


async def wait_with_deadline(
    proc: asyncio.subprocess.Process, timeout: float | None, *, kill_on_cancel: bool
) -> tuple[int, bool]:
    """Wait for `proc`; past `timeout` kill its group. Returns (exit code, timed out).

    With `kill_on_cancel` a cancelled wait kills the group too: an abandoned `exec` must not
    outlive the caller's interest in it (a detached process may).
    """
    try:
        async with asyncio.timeout(timeout):  # not wait_for: it can swallow a cancellation
            returncode = await proc.wait()
    except TimeoutError:
        kill_group(proc)
        returncode = await proc.wait()
        return exit_code_from_returncode(returncode), True
    except BaseException:
        if kill_on_cancel:
            kill_group(proc)
        raise
    return exit_code_from_returncode(returncode), False


def read_output(path: Path) -> str:
    """Decode captured output; undecodable bytes become U+FFFD (as E2B's SDK does)."""
    try:
        return path.read_bytes().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""


def result_from_files(
    exit_code: int, timed_out: bool, started: float, stdout: Path, stderr: Path
) -> ExecResult:
    return ExecResult(
        exit_code=exit_code,
        stdout=read_output(stdout),
        stderr=read_output(stderr),
        timed_out=timed_out,
        duration=time.monotonic() - started,
    )
