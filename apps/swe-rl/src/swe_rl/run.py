"""A run: K episodes per task, at most N at once, into one run directory.

The demo and `swe-rl rollout` share this: they differ only in where samples come from (the
`SampleSource`: slime-backend's generate function over the engine double or a real engine). A
run writes, as episodes finish:

    <run>/samples.jsonl          every slime sample, one JSON object per line
    <run>/episodes/<id>/         the episode's artifacts (tree.json, its routing, diff, logs, ...)
    <run>/run.json               the episodes with rewards, GRPO advantages and gate alarms

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
    NAMESPACE,
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
from swe_rl.task_file import TaskRow

INTERRUPTED = "interrupted"
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


@dataclass(slots=True)
class EpisodeRecord:
    """What the run keeps of one episode (all plain data, for run.json)."""

    episode_id: str
    instance_id: str
    group: int
    index: int
    status: str
    reason: str
    reward: float
    advantage: float | None = None
    samples: int = 0
    turns: int = 0
    tool_calls: int = 0
    malformed_tool_calls: int = 0
    trained_tokens: int = 0
    masked_tokens: int = 0
    dir: str = ""
    grading: dict[str, Any] | None = None
    """The grading verdict, its reason, refused paths, timeout and per-test outcomes."""

    @classmethod
    def from_samples(cls, episode: PlannedEpisode, samples: Sequence[Any]) -> EpisodeRecord:
        record = cls(
            episode.episode_id,
            episode.row.task.instance_id,
            episode.group,
            episode.index,
            "aborted",
            "no samples",
            0.0,
        )
        if not samples:
            return record
        provenance = samples[0].metadata.get(NAMESPACE, {})
        facts = provenance.get("episode", {})
        record.status = str(facts.get("status", "aborted"))
        record.reason = str(facts.get("reason", ""))
        record.reward = float(facts.get("reward", 0.0))
        record.samples = len(samples)
        record.turns = int(facts.get("turns", 0))
        record.tool_calls = int(facts.get("tool_calls", 0))
        record.malformed_tool_calls = int(facts.get("malformed_tool_calls", 0))
        record.trained_tokens = int(facts.get("trained_tokens", 0))
        record.masked_tokens = sum(
            sum(s.metadata.get(NAMESPACE, {}).get("sample", {}).get("masked_tokens", {}).values())
            for s in samples
        )
        artifacts = facts.get("artifacts", {})
        record.dir = str(artifacts.get("dir", ""))
        grading = artifacts.get("grading")
        record.grading = dict(grading) if isinstance(grading, dict) else None
        return record

    @classmethod
    def interrupted(cls, episode: PlannedEpisode, reason: str = INTERRUPTED) -> EpisodeRecord:
        return cls(
            episode.episode_id,
            episode.row.task.instance_id,
            episode.group,
            episode.index,
            "aborted",
            reason,
            0.0,
        )

    def health(self) -> EpisodeHealth:
        return EpisodeHealth(
            EpisodeStatus(self.status),
            self.trained_tokens,
            self.tool_calls,
            self.malformed_tool_calls,
            self.reason,
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
    records: list[EpisodeRecord]
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
        records: dict[int, EpisodeRecord] = {}
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
                record = EpisodeRecord.from_samples(episode, samples)
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
            records.setdefault(index, EpisodeRecord.interrupted(episodes_by[index], why))
            failure = failure or why
        left = INTERRUPTED if interrupted or failure is None else NOT_RUN
        for episode in episodes:
            records.setdefault(episode.index, EpisodeRecord.interrupted(episode, left))
        ordered = [records[episode.index] for episode in episodes]
        _advantages(ordered)
        # An interrupted episode never ran to an outcome: the user stopped it, so it says
        # nothing about the policy or the stack and counts towards no silent-failure gate;
        # nor does one that never ran because the run stopped at a failure.
        gates = evaluate_gates(
            (r.health() for r in ordered if r.reason not in (INTERRUPTED, NOT_RUN)),
            self.gate_config,
        )
        run_json = self.out / "run.json"
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


def _advantages(records: list[EpisodeRecord]) -> None:
    """GRPO advantages per task group, each episode counted once (what slime will train on)."""
    episodes = [
        EpisodeReward(r.index, r.group, r.reward, in_baseline=r.status != "aborted")
        for r in records
    ]
    values = normalized_rewards(episodes, Normalization(subtract_mean=True, divide_by_std=True))
    for record in records:
        record.advantage = values.get(record.index) if record.status != "aborted" else None


def abort_counts(records: Sequence[EpisodeRecord]) -> dict[str, int]:
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
    records: list[EpisodeRecord],
    gates: GateReport,
    interrupted: bool,
    duration: float,
    write_errors: list[str],
    failure: str | None = None,
) -> None:
    alarms = [
        {
            "gate": result.name,
            "share": result.share,
            "limit": result.limit,
            "message": f"{result.offending} of {result.episodes} episodes "
            f"({result.share:.0%}) exceed the {result.limit:.0%} limit"
            + (
                "; aborted: " + ", ".join(f"{cause} {n}" for cause, n in result.causes)
                if result.causes
                else ""
            )
            + (f"; e.g. {result.example[:300]}" if result.example else ""),
        }
        for result in gates.tripped
    ]
    document = {
        "title": run.title,
        "policy": run.policy,
        "agent": run.agent,
        "interrupted": interrupted,
        "failure": failure,
        "duration_s": round(duration, 3),
        "sample_write_errors": write_errors,
        "episodes": [
            {
                **dataclasses.asdict(record),
                "dir": _relative(record.dir, run.out),
            }
            for record in records
        ],
        "aborts": abort_counts(records),
        "gates": gates.as_dict(),
        "alarms": alarms,
        **run.extra,
    }
    partial = path.with_name(f".{path.name}.partial")  # a reader never sees half a run.json
    partial.write_text(json.dumps(document, indent=2))
    partial.replace(path)


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


def _progress_line(console: Console, done: int, total: int, record: EpisodeRecord) -> None:
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
