"""A cancellation that lands as a command finishes is kept, never swallowed.

Python 3.11's ``asyncio.wait_for`` returns the result of an awaitable that has just finished
even when its caller was cancelled in between: the cancellation is lost and the caller goes
on. An interrupted run cancels its episodes while their sandboxes run commands, so an episode
whose cancellation landed there ran to its end after Ctrl-C. Here the command's exit and the
cancellation are placed at every step of the event loop around each other; whenever the
cancellation was accepted, the wait must end cancelled.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any, cast

from sandbox._local._commands import CommandSandbox

STEPS = range(8)


class Exiting:
    """A launched process whose exit the test decides (the Launched protocol)."""

    def __init__(self) -> None:
        self.exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.killed = 0

    @property
    def returncode(self) -> int | None:
        return self.exited.result() if self.exited.done() else None

    async def wait(self) -> int:
        return await self.exited

    def kill_group(self) -> None:
        self.killed += 1


async def race(wait: Callable[[Exiting], Awaitable[Any]], steps: int) -> tuple[bool, str]:
    """The process exits, and `steps` loop iterations later the waiting task is cancelled:
    (whether cancel() was accepted, how the wait ended)."""
    loop = asyncio.get_running_loop()
    process = Exiting()
    waiting = asyncio.ensure_future(wait(process))
    for _ in range(3):
        await asyncio.sleep(0)
    accepted: list[bool] = []

    def later(left: int) -> None:
        if left:
            loop.call_soon(later, left - 1)
        else:
            accepted.append(waiting.cancel())

    process.exited.set_result(0)
    later(steps)
    try:
        await waiting
    except asyncio.CancelledError:
        return accepted[0], "cancelled"
    return (accepted[0] if accepted else False), "returned"


async def command_wait(process: Exiting) -> tuple[int, bool]:
    box = cast(CommandSandbox, SimpleNamespace(_running=set()))
    return await CommandSandbox._wait(box, process, 30.0, kill_on_cancel=True)


async def test_an_accepted_cancellation_always_cancels_the_wait() -> None:
    outcomes = [await race(command_wait, steps) for steps in STEPS]
    assert outcomes[0] == (True, "cancelled")  # the race is really run, from before the exit
    assert [(accepted, how) for accepted, how in outcomes if accepted and how != "cancelled"] == []


async def test_the_race_catches_a_wait_that_swallows_cancellation() -> None:
    """The same race against wait_for itself: it loses cancellations (Python 3.11; 3.12
    rewrote wait_for on asyncio.timeout and keeps them)."""

    async def wait_for(process: Exiting) -> int:
        return await asyncio.wait_for(asyncio.shield(process.wait()), 30.0)

    outcomes = [await race(wait_for, steps) for steps in STEPS]
    swallowed = [
        steps for steps, (accepted, how) in enumerate(outcomes) if accepted and how != "cancelled"
    ]
    if sys.version_info < (3, 12):
        assert swallowed
    else:
        assert swallowed == []
