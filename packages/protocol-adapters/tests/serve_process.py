"""``protocol-adapters serve`` run as its own process, for the CLI tests: the command line and the
URLs and context length the running server reports."""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

SERVING = re.compile(r"serving on (http://\S+); admin API on (http://\S+); context (\d+) tokens")


def serve_command(engine_url: str, tokenizer_cache: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "protocol_adapters",
        "serve",
        "--engine-url",
        engine_url,
        "--qwen3-cache",
        str(tokenizer_cache),
        "--port",
        "0",
        *extra,
    ]


@asynccontextmanager
async def serving(command: list[str]) -> AsyncIterator[tuple[str, str, int]]:
    """The agent URL, the admin URL and the context length a running ``serve`` reports."""
    process = await asyncio.create_subprocess_exec(*command, stderr=asyncio.subprocess.PIPE)
    assert process.stderr is not None
    try:
        while True:
            line = (await asyncio.wait_for(process.stderr.readline(), 60)).decode()
            assert line, "server exited before serving"
            if match := SERVING.search(line):
                break
        yield match[1], match[2], int(match[3])
    finally:
        process.terminate()
        assert await asyncio.wait_for(process.wait(), 30) == 0
