"""A run: K episodes per task, at most N at once, into one run directory.

The demo and `swe-rl rollout` share this: they differ only in where samples come from (the
`SampleSource`: slime-backend's generate function over the engine double or a real engine). A
run writes, as episodes finish:

    <run>/samples.jsonl          every slime sample, one JSON object per line
    <run>/episodes/<id>/         the episode's artifacts (tree.json, its routing, diff, logs, ...)
    <run>/run.json               the episodes with rewards, GRPO advantages and gate alarms
                                 (its shape: swe_rl/run_record.py, which the viewer reads too)

An episode counts as finished only once its samples are on disk: they are appended, flushed
and fsynced, and only then is the episode recorded (run.json is written last, from those
records). Interrupting (SIGINT or SIGTERM) stops starting episodes, cancels the running ones
(which aborts their engine requests and closes their sandboxes) and records them as aborted
with reason "interrupted"; a sample write under way is never cancelled: the run waits for it,
then writes run.json for what finished. Interrupted episodes are left out of the
silent-failure gates (they say nothing about the policy or the stack). A second signal exits
at once, before run.json is written, so nothing is recorded as finished then either.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import json
import os
import signal
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from slime_backend import (
    ConfigError,
    EpisodeHealth,
    EpisodeReward,
    EpisodeStatus,
    GateConfig,
    GateReport,
    Normalization,
    evaluate_gates,
    normalized_rewards,
)
from slime_backend.testing import StandInSample
from swe_rl.environment import abort_cause
from swe_rl.provenance import episode_facts
from swe_rl.run_record import INTERRUPTED, RUN_FILE, Alarm, EpisodeEntry, Grading, RunRecord
from swe_rl.task_file import TaskRow

NOT_RUN = "not run: the run stopped at a failure of its sample source"
FAILED = "failed"
"""The first word of the reason of an episode whose sample source raised (a configuration
the generate function refuses, a bug): the run stops there, and says so."""


@dataclass(frozen=True, slots=True)
class PlannedEpisode:
    """One episode of the run: task row, GRPO group (the task) and slime sample index."""

    row: TaskRow
    group: int
    index: int

    @property
    def episode_id(self) -> str:
        return f"{self.index:05d}-{self.row.task.instance_id}"


class SampleSource(Protocol):
    """Runs one episode and returns its slime samples (never raises for the episode's faults)."""

    async def __call__(self, episode: PlannedEpisode) -> list[Any]: ...


class GenerateSource:
    """Samples from slime-backend's generate function, called as slime's rollout calls it: a
    base sample per episode (index, group, prompt, label, the row's metadata verbatim), slime's
    args and a fresh copy of its sampling dict."""

    def __init__(self, generate: Any, args: Any, sampling: dict[str, Any]) -> None:
        self.generate = generate
        self.args = args
        self.sampling = sampling

    async def __call__(self, episode: PlannedEpisode) -> list[Any]:
        base = StandInSample(
            index=episode.index,
            group_index=episode.group,
            prompt=episode.row.prompt,
            label=episode.row.task.instance_id,
            metadata=dict(episode.row.metadata),
        )
        samples: list[Any] = await self.generate(self.args, base, dict(self.sampling))
        return samples


def episode_entry(episode: PlannedEpisode, samples: Sequence[Any], root: Path) -> EpisodeEntry:
    """What run.json lists of a finished episode, from its samples' provenance (`dir` relative
    to the run directory `root`); raises ValueError naming what their provenance lacks."""
    if not samples:
        return stopped_entry(episode, "no samples")
    facts = episode_facts(samples)
    outcome, health = facts.outcome, facts.health
    return EpisodeEntry(
        episode_id=episode.episode_id,
        instance_id=episode.row.task.instance_id,
        group=episode.group,
        index=episode.index,
        status=outcome.status,
        reason=outcome.reason,
        reward=outcome.reward,
        advantage=None,
        samples=len(samples),
        turns=facts.turns,
        tool_calls=health.tool_calls,
        malformed_tool_calls=health.malformed_tool_calls,
        trained_tokens=health.trained_tokens,
        masked_tokens=facts.masked_tokens,
        routing_refused=health.routing_refused,
        dir=_relative(str(outcome.artifacts.get("dir", "")), root),
        grading=_grading(outcome.artifacts.get("grading")),
    )


def stopped_entry(episode: PlannedEpisode, reason: str = INTERRUPTED) -> EpisodeEntry:
    """An episode that never ran to an outcome (interrupted, not run): aborted, reward 0."""
    return EpisodeEntry(
        episode_id=episode.episode_id,
        instance_id=episode.row.task.instance_id,
        group=episode.group,
        index=episode.index,
        status=EpisodeStatus.ABORTED,
        reason=reason,
        reward=0.0,
        advantage=None,
        dir="",
    )


def _health(entry: EpisodeEntry) -> EpisodeHealth:
    return EpisodeHealth(
        entry.status,
        entry.trained_tokens,
        entry.tool_calls,
        entry.malformed_tool_calls,
        entry.reason,
        entry.routing_refused,
    )


def plan(rows: Sequence[TaskRow], episodes_per_task: int) -> list[PlannedEpisode]:
    """K episodes of each task; each task is one GRPO group, indices as slime numbers samples."""
    return [
        PlannedEpisode(row, group, group * episodes_per_task + k)
        for group, row in enumerate(rows)
        for k in range(episodes_per_task)
    ]


@dataclass(slots=True)
class RunResult:
    records: list[EpisodeEntry]
    gates: GateReport
    interrupted: bool
    duration_s: float
    samples_path: Path
    run_json: Path
    write_errors: tuple[str, ...] = ()
    """Episodes whose samples could not be written (a full disk): named, never silent."""
    failure: str | None = None
    """Why the run stopped early, when its sample source raised (the generate function's
    refusal of a configuration, a bug): the commands exit non-zero with it."""


@dataclass(slots=True)
class Run:
    """Runs planned episodes through a sample source into `out`."""

    out: Path
    source: SampleSource
    concurrency: int
    title: str
    policy: str
    agent: str
    gate_config: GateConfig = field(default_factory=GateConfig)
    extra: dict[str, Any] = field(default_factory=dict)
    console: Console | None = None
    """Where progress goes (default: stdout): a bar on a terminal, else a line per episode."""

    async def execute(self, episodes: Sequence[PlannedEpisode]) -> RunResult:
        started = time.monotonic()
        self.out.mkdir(parents=True, exist_ok=True)
        samples_path = self.out / "samples.jsonl"
        samples_path.write_text("")
        records: dict[int, EpisodeEntry] = {}
        episodes_by = {episode.index: episode for episode in episodes}
        write_errors: list[str] = []
        finishing: set[asyncio.Task[None]] = set()
        failures: dict[int, BaseException] = {}
        failed = asyncio.Event()
        with _interruptible() as stop, _progress(self.console) as progress:
            bar = progress.add_task("episodes", total=len(episodes))
            if not progress.console.is_terminal:
                progress.console.print(
                    f"running {len(episodes)} episodes, {self.concurrency} at a time",
                    highlight=False,
                )
            gate = asyncio.Semaphore(self.concurrency)

            async def finish(episode: PlannedEpisode, samples: list[Any]) -> None:
                """Samples on disk (flushed, fsynced), then the episode recorded: in that order,
                so run.json never lists an episode as finished whose samples are missing."""
                try:
                    await asyncio.to_thread(_append_samples, samples_path, samples)
                except OSError as error:  # a full disk ends this write, not the run
                    write_errors.append(f"{episode.episode_id}: {error.strerror or error}")
                except (TypeError, ValueError) as error:  # a sample JSON cannot carry
                    write_errors.append(f"{episode.episode_id}: {error}")
                try:
                    record = episode_entry(episode, samples, self.out)
                except ValueError as error:  # samples without whole provenance: a broken
                    failures[episode.index] = error  # source, as if it had raised: stop
                    failed.set()
                    return
                records[episode.index] = record
                progress.advance(bar)
                if not progress.console.is_terminal:  # no live bar there: a line instead
                    _progress_line(progress.console, len(records), len(episodes), record)

            async def one(episode: PlannedEpisode) -> None:
                async with gate:
                    if stop.is_set() or failed.is_set():
                        return
                    try:
                        samples = await self.source(episode)
                    except Exception as error:  # the source broke, not the episode: stop
                        failures[episode.index] = error
                        failed.set()
                        return
                # From here the episode is finished: its write is a task of its own, shielded,
                # so an interrupt cancelling this one never cancels (or drops) the write.
                task = asyncio.create_task(finish(episode, samples))
                finishing.add(task)
                await asyncio.shield(task)

            tasks = [asyncio.create_task(one(episode)) for episode in episodes]
            waiter = asyncio.ensure_future(stop.wait())
            failure_waiter = asyncio.ensure_future(failed.wait())
            done_all = asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.wait(
                (done_all, waiter, failure_waiter), return_when=asyncio.FIRST_COMPLETED
            )
            waiter.cancel()
            failure_waiter.cancel()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.gather(*finishing)  # every write under way completes
            interrupted = stop.is_set()
        failure = None
        for index, error in failures.items():
            why = f"{FAILED}: {type(error).__name__}: {error}"
            records.setdefault(index, stopped_entry(episodes_by[index], why))
            failure = failure or why
        left = INTERRUPTED if interrupted or failure is None else NOT_RUN
        for episode in episodes:
            records.setdefault(episode.index, stopped_entry(episode, left))
        ordered = [records[episode.index] for episode in episodes]
        ordered = _advantages(ordered)
        # An interrupted episode never ran to an outcome: the user stopped it, so it says
        # nothing about the policy or the stack and counts towards no silent-failure gate;
        # nor does one that never ran because the run stopped at a failure.
        gates = evaluate_gates(
            (_health(r) for r in ordered if r.reason not in (INTERRUPTED, NOT_RUN)),
            self.gate_config,
        )
        run_json = self.out / RUN_FILE
        duration = time.monotonic() - started
        _write_run(run_json, self, ordered, gates, interrupted, duration, write_errors, failure)
        return RunResult(
            ordered,
            gates,
            interrupted,
            duration,
            samples_path,
            run_json,
            tuple(write_errors),
            failure,
        )


def _advantages(records: list[EpisodeEntry]) -> list[EpisodeEntry]:
    """GRPO advantages per task group, each episode counted once (what slime will train on)."""
    episodes = [
        EpisodeReward(r.index, r.group, r.reward, in_baseline=r.status != "aborted")
        for r in records
    ]
    values = normalized_rewards(episodes, Normalization(subtract_mean=True, divide_by_std=True))
    return [
        dataclasses.replace(
            record, advantage=values.get(record.index) if record.status != "aborted" else None
        )
        for record in records
    ]


def abort_counts(records: Sequence[EpisodeEntry]) -> dict[str, int]:
    """Aborted episodes counted by cause (their reason's first word: environment, sandbox,
    grading, interrupted, ...), most common first."""
    counts: dict[str, int] = {}
    for record in records:
        if record.status == "aborted":
            cause = abort_cause(record.reason)
            counts[cause] = counts.get(cause, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def _write_run(
    path: Path,
    run: Run,
    records: list[EpisodeEntry],
    gates: GateReport,
    interrupted: bool,
    duration: float,
    write_errors: list[str],
    failure: str | None = None,
) -> None:
    record = RunRecord(
        title=run.title,
        policy=run.policy,
        agent=run.agent,
        episodes=tuple(records),
        alarms=_alarms(gates),
        interrupted=interrupted,
        failure=failure,
        duration_s=round(duration, 3),
        sample_write_errors=tuple(write_errors),
        aborts=abort_counts(records),
        gates=gates.as_dict(),
        extra=run.extra,
    )
    record.write(path)


def _alarms(gates: GateReport) -> tuple[Alarm, ...]:
    return tuple(
        Alarm(
            gate=result.name,
            share=result.share,
            limit=result.limit,
            message=f"{result.offending} of {result.episodes} episodes "
            f"({result.share:.0%}) exceed the {result.limit:.0%} limit"
            + (
                "; aborted: " + ", ".join(f"{cause} {n}" for cause, n in result.causes)
                if result.causes
                else ""
            )
            + (f"; e.g. {result.example[:300]}" if result.example else ""),
        )
        for result in gates.tripped
    )


def _grading(data: object) -> Grading | None:
    """The episode's grading summary, as run.json keeps it (None when it has none)."""
    if not isinstance(data, dict):
        return None
    try:
        return Grading.from_json(data)
    except ConfigError:  # not what GradeResult.summary() writes: nothing to record
        return None


def _relative(directory: str, root: Path) -> str:
    if not directory:
        return ""
    with contextlib.suppress(ValueError):
        return str(Path(directory).resolve().relative_to(root.resolve()))
    return directory


def _append_samples(path: Path, samples: Sequence[Any]) -> None:
    """Append the episode's samples and make them durable (flushed and fsynced) before the
    episode is recorded as finished."""
    text = "".join(json.dumps(_sample_json(sample)) + "\n" for sample in samples)
    with path.open("a", encoding="utf-8") as out:
        out.write(text)
        out.flush()
        try:
            os.fsync(out.fileno())
        except OSError as error:
            if error.errno != errno.EINVAL:  # a file that cannot be synced (a pipe) is fine
                raise


def _sample_json(sample: Any) -> dict[str, Any]:
    fields = (
        "index",
        "group_index",
        "rollout_id",
        "prompt",
        "label",
        "tokens",
        "response_length",
        "loss_mask",
        "rollout_log_probs",
        "reward",
        "status",
        "metadata",
        "weight_versions",
        "session_id",
        "remove_sample",
    )
    data = {name: getattr(sample, name, None) for name in fields}
    status = data.get("status")
    data["status"] = getattr(status, "value", status)
    return data


@contextlib.contextmanager
def _interruptible() -> Iterator[asyncio.Event]:
    """An event set by the first SIGINT/SIGTERM; a second one ends the process at once."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_signal() -> None:
        if stop.is_set():
            raise SystemExit(130)
        stop.set()

    installed = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, on_signal)
            installed.append(signum)
    try:
        yield stop
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)


def _progress_line(console: Console, done: int, total: int, record: EpisodeEntry) -> None:
    outcome = record.status if record.status != "aborted" else f"aborted ({record.reason})"
    console.print(
        f"episode {done}/{total} finished: {record.episode_id}, {outcome}, "
        f"reward {record.reward:g}",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )


def _progress(console: Console | None) -> Progress:
    """A live bar on a terminal; elsewhere (a pipe, a log file) rich shows nothing live, and
    the run prints a line per finished episode instead."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )
