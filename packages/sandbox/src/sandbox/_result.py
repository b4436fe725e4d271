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
    limits_hit: tuple[str, ...] = ()
    """`ResourceLimits` fields the kernel reports as hit while the command ran (e.g. an OOM
    kill: "memory_bytes"; a refused fork: "max_processes"). Counted per sandbox, so a
    background process of the same sandbox can be the one that hit it."""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass(frozen=True, slots=True)
class ScriptResult:
    """What one of the caller's own scripts (`Sandbox.run_python`) left behind.

    stdout stays bytes (a script may stream binary data back) and is bounded by the caller:
    `truncated` says the script wrote more than that and `stdout` holds only the first part.
    """

    exit_code: int
    stdout: bytes
    stderr: str
    timed_out: bool
    duration: float
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.truncated


_SIGNAL_LIMITS = {int(signal.SIGXCPU): "cpu_seconds", int(signal.SIGXFSZ): "max_file_size_bytes"}


def limit_of_returncode(returncode: int) -> tuple[str, ...]:
    """The rlimit a command died of: its own death by SIGXCPU/SIGXFSZ, or its shell's report
    of a child's (exit code 128 + signal, the convention `bash -lc` follows)."""
    signum = -returncode if returncode < 0 else returncode - 128
    limit = _SIGNAL_LIMITS.get(signum) if signum > 0 else None
    return (limit,) if limit else ()


def exit_code_from_returncode(returncode: int) -> int:
    """Map a `subprocess` return code (negative = killed by signal N) to shell convention."""
    return 128 - returncode if returncode < 0 else returncode
