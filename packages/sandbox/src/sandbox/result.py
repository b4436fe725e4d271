"""The outcome of one command, shaped like E2B's so both backends report the same thing."""

from __future__ import annotations

import signal
from dataclasses import dataclass

#: Exit code of a process killed by SIGKILL, as a shell reports it (128 + 9).
KILLED_EXIT_CODE = 128 + signal.SIGKILL


@dataclass(frozen=True, slots=True)
class ExecResult:
    """What a finished (or killed) command left behind.

    `timed_out` is True only when *our* deadline killed the command; a command killed for
    another reason also reports exit code 137 but `timed_out=False`, so a budget overrun is
    never confused with a crash.
    """

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool
    duration: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


def exit_code_from_returncode(returncode: int) -> int:
    """Map a `subprocess` return code (negative = killed by signal N) to shell convention."""
    return 128 - returncode if returncode < 0 else returncode
