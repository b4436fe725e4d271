"""One SWE episode: the function slime-backend runs for every sample.

task payload + adapter session + budgets ->
    sandbox with the task's checkout, setup run -> the agent CLI works on the problem under a
    wall-clock budget, talking to the adapter through the one forwarded port -> its change is
    captured as a diff -> graded in a fresh sandbox -> reward.

Every failure that leaves no trustworthy reward (a bad task row, a repository that will not
clone, setup failing, the CLI crashing or never reaching the model, the engine going away,
grading infrastructure failing) ends as an ABORTED outcome with the reason; nothing raises out
of an episode but cancellation. A task's environment failing (its image cannot be pulled, a
sandbox cannot boot on it, its test runner cannot start there) is such an abort, its reason
starting with "environment:" (environment.py), never a completed episode with reward 0.

A task with an environment runs the agent and the grader on its image (environment.py); when
the image holds the repository, the workspace is the image's own directory, the change is
captured against the image's repository and graded in a fresh sandbox from the same image.

The episode's artifacts (the CLI's event stream and stderr, the diff, the grading log, a
summary) are written to one directory, named in the outcome as `artifacts["dir"]`, where
`finished` also puts the session tree once the session is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from harness import (
    AgentEndpoint,
    AgentRun,
    CliMount,
    Harness,
    HarnessError,
    InstallConfig,
    InstalledCli,
)
from sandbox import (
    CapturedDiff,
    CaptureLimits,
    ChangeTooLargeError,
    ForwardedEndpoint,
    LocalBackend,
    ReadOnlyBind,
    ResourceLimits,
    Sandbox,
    SandboxBackend,
    SandboxError,
    SandboxSpec,
    SetupFailedError,
    run_setup,
)
from slime_backend import AdapterSession, Budgets, EpisodeOutcome, EpisodeStatus, JsonValue
from swe_rl.environment import (
    CaptureUnsupportedError,
    capture_change,
    environment_reason,
    image_base,
    sandbox_spec,
)
from swe_rl.grading import (
    EnvironmentFailure,
    GradeResult,
    GradingError,
    GradingLimits,
    GradingLog,
    Verdict,
    grade,
)
from swe_rl.sources import RepoSources, SourceError
from swe_rl.task import SweTask, TaskError, parse_task
from trajectory_tree import SessionTree, dump_routing, dumps

logger = logging.getLogger(__name__)

TASK_TEMPLATE = (
    "{problem_statement}\n\n"
    "The repository is checked out in the current directory. Change the code so that the "
    "issue above is resolved. Do not change the tests."
)


@dataclass(frozen=True, slots=True)
class EpisodeConfig:
    """How episodes run. `on_budget`: an agent stopped by its wall-clock budget is aborted
    (never trained) by default, or graded and marked truncated with "grade". `binds` and
    `env` make the task's toolchain available in the agent's and the grading sandboxes alike
    (an interpreter with the test runner, say), until tasks bring their own images.
    `capture` bounds the agent's change; `grading` bounds its grading."""

    artifacts_root: Path
    install: InstallConfig
    sources_cache: Path
    model_name: str = "policy-under-training"
    on_budget: Literal["abort", "grade"] = "abort"
    limits: ResourceLimits = field(default_factory=ResourceLimits)
    inside_port: int = 8080
    setup_timeout_s: float = 1800.0
    task_template: str = TASK_TEMPLATE
    binds: tuple[ReadOnlyBind, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    capture: CaptureLimits = field(default_factory=CaptureLimits)
    grading: GradingLimits = field(default_factory=GradingLimits)


class _Aborted(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class SweEpisode:
    """The app's episode function (slime-backend's `Episode` protocol)."""

    def __init__(self, config: EpisodeConfig, agent: Harness, backend: SandboxBackend) -> None:
        self.config = config
        self.agent = agent
        self.backend = backend
        self.sources = RepoSources(config.sources_cache)
        self._installed: InstalledCli | None = None
        self._install_lock = asyncio.Lock()

    async def __call__(
        self,
        task: Mapping[str, Any],
        session: AdapterSession,
        budgets: Budgets,
        *,
        evaluation: bool,
    ) -> EpisodeOutcome:
        started = time.monotonic()
        directory = self._directory(task, session)
        summary: dict[str, Any] = {"session_id": session.session_id, "evaluation": evaluation}
        try:
            outcome = await self._run(task, session, budgets, directory, summary)
        except _Aborted as aborted:
            outcome = EpisodeOutcome.aborted(aborted.reason)
        except Exception as error:  # an episode never takes the run down
            logger.exception("episode %s failed", session.session_id)
            outcome = EpisodeOutcome.aborted(f"internal error: {error!r}")
        summary.update(
            status=str(outcome.status),
            reason=outcome.reason,
            reward=outcome.reward,
            duration_s=round(time.monotonic() - started, 3),
        )
        await asyncio.to_thread(_write, directory / "summary.json", json.dumps(summary, indent=2))
        return EpisodeOutcome(
            outcome.reward,
            outcome.status,
            outcome.reason,
            {**outcome.artifacts, "dir": str(directory)},
        )

    async def _run(
        self,
        payload: Mapping[str, Any],
        session: AdapterSession,
        budgets: Budgets,
        directory: Path,
        summary: dict[str, Any],
    ) -> EpisodeOutcome:
        try:
            task = parse_task(payload)
        except TaskError as error:
            raise _Aborted(f"bad task: {error}") from None
        summary["instance_id"] = task.instance_id
        phases: dict[str, float] = summary.setdefault("phases_s", {})
        with _phase(phases, "repository"):
            repo: Path | None = None
            if not task.in_image:
                try:
                    repo = await self.sources.prepare(task)
                except SourceError as error:
                    raise _Aborted(f"repository: {error}") from None
            mount, binds = self._mount(await self._install())
        spec = self._spec(task, repo, session, binds)
        with _phase(phases, "sandbox"):
            try:
                box = await self.backend.create(spec)
            except SandboxError as error:
                if task.environment is not None:
                    reason = environment_reason(task, "the sandbox cannot start", error)
                    raise _Aborted(reason) from None
                raise _Aborted(f"sandbox: {error}") from None
        async with box:
            if task.in_image:  # no base to capture against is known now: no agent run
                await self._image_base(box, task)
            with _phase(phases, "setup"):
                await self._setup(box, task)
            with _phase(phases, "agent"):
                run = await self._agent(box, mount, task, session, budgets, directory)
            summary["agent"] = _run_summary(run)
            with _phase(phases, "diff"):
                try:
                    diff = await self._capture(box, task, repo)
                except ChangeTooLargeError as error:  # the agent's doing: graded, earns 0
                    diff = None
                    too_large = str(error)
                except (SandboxError, ValueError) as error:
                    raise _Aborted(f"capturing the diff failed: {error}") from None
            closing = time.perf_counter()
        phases["sandbox"] += time.perf_counter() - closing  # closing is the sandbox's cost too
        status = self._status(run)
        if diff is None:
            result = GradeResult(
                Verdict.CHANGE_REFUSED,
                too_large,
                dict.fromkeys(task.grading.fail_to_pass + task.grading.pass_to_pass, "missing"),
            )
            await asyncio.to_thread(_write, directory / "grading.log", f"{too_large}\n")
        else:
            await asyncio.to_thread(_write_bytes, directory / "diff.patch", diff.patch)
            summary["changed_paths"] = [_text(path) for path in diff.changed_paths]
            summary["left_out"] = {_text(path): why for path, why in diff.left_out}
            with _phase(phases, "grading"):
                result = await self._grade(task, repo, diff.patch, directory)
        grading = result.summary()
        summary["grading"] = grading
        artifacts: dict[str, JsonValue] = {
            "instance_id": task.instance_id,
            "resolved": result.resolved,
            "verdict": str(result.verdict),
            "grading": grading,
            "tests_passed": sum(s == "passed" for s in result.tests.values()),
            "tests_total": len(result.tests),
            "refused_paths": sorted(result.refused_paths),
            "agent_exit_code": run.exit_code,
            "agent_tool_calls": run.stats.tool_calls,
            "phases_s": {name: round(seconds, 4) for name, seconds in phases.items()},
        }
        reason = result.reason
        if _killed_by_signal(run.exit_code):
            reason += f"; {self.agent.name} died of signal {run.exit_code - 128}"
        return EpisodeOutcome(result.reward, status, reason, artifacts)

    async def _capture(self, box: Sandbox, task: SweTask, repo: Path | None) -> CapturedDiff:
        """The agent's change: against the prepared repository at the base commit, or the
        image's own repository (environment.capture_change)."""
        try:
            return await capture_change(box, task, repo, self.config.capture)
        except CaptureUnsupportedError as error:
            raise _Aborted(environment_reason(task, "capturing the change", error)) from None

    async def _image_base(self, box: Sandbox, task: SweTask) -> None:
        try:
            await image_base(box, task)
        except CaptureUnsupportedError as error:
            raise _Aborted(environment_reason(task, "capturing the change", error)) from None

    def _spec(
        self,
        task: SweTask,
        repo: Path | None,
        session: AdapterSession,
        binds: tuple[ReadOnlyBind, ...],
    ) -> SandboxSpec:
        address = urlsplit(session.base_url)
        if address.hostname is None or address.port is None:
            raise _Aborted(f"adapter URL has no host and port: {session.base_url}")
        network = ForwardedEndpoint(address.hostname, address.port, self.config.inside_port)
        return sandbox_spec(
            task,
            repo,
            env={**self.config.env, "IS_SANDBOX": "1"},
            network=network,
            binds=(*self.config.binds, *binds),
            limits=self.config.limits,
        )

    def _mount(self, installed: InstalledCli) -> tuple[CliMount, tuple[ReadOnlyBind, ...]]:
        """Where the CLI is inside: bound read-only into a local sandbox, at its own path on
        the host without isolation, and at the standard path in an E2B template."""
        if isinstance(self.backend, LocalBackend):
            if not self.backend.isolated:
                return CliMount.at_host_path(installed), ()
            mount = CliMount.under(installed)
            return mount, (mount.bind,)
        return CliMount.under(installed), ()

    async def _install(self) -> InstalledCli:
        async with self._install_lock:
            if self._installed is None:
                try:
                    self._installed = await self.agent.install(self.config.install)
                except HarnessError as error:
                    raise _Aborted(f"installing {self.agent.name}: {error}") from None
            return self._installed

    async def _setup(self, box: Sandbox, task: SweTask) -> None:
        try:
            await run_setup(box, task.setup_commands, timeout=self.config.setup_timeout_s)
        except SetupFailedError as error:
            raise _Aborted(f"setup: {error}") from None

    async def _agent(
        self,
        box: Sandbox,
        mount: CliMount,
        task: SweTask,
        session: AdapterSession,
        budgets: Budgets,
        directory: Path,
    ) -> AgentRun:
        assert box.endpoint_url is not None
        endpoint = AgentEndpoint(
            base_url=box.endpoint_url,
            token=session.token,
            model=self.config.model_name,
            context_window=budgets.context_tokens,
        )
        prompt = self.config.task_template.format(problem_statement=task.problem_statement)
        try:
            return await self.agent.run(
                box,
                mount,
                endpoint,
                prompt,
                budget=budgets.wall_clock_s,
                output_dir=directory / "agent",
            )
        except (HarnessError, SandboxError) as error:
            raise _Aborted(f"running {self.agent.name}: {error}") from None

    def _status(self, run: AgentRun) -> EpisodeStatus:
        if run.timed_out:
            if self.config.on_budget == "abort":
                detail = f"; last: {run.stats.error}" if run.stats.error else ""
                raise _Aborted(f"the agent used its whole budget ({run.duration:.0f} s){detail}")
            return EpisodeStatus.TRUNCATED
        if _killed_by_signal(run.exit_code):
            # Not our budget's kill: a tool call of the agent's (`kill -9 $PPID`), or the
            # sandbox's memory limit it ran into. Its doing: its change is graded as it is.
            return EpisodeStatus.COMPLETED
        if run.exit_code != 0:
            detail = run.stats.error or run.stderr_tail.strip()[-500:] or "no message"
            raise _Aborted(f"{self.agent.name} exited {run.exit_code}: {detail}")
        return EpisodeStatus.COMPLETED

    async def _grade(
        self, task: SweTask, repo: Path | None, patch: bytes, directory: Path
    ) -> GradeResult:
        log = GradingLog()
        spec = sandbox_spec(
            task,
            repo,
            env=self.config.env,
            binds=self.config.binds,
            limits=self.config.limits,
            grading=True,
        )
        try:
            return await grade(
                task, patch, lambda: self.backend.create(spec), log, limits=self.config.grading
            )
        except EnvironmentFailure as error:
            raise _Aborted(environment_reason(task, "grading", error)) from None
        except GradingError as error:
            raise _Aborted(f"grading: {error}") from None
        finally:
            await asyncio.to_thread(_write, directory / "grading.log", log.text())

    def finished(self, tree: SessionTree, outcome: EpisodeOutcome) -> None:
        """slime-backend's hook after the session closed: keep the tree with the artifacts."""
        directory = outcome.artifacts.get("dir")
        if isinstance(directory, str):
            save_tree(Path(directory), tree)

    def _directory(self, task: Mapping[str, Any], session: AdapterSession) -> Path:
        instance = str(task.get("instance_id", "unknown")) if isinstance(task, Mapping) else "bad"
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in instance)[:80]
        return self.config.artifacts_root / f"{safe}-{session.session_id}"


@contextlib.contextmanager
def _phase(phases: dict[str, float], name: str) -> Iterator[None]:
    """Time one phase of the episode into `phases` (kept in the summary and the samples)."""
    started = time.perf_counter()
    try:
        yield
    finally:
        phases[name] = phases.get(name, 0.0) + time.perf_counter() - started


def _run_summary(run: AgentRun) -> dict[str, Any]:
    return {
        "harness": run.harness,
        "exit_code": run.exit_code,
        "timed_out": run.timed_out,
        "duration_s": round(run.duration, 3),
        "main_agent_turns": run.stats.main_agent_turns,
        "tool_calls": run.stats.tool_calls,
        "error": run.stats.error,
        "limits_hit": list(run.limits_hit),
    }


def _killed_by_signal(exit_code: int) -> bool:
    """Exit code 128 + N: the process died of signal N (as the sandbox reports it)."""
    return 128 < exit_code <= 128 + 64


def _text(path: str) -> str:
    """A path for JSON: names that are not UTF-8 shown with `\\xNN` escapes."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def save_tree(directory: Path, tree: SessionTree) -> None:
    """``tree.json``, and the MoE routing when the engine captured it as the binary sidecar
    ``tree.routing`` the JSON points into (``trajectory_tree.loads(text, routing=...)``)."""
    _write(directory / "tree.json", dumps(tree))
    routing = dump_routing(tree)
    if routing:
        (directory / "tree.routing").write_bytes(routing)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
