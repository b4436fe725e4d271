"""Run a harness's launch plan as a plain host process: the same argv, environment and files
the harness would use in a sandbox, without the sandbox (that is harness's own end-to-end).

The environment is built from nothing but ``PATH``, a UTF-8 locale and a private ``TMPDIR``
plus the plan's own variables, so nothing from the developer's shell (API keys, proxies, a real
HOME) can reach the CLI, and what it writes to its temporary directory (Claude Code keeps its
background tasks' transcripts and sockets there) stays with the test. The CLI runs in its own
process group, which is killed if it outlives its timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from dataclasses import dataclass
from pathlib import Path

from harness import Launch


@dataclass(frozen=True, slots=True)
class HostRun:
    returncode: int
    stdout: bytes
    stderr: bytes

    def describe(self, tail: int = 4000) -> str:
        """Exit code and the ends of both streams, for failure messages."""
        out = self.stdout.decode(errors="replace")[-tail:]
        err = self.stderr.decode(errors="replace")[-tail:]
        return (
            f"exit code {self.returncode}\n--- stdout (tail) ---\n{out}\n"
            f"--- stderr (tail) ---\n{err}"
        )


def host_environment(plan: Launch, tmpdir: Path) -> dict[str, str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "TMPDIR": str(tmpdir),
    }
    for name in plan.unset_env:
        env.pop(name, None)
    env.update(plan.env)
    return env


async def run_on_host(plan: Launch, cwd: Path, tmpdir: Path, timeout: float) -> HostRun:
    """Create the plan's dirs and files, run its argv in ``cwd`` with stdin from /dev/null."""
    tmpdir.mkdir(parents=True, exist_ok=True)
    for directory in plan.dirs:
        Path(directory).mkdir(parents=True, exist_ok=True)
    for path, text in plan.files.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)
    process = await asyncio.create_subprocess_exec(
        *plan.argv,
        cwd=cwd,
        env=host_environment(plan, tmpdir),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), timeout)
    except TimeoutError:
        raise TimeoutError(f"{plan.argv[0]} did not exit within {timeout:.0f} s") from None
    finally:
        # Also reaps anything the CLI left running in its group after it exited.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.wait()
    assert process.returncode is not None
    return HostRun(process.returncode, stdout, stderr)
