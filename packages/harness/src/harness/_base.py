"""The Harness interface: install a pinned CLI, plan its launch for an endpoint, run it.

A harness is the knowledge about one agent CLI and nothing else: which npm package, which
files, environment and argv point it at the adapter, and how to read its event stream.
Installing, mounting, starting, budgeting and collecting output are shared, so a new
harness is one subclass implementing `launch` and `new_tally` (see the README).
"""

from __future__ import annotations

import contextlib
import uuid
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import ClassVar

from harness._config import AgentEndpoint, InstallConfig, NpmCli
from harness._errors import LaunchError
from harness._events import EventStats, EventTally, summarize_file
from harness._install import InstalledCli, install_cli
from harness._launch import Launch
from harness._mount import CliMount
from harness._run import AgentRun, run_launch
from sandbox import Sandbox, SandboxError

#: Where per-run state (a fresh HOME, config files) is created inside the sandbox. Not under
#: /tmp: Codex refuses to set up its helper binaries under the temporary directory.
DEFAULT_STATE_ROOT = PurePosixPath("/var/tmp/agent-rl")

#: Removes a run's state directory with the sandbox's own interpreter (an image may have no
#: shell or `rm`).
_REMOVE_TREE = "import shutil, sys\nshutil.rmtree(sys.argv[1], ignore_errors=True)"


class Harness(ABC):
    """One agent CLI. Subclasses are frozen dataclasses holding a version pin and options."""

    name: ClassVar[str]

    @property
    @abstractmethod
    def spec(self) -> str:
        """The pinned package this harness runs (an `InstalledCli.spec`)."""

    @abstractmethod
    async def install(self, config: InstallConfig) -> InstalledCli:
        """Install (once per host) and verify the pinned CLI."""

    @abstractmethod
    def launch(
        self,
        *,
        bin_path: PurePosixPath,
        endpoint: AgentEndpoint,
        task: str,
        state_dir: PurePosixPath,
    ) -> Launch:
        """Plan one run: `bin_path` is the CLI inside the sandbox; `state_dir` is fresh and
        private to this run (put HOME and config files under it)."""

    @abstractmethod
    def new_tally(self) -> EventTally:
        """A fresh accumulator for this CLI's event stream."""

    def started_by(self, plan: Launch, command: Sequence[str]) -> Launch:
        """`plan` with its program started by `command`, what `Sandbox.host_program_argv`
        says starts it there: the program's path, or the host's loader before it on an
        image (a harness whose CLI behaves differently that way adapts the plan here)."""
        return replace(plan, argv=(*command, *plan.argv[1:]))

    def summarize(self, events_path: Path) -> EventStats:
        """Summarize an event stream file this CLI wrote."""
        return summarize_file(events_path, self.new_tally())

    async def run(
        self,
        sandbox: Sandbox,
        cli: CliMount,
        endpoint: AgentEndpoint,
        task: str,
        *,
        budget: float,
        output_dir: Path,
        cwd: str | None = None,
        state_root: PurePosixPath = DEFAULT_STATE_ROOT,
    ) -> AgentRun:
        """Run the agent on `task` in `cwd` (default: the sandbox workspace) for at most
        `budget` seconds. Never raises for what the agent did; only for bad input or a
        sandbox failure.

        The plan is for the CLI's program (`CliMount.program_path`); a plan that starts it
        (its argv[0]) starts it as the sandbox says it must (`started_by`), with no shell in
        between, so an image needs neither a shell nor the CLI's runtime (see the README)."""
        if cli.installed.spec != self.spec:
            raise LaunchError(f"{self.name} pins {self.spec}, got {cli.installed.spec}")
        if not task.strip():
            raise LaunchError("empty task")
        program = cli.program_path
        command = sandbox.host_program_argv(str(program))
        if len(command) > 1 and await _runs_as_it_is(sandbox, str(program)):
            command = (str(program),)
        state_dir = state_root / f"{self.name}-{uuid.uuid4().hex}"
        plan = self.launch(bin_path=program, endpoint=endpoint, task=task, state_dir=state_dir)
        if plan.argv[0] == str(program):
            plan = self.started_by(plan, command)
        try:
            return await run_launch(
                sandbox,
                plan,
                harness=self.name,
                tally=self.new_tally(),
                budget=budget,
                output_dir=output_dir,
                cwd=cwd,
            )
        finally:
            # Inside an isolated sandbox this is tmpfs that dies with it, but a non-isolated
            # one runs on the host: never leave per-run homes behind there.
            with contextlib.suppress(SandboxError):
                await sandbox.run_python(_REMOVE_TREE, [str(state_dir)], timeout=60)


#: How long the probe of a CLI started as it is on an image may take (a cold start of a
#: 380 MB native build on a busy node included).
NATIVE_PROBE_TIMEOUT = 60.0


async def _runs_as_it_is(sandbox: Sandbox, program: str) -> bool:
    """Whether the image's own loader and libraries run `program` (`--version` exits 0).

    Started as it is, the CLI is exactly what a deployment runs: its tools, their
    descriptions and the programs it re-executes as itself are its defaults. Through the
    host's loader (an image with another libc, an older one, or none) it needs adapting
    (`started_by`), and the model sees that difference: so the loader is the fallback."""
    try:
        probe = await sandbox.start_argv((program, "--version"))
        result = await probe.wait(NATIVE_PROBE_TIMEOUT)
    except SandboxError:
        return False
    return result.exit_code == 0 and not result.timed_out


class NpmHarness(Harness):
    """A harness whose CLI is an npm package, pinned by its `cli` field."""

    cli: NpmCli

    @property
    def spec(self) -> str:
        return self.cli.spec

    async def install(self, config: InstallConfig) -> InstalledCli:
        return await install_cli(self.cli, config)
