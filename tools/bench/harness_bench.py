"""Agent launch overhead: how much later the first model request arrives when a CLI runs in a
local sandbox than when it runs directly on the host.

    uv run tools/bench/harness_bench.py [--runs 5] [--cache ~/.cache/agent-rl/npm]

For Claude Code and Codex (the pinned real CLIs, installed from npm on first use) it measures
the time from the start of a launch to the moment the first request's headers reach a local
recording endpoint (which answers with a final message, so every run ends cleanly):

- host: the CLI's argv spawned directly on the host (same env and config files as the harness
  writes, no shell): the CLI's own startup, the floor;
- sandbox: `Harness.run()` on an already created local sandbox (a fresh one per run, as one
  episode gets one): config written into the sandbox, `bash -lc` started by the sandbox's init,
  the read-only bind of the install, and the request relayed through the forwarded port (a
  listening socket inside the sandbox, relayed by the host).

Overhead = sandbox median - host median. Sandbox creation (once per episode, not part of the
launch) is shown separately. Median of `--runs` runs after one warm-up run of each. Per-run state
(HOME, CODEX_HOME) lives on the sandbox's tmpfs inside and in /var/tmp on the host, so a CLI
that writes much at startup (Codex: its session files) can start faster inside.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path, PurePosixPath

from rich.console import Console
from rich.table import Table

from harness import AgentEndpoint, ClaudeCode, CliMount, Codex, Harness, InstallConfig
from harness.testing import RecordingEndpoint
from sandbox import ForwardedEndpoint, LocalBackend, LocalConfig, SandboxSpec

TOKEN = "sess-bench"
POLICY = "policy-bench"
TASK = "Reply with the single word done."
HOST_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


async def first_request_on_host(harness: Harness, mount: CliMount, workdir: Path) -> float:
    async with RecordingEndpoint() as server:
        state = Path(tempfile.mkdtemp(prefix="harness-bench-", dir="/var/tmp"))
        try:
            endpoint = AgentEndpoint(server.url, TOKEN, POLICY, 32768)
            plan = harness.launch(
                bin_path=mount.bin_path,
                endpoint=endpoint,
                task=TASK,
                state_dir=PurePosixPath(state),
            )
            for directory in plan.dirs:
                Path(directory).mkdir(parents=True, exist_ok=True)
            for path, text in plan.files.items():
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                Path(path).write_text(text)
            started = time.monotonic()
            proc = await asyncio.create_subprocess_exec(
                *plan.argv,
                cwd=workdir,
                env={**HOST_ENV, **plan.env},
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
                start_new_session=True,
            )
            request = await server.wait_for_request(60)
            await asyncio.wait_for(proc.wait(), 60)
            return request.arrived - started
        finally:
            shutil.rmtree(state, ignore_errors=True)


async def first_requests_in_sandbox(
    harness: Harness, mount: CliMount, backend: LocalBackend, runs: int, out: Path
) -> tuple[list[float], float]:
    """Launch once in each of `runs` fresh sandboxes (one per episode, as in training);
    returns (first-request latencies, median sandbox create time)."""
    latencies = []
    isolated = backend.isolated
    create_times = []
    for index in range(runs):
        async with RecordingEndpoint() as server:
            spec = SandboxSpec(
                network=ForwardedEndpoint("127.0.0.1", server.port),
                read_only_binds=(mount.bind,) if isolated else (),
            )
            created = time.monotonic()
            async with await backend.create(spec) as box:
                create_times.append(time.monotonic() - created)
                assert box.endpoint_url is not None
                endpoint = AgentEndpoint(box.endpoint_url, TOKEN, POLICY, 32768)
                started = time.monotonic()
                run = await harness.run(
                    box, mount, endpoint, TASK, budget=60, output_dir=out / f"{index}"
                )
                if not run.ok:
                    raise RuntimeError(f"{harness.name} run failed: {run.stderr_tail}")
                latencies.append(server.requests[0].arrived - started)
    return latencies, statistics.median(create_times)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache/agent-rl/npm")
    args = parser.parse_args()
    console = Console(width=120)
    backend = LocalBackend(LocalConfig())
    isolated = backend.isolated
    work = Path(tempfile.mkdtemp(prefix="harness-bench-"))
    table = Table(
        title=f"First request after launch, median of {args.runs} runs (ms)"
        + ("" if isolated else "  [NOT ISOLATED: bubblewrap unavailable]")
    )
    for column in ("CLI", "host (direct)", "local sandbox", "overhead", "sandbox create"):
        table.add_column(column, justify="left" if column == "CLI" else "right")
    try:
        for harness in (ClaudeCode(), Codex()):
            installed = await harness.install(InstallConfig(cache_dir=args.cache))
            host_mount = CliMount.at_host_path(installed)
            sandbox_mount = CliMount.under(installed) if isolated else host_mount
            workdir = work / f"host-{uuid.uuid4().hex[:8]}"
            workdir.mkdir()
            await first_request_on_host(harness, host_mount, workdir)  # warm-up
            host = [
                await first_request_on_host(harness, host_mount, workdir) for _ in range(args.runs)
            ]
            sandboxed, create = await first_requests_in_sandbox(
                harness, sandbox_mount, backend, args.runs + 1, work / harness.name
            )
            sandboxed = sandboxed[1:]  # drop the warm-up
            host_ms = statistics.median(host) * 1000
            box_ms = statistics.median(sandboxed) * 1000
            table.add_row(
                f"{harness.name} {harness.spec.rsplit('@', 1)[1]}",
                f"{host_ms:.0f}  ({min(host) * 1000:.0f}-{max(host) * 1000:.0f})",
                f"{box_ms:.0f}  ({min(sandboxed) * 1000:.0f}-{max(sandboxed) * 1000:.0f})",
                f"{box_ms - host_ms:+.0f}",
                f"{create * 1000:.0f}",
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    console.print(table)
    console.print(
        f"{os.cpu_count()} CPUs; host = the CLI's argv spawned directly; sandbox = Harness.run() "
        "in a created sandbox (bash -lc, nsenter, read-only bind, forwarded port)."
    )


if __name__ == "__main__":
    asyncio.run(main())
