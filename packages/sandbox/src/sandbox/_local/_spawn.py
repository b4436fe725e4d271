"""bubblewrap as a process: start it, read the info it writes before its payload runs, fail
with its own message when it exits first, and end a half-booted one without leaving anything
unreaped."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import TypeVar

from sandbox._errors import SandboxBootError
from sandbox._local._config import DEFAULT_PATH

logger = logging.getLogger(__name__)
_T = TypeVar("_T")

_BWRAP_EXIT_S = 5.0


async def abort_boot(process: asyncio.subprocess.Process, init_pidfd: int, name: str) -> None:
    """End a half-booted sandbox so that nothing is left unreaped: kill init first and let
    bwrap reap it and exit (killing bwrap first would orphan init); then bwrap's whole process
    group, if bwrap does not go or init's pid is not known yet.

    The group is what makes the second case safe. bwrap's child (the sandbox's init to be)
    first waits on an eventfd for bwrap to map its ids, and only after that binds its life to
    bwrap's (PDEATHSIG); bwrap writes its info, and so init's pid, just before it signals. A
    bwrap killed in between left that child waiting for ever (a stray ``bwrap`` in
    ``eventfd_read``, seen when an interrupted run cancelled boots on a busy machine). Until it
    moves to a session of its own, which it does later still, the child is in the group we
    started bwrap in (``start_new_session``), so the group's kill reaches it."""
    if init_pidfd >= 0:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(init_pidfd, signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(process.wait()), _BWRAP_EXIT_S)
    kill_group(process)
    await process.wait()
    logger.debug("sandbox %s: bwrap %d reaped after a failed boot", name, process.pid)


def kill_group(process: asyncio.subprocess.Process) -> None:
    """SIGKILL bwrap and whatever is still in its process group (its group id is its pid: no
    other group can hold that id while a member is left, even once bwrap is reaped)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        process.kill()


def late_pidfd(info_read: int) -> int:
    """A pidfd for init if bwrap's info is already in the pipe, else -1."""
    try:
        info = json.loads(os.read(info_read, 65536))
        return os.pidfd_open(int(info["child-pid"]))
    except (OSError, ValueError, KeyError, TypeError):
        return -1


async def spawn_bwrap(
    argv: list[str], log: Path, inherited: Sequence[int]
) -> asyncio.subprocess.Process:
    stderr = await asyncio.to_thread(open, log, "wb")
    try:
        return await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=stderr,
            env={"PATH": DEFAULT_PATH},
            pass_fds=inherited,
            start_new_session=True,
        )
    finally:
        stderr.close()


async def read_info(
    fd: int, process: asyncio.subprocess.Process, timeout: float, log: Path
) -> dict[str, int]:
    """bwrap's info JSON (written once, before the payload runs), or bwrap's own error."""
    loop = asyncio.get_running_loop()
    os.set_blocking(fd, False)
    chunks: list[bytes] = []
    done: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return
        chunks.append(chunk)
        complete = not chunk or _is_json(b"".join(chunks))  # or bwrap closed it
        if complete and not done.done():
            done.set_result(None)

    loop.add_reader(fd, readable)
    try:
        await first_of(asyncio.wait_for(done, timeout), process, log)
    except TimeoutError:
        raise SandboxBootError(f"bwrap did not start within {timeout} s: {tail(log)}") from None
    finally:
        loop.remove_reader(fd)
    try:
        info = json.loads(b"".join(chunks))
    except ValueError:
        raise SandboxBootError(f"bwrap failed: {tail(log)}") from None
    if not isinstance(info, dict) or not isinstance(info.get("child-pid"), int):
        raise SandboxBootError(f"bwrap sent no child pid: {info!r}")
    return info


def _is_json(data: bytes) -> bool:
    try:
        json.loads(data)
    except ValueError:
        return False
    return True


async def first_of(awaitable: Awaitable[_T], process: asyncio.subprocess.Process, log: Path) -> _T:
    """Await `awaitable`, failing with bwrap's own message if bwrap exits first."""
    waiting = asyncio.ensure_future(awaitable)
    exited = asyncio.ensure_future(process.wait())
    try:
        await asyncio.wait((waiting, exited), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        waiting.cancel()
        exited.cancel()
        raise
    if waiting.done():
        exited.cancel()
        return waiting.result()
    waiting.cancel()
    raise SandboxBootError(f"bwrap exited ({process.returncode}): {tail(log)}")


def tail(log: Path) -> str:
    try:
        return log.read_text(errors="replace").strip()[-2000:] or "(no message)"
    except OSError:
        return "(no message)"
