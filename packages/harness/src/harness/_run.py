"""Running a launch plan in a sandbox under a wall-clock budget, and what the run left.

The plan's directories and files are made by the sandbox's own interpreter and its argv is
started with no shell in between, so nothing of the image is needed to start a CLI.

The CLI's stdout (its JSON event stream) and stderr are copied out of the sandbox's output
files into the caller's output directory before anything else, so they survive the
sandbox's close and are kept even when the run timed out or the summary found nothing.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from harness._events import EventStats, EventTally, summarize_file
from harness._launch import Launch
from sandbox import Sandbox, SandboxCommandError

EVENTS_FILE = "events.jsonl"
STDERR_FILE = "stderr.log"
STDERR_TAIL_CHARS = 4000
_MAKE_DIRS = "import os, sys\nfor path in sys.argv[1:]:\n    os.makedirs(path, exist_ok=True)"


@dataclass(frozen=True, slots=True)
class AgentRun:
    """The outcome of one agent run.

    timed_out is True only when our budget killed the CLI (exit code 137 then); events_path
    and stderr_path are host files owned by the caller.
    """

    harness: str
    exit_code: int
    timed_out: bool
    duration: float
    events_path: Path
    stderr_path: Path
    stderr_tail: str
    stats: EventStats
    limits_hit: tuple[str, ...] = ()
    """Sandbox limits hit while the CLI ran (`ExecResult.limits_hit`); "max_output_bytes" means
    the event stream in `events_path` is cut short."""
    argv: tuple[str, ...] = ()
    """The command the CLI was started with (through the host's loader or as it is)."""

    @property
    def ok(self) -> bool:
        """The CLI finished on its own with exit code 0 and reported no error."""
        return self.exit_code == 0 and not self.timed_out and self.stats.error is None

    def event_lines(self) -> Iterator[str]:
        """The raw event stream, line by line (undecodable bytes replaced)."""
        with self.events_path.open(encoding="utf-8", errors="replace") as stream:
            for line in stream:
                yield line.rstrip("\n")


async def run_launch(
    sandbox: Sandbox,
    launch: Launch,
    *,
    harness: str,
    tally: EventTally,
    budget: float,
    output_dir: Path,
    cwd: str | None = None,
) -> AgentRun:
    """Start `launch` detached, wait at most `budget` seconds (then kill), collect output."""
    if not budget > 0:
        raise ValueError(f"budget must be positive seconds, got {budget}")
    output_dir.mkdir(parents=True, exist_ok=True)
    events_path = output_dir / EVENTS_FILE
    stderr_path = output_dir / STDERR_FILE
    for path in (events_path, stderr_path):
        if path.exists():
            raise FileExistsError(f"{path} exists: give every run its own output directory")
    if launch.dirs:
        made = await sandbox.run_python(_MAKE_DIRS, launch.dirs, timeout=60)
        if made.exit_code != 0 or made.timed_out:
            raise SandboxCommandError(f"making {launch.dirs} failed: {made.stderr[-2000:]}")
    for sandbox_path, text in launch.files.items():
        await sandbox.write_file(sandbox_path, text)
    started = time.monotonic()
    process = await sandbox.start_argv(
        launch.argv, cwd=cwd, env=launch.env, unset_env=launch.unset_env
    )
    try:
        result = await process.wait(timeout=budget)
    except BaseException:
        # Cancelled (or the wait itself failed): the agent must not outlive our interest.
        await asyncio.shield(process.kill())
        raise
    duration = time.monotonic() - started
    await asyncio.to_thread(_copy_outputs, process.stdout_path, events_path)
    await asyncio.to_thread(_copy_outputs, process.stderr_path, stderr_path)
    stats = await asyncio.to_thread(summarize_file, events_path, tally)
    return AgentRun(
        harness=harness,
        exit_code=result.exit_code,
        timed_out=result.timed_out,
        duration=duration,
        events_path=events_path,
        stderr_path=stderr_path,
        stderr_tail=_tail(stderr_path),
        stats=stats,
        limits_hit=result.limits_hit,
        argv=tuple(launch.argv),
    )


def _copy_outputs(source: Path, destination: Path) -> None:
    if source.exists():
        shutil.copyfile(source, destination)
    else:
        destination.write_bytes(b"")


def _tail(path: Path) -> str:
    with path.open("rb") as stream:
        stream.seek(0, 2)
        size = stream.tell()
        stream.seek(max(0, size - STDERR_TAIL_CHARS * 4))
        return stream.read().decode("utf-8", errors="replace")[-STDERR_TAIL_CHARS:]
