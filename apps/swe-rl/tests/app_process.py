"""`swe-rl` as a user runs it: the app started as a child process, its output read whole."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

APP = Path(__file__).resolve().parents[1]


async def swe_rl(
    *args: str, env: dict[str, str] | None = None, timeout: float = 600
) -> tuple[int, str]:
    """Run `swe-rl ARGS` (stdout and stderr together, 200 columns); its exit code and output."""
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        str(APP),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )
    output, _ = await asyncio.wait_for(child.communicate(), timeout)
    assert child.returncode is not None
    return child.returncode, output.decode()
