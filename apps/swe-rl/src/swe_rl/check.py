"""`swe-rl check`: a preflight of the real stack, one episode of one task, step by step.

Before a rollout or a training run spends GPU hours, each piece an episode needs is tried once,
in the order an episode needs them, each step timed and reported as it finishes:

    engine          the SGLang server answers, and its context length
    chat template   the checkpoint's template, as the audit judges it, served in the chosen mode
    sandbox         the task's sandbox (its image pulled and unpacked) boots and closes
    grading         the empty change earns 0 and the task's reference solution 1 (validate's way)
    agent           one episode through slime-backend's generate function: the agent CLI in its
                    sandbox reaches the adapter, which reaches the engine
    token trust     every trained token is one the engine generated, at its place, after the
                    prompt it was sent, with its logprob (from a copy of the engine's own answers)
    samples         the episode's slime samples are whole (masks, logprobs, reward, provenance)

The first failing step stops the check (exit 1) with what failed and what to do about it.
Everything is written under --out: the episode's artifacts, the samples, check.json.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import enum
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console
from rich.markup import escape

from protocol_adapters import SGLangConfig, SGLangEngine
from sandbox import SandboxBackend, SandboxError
from slime_backend import (
    AgentSettings,
    BackendSettings,
    ConfigError,
    Episode,
    EpisodeStatus,
    SandboxSettings,
)
from slime_backend.generate import make_generate
from slime_backend.testing import StandInSample, slime_args
from swe_rl.commands.rollout import (
    checkpoint_arg,
    sandbox_isolation,
    sandbox_options,
)
from swe_rl.engine_recorder import EngineRecorder, EngineReply
from swe_rl.environment import environment_reason, sandbox_spec
from swe_rl.errors import UsageError
from swe_rl.provenance import episode_facts
from swe_rl.rollout import ConfigurationError, ConfiguredEpisode, sandbox_backend
from swe_rl.rollout_settings import ResolvedSettings, settings_from_args, template_verdict
from swe_rl.sources import RepoSources, SourceError
from swe_rl.task_file import TaskRow, command_rows
from swe_rl.validate import ValidateConfig, Validator

T = TypeVar("T")

CACHE = Path.home() / ".cache" / "agent-rl"
GENERATE = "swe_rl.rollout.generate"

ENGINE_HINT = (
    "start SGLang serving the checkpoint (python -m sglang.launch_server --model-path CKPT "
    "--host 0.0.0.0 --port 30000), or fix --engine-url (an SGLang router's address works too); "
    "this machine must reach it"
)
TEMPLATE_HINT = (
    "`protocol-adapters check-template CKPT` lists every finding; serve it in the mode the "
    "message names (--template-mode), or fix the chat template in the checkpoint "
    "(tokenizer_config.json or chat_template.jinja)"
)
SANDBOX_HINT = (
    "the agent runs in this sandbox: for a local one, bubblewrap must work here (sudo apt-get "
    "install bubblewrap); for an image, check its reference, --plain-http, "
    "--registry-credentials and --image-cache (swe-rl validate TASKS --logs DIR shows more)"
)
GRADING_HINT = (
    "a task whose empty change earns a reward or whose reference fails teaches nothing: read "
    "the grading logs named above, fix the row, or leave it out (swe-rl validate TASKS --out "
    "valid.jsonl keeps the tasks that pass)"
)
UNREACHABLE_HINT = (
    "the CLI talks to the adapter through the sandbox's forwarded port: read the CLI's own "
    "output under {dir}/agent (stderr, events.jsonl) for the address it tried and its error; "
    "check that the CLI installs (~/.cache/agent-rl/npm) and starts in the task's image, and "
    "that the sandbox can forward a port (the same path every rollout episode takes)"
)
ABORTED_HINT = (
    "read the episode under {dir} (the CLI's events and stderr, summary.json); a budget "
    "spent without an answer wants a larger wall_clock_s or a faster engine"
)
TRUST_HINT = (
    "a trained token that is not the engine's corrupts training: this is a bug in the adapter, "
    "the template bridge or the conversion; keep {out} (tree.json, samples.jsonl, check.json) "
    "and report it"
)
NOTHING_TRAINED_HINT = (
    "an episode with nothing trainable teaches nothing: its samples' metadata says why every "
    "token was masked (agent_rl.sample.masked_tokens); the viewer shows it (swe-rl view {out})"
)
SAMPLES_HINT = "this is a bug in slime-backend's conversion; keep {out} and report it"


class StepFailed(Exception):
    """A step's failure: what went wrong and what to do about it."""

    def __init__(self, what: str, hint: str) -> None:
        super().__init__(what)
        self.what = what
        self.hint = hint


@dataclass(slots=True)
class StepReport:
    name: str
    ok: bool
    seconds: float
    detail: str
    hint: str = ""


class _Stopped(Exception):
    """A step failed: the check ends there."""


class Checklist:
    """Runs the steps in order, timing and printing each as it finishes."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.reports: list[StepReport] = []

    async def run(self, name: str, step: Callable[[], Awaitable[tuple[T, str]]]) -> T:
        started = time.monotonic()
        try:
            value, detail = await step()
        except StepFailed as failed:
            report = StepReport(name, False, time.monotonic() - started, failed.what, failed.hint)
            self.reports.append(report)
            self._print(report)
            raise _Stopped from None
        report = StepReport(name, True, time.monotonic() - started, detail)
        self.reports.append(report)
        self._print(report)
        return value

    def _print(self, report: StepReport) -> None:
        mark = "[green]ok[/]  " if report.ok else "[bold red]FAIL[/]"
        self.console.print(
            f"{mark} {report.name:<13} {report.seconds:6.1f} s  {escape(report.detail)}",
            highlight=False,
        )
        if report.hint:
            self.console.print(f"     [bold]what to do:[/] {escape(report.hint)}", highlight=False)


async def run_check(args: argparse.Namespace, *, episode: Episode | None = None) -> int:
    """The `check` command (`episode` replaces the app's episode: tests break it on purpose)."""
    console = Console()
    row = _task(command_rows(args.tasks, console), args.task)
    checkpoint = checkpoint_arg(args.checkpoint)
    chosen = settings_from_args(args, args.checkpoint, checkpoint.template.source)
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    options = sandbox_options(args, out, sandbox_isolation(args))
    try:
        backend = sandbox_backend(args.sandbox, options)
    except ConfigurationError as error:
        raise UsageError(str(error)) from None
    console.print(
        f"swe-rl check: task {row.task.instance_id} of {args.tasks}, engine {args.engine_url}, "
        f"checkpoint {args.checkpoint}; everything goes to {out}",
        highlight=False,
    )
    steps = Checklist(console)
    check = _Check(args, row, chosen, backend, options, out, episode or ConfiguredEpisode())
    passed = True
    try:
        chosen = await steps.run("engine", check.engine)
        console.print(chosen.table())
        await steps.run("chat template", lambda: check.template(checkpoint))
        await steps.run("sandbox", check.sandbox)
        await steps.run("grading", check.grading)
        samples, replies = await steps.run("agent", check.agent)
        await steps.run("token trust", lambda: check.trust(samples, replies))
        await steps.run("samples", lambda: check.samples(samples))
    except _Stopped:
        passed = False
    _write_report(out / "check.json", steps.reports, chosen, passed)
    if passed:
        console.print("[bold green]check passed[/]: the stack runs an episode end to end")
        return 0
    failed = steps.reports[-1].name
    console.print(f"[bold red]check failed[/] at step {failed!r}; report: {out / 'check.json'}")
    return 1


def _task(rows: Sequence[TaskRow], instance_id: str | None) -> TaskRow:
    if instance_id is None:
        return rows[0]
    for row in rows:
        if row.task.instance_id == instance_id:
            return row
    raise UsageError(f"--task {instance_id}: no usable row has this instance id")


@dataclass(slots=True)
class _Check:
    args: argparse.Namespace
    row: TaskRow
    chosen: ResolvedSettings
    backend: SandboxBackend
    options: dict[str, str]
    out: Path
    episode: Episode

    async def engine(self) -> tuple[ResolvedSettings, str]:
        url = self.args.engine_url
        try:
            async with SGLangEngine(SGLangConfig(base_url=url)) as engine:
                context = await engine.context_length()
        except Exception as error:
            what = f"{url} does not answer as SGLang does: {error}"
            raise StepFailed(what, ENGINE_HINT) from None
        try:
            self.chosen = self.chosen.with_engine_context(context)
        except UsageError as error:
            hint = "leave rollout_max_context_len unset to use the engine's context"
            raise StepFailed(str(error), hint) from None
        used = self.chosen.context
        return self.chosen, f"{url} answers; context {context} tokens, episodes use {used}"

    async def template(self, checkpoint: Any) -> tuple[None, str]:
        mode = self.chosen.settings.template_mode
        try:
            verdict = await asyncio.to_thread(template_verdict, checkpoint, mode)
        except UsageError as error:
            raise StepFailed(str(error), TEMPLATE_HINT) from None
        return None, f"{checkpoint.template.name!r} is {verdict}, served in {mode.value} mode"

    async def sandbox(self) -> tuple[None, str]:
        task = self.row.task
        where = task.environment.label if task.environment is not None else "the host's /usr"
        repo = await self._repository()
        try:
            box = await self.backend.create(sandbox_spec(task, repo, env={}))
        except SandboxError as error:
            reason = environment_reason(task, "the sandbox cannot start", error)
            raise StepFailed(reason, SANDBOX_HINT) from None
        async with box:
            ran = await box.exec("true", timeout=60)
        if not ran.ok:
            why = ran.stderr.strip()[-300:] or f"exit {ran.exit_code}"
            raise StepFailed(f"a command in the sandbox on {where} failed: {why}", SANDBOX_HINT)
        return None, f"a {self.args.sandbox} sandbox on {where} with the task's workspace"

    async def _repository(self) -> Path | None:
        if self.row.task.in_image:
            return None
        try:
            return await RepoSources(CACHE / "sources").prepare(self.row.task)
        except SourceError as error:
            raise StepFailed(f"repository: {error}", SANDBOX_HINT) from None

    async def grading(self) -> tuple[None, str]:
        logs = self.out / "grading"
        config = ValidateConfig(self.backend, CACHE / "sources", logs=logs)
        result = await Validator(config).validate(self.row)
        if not result.ok:
            earned = f"empty change {_reward(result.empty)}, reference {_reward(result.gold)}"
            what = f"{result.reason} ({earned}; logs under {logs})"
            raise StepFailed(what, GRADING_HINT)
        return None, "the empty change earns 0, the reference solution 1"

    async def agent(self) -> tuple[tuple[list[Any], list[EngineReply]], str]:
        rollout = self.chosen.settings
        settings = BackendSettings(
            episode=rollout.episode_settings(GENERATE),
            agent=AgentSettings(self.args.agent),
            sandbox=SandboxSettings(self.args.sandbox, self.options),
            adapter=rollout.adapter_settings(),
        )
        base = StandInSample(
            index=0,
            group_index=0,
            prompt=self.row.prompt,
            label=self.row.task.instance_id,
            metadata=dict(self.row.metadata),
        )
        generate = make_generate(self.episode, sample_class=StandInSample)
        async with EngineRecorder(self.args.engine_url) as recorder:
            args = slime_args(
                recorder.url,
                self.args.checkpoint,
                settings,
                **rollout.slime_overrides(self.chosen.context),
            )
            try:
                samples: list[Any] = await generate(args, base, rollout.sampling_params())
            except ConfigError as error:
                raise StepFailed(
                    f"the generate function refused the run's settings: {error}",
                    "fix the setting it names (the settings file or its flag)",
                ) from None
            finally:
                await generate.aclose()
        replies = recorder.replies()
        try:
            facts = episode_facts(samples)
        except ValueError as error:
            raise StepFailed(
                f"the episode's samples carry no whole provenance: {error}",
                SAMPLES_HINT.format(out=self.out),
            ) from None
        outcome = facts.outcome
        directory = str(outcome.artifacts.get("dir", self.out / "episodes"))
        if outcome.status is EpisodeStatus.ABORTED:
            if not replies:
                raise StepFailed(
                    f"the agent CLI never reached the engine through the adapter: {outcome.reason}",
                    UNREACHABLE_HINT.format(dir=directory),
                )
            raise StepFailed(
                f"the episode aborted after {facts.turns} model calls: {outcome.reason}",
                ABORTED_HINT.format(dir=directory),
            )
        grading = outcome.artifacts.get("grading") or {}
        verdict = grading.get("verdict", "?") if isinstance(grading, Mapping) else "?"
        detail = (
            f"{self.args.agent} made {facts.turns} model calls through the adapter "
            f"({len(replies)} engine generations, {facts.health.tool_calls} tool calls); "
            f"its change earned {outcome.reward:g} ({verdict}); episode: {directory}"
        )
        return (samples, replies), detail

    async def trust(self, samples: list[Any], replies: list[EngineReply]) -> tuple[None, str]:
        hint = TRUST_HINT.format(out=self.out)
        trained, spans = trained_tokens_are_the_engines(samples, replies, hint)
        if not trained:
            raise StepFailed(
                "no token of the episode is trained", NOTHING_TRAINED_HINT.format(out=self.out)
            )
        used = len({id(r) for r in spans})
        return None, (
            f"{trained} trained tokens, each the engine's, after the prompt it was sent, with "
            f"its logprob ({used} of {len(replies)} engine generations trained)"
        )

    async def samples(self, samples: list[Any]) -> tuple[None, str]:
        hint = SAMPLES_HINT.format(out=self.out)
        path = self.out / "samples.jsonl"
        lines = [json.dumps(_sample_json(sample)) for sample in samples]
        path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
        rewards = {sample.reward for sample in samples}
        if len(rewards) != 1:
            raise StepFailed(f"the episode's samples carry different rewards: {rewards}", hint)
        kept = [sample for sample in samples if not sample.remove_sample]
        for sample in kept:
            where = f"sample {sample.index} ({sample.status.value})"
            sizes = {
                "response_length": sample.response_length,
                "loss_mask": len(sample.loss_mask or ()),
                "rollout_log_probs": len(sample.rollout_log_probs or ()),
            }
            if len(set(sizes.values())) != 1 or sample.response_length > len(sample.tokens):
                raise StepFailed(f"{where}: lengths disagree: {sizes}", hint)
            try:
                episode_facts([sample])
            except ValueError as error:
                raise StepFailed(f"{where}: its provenance is not whole: {error}", hint) from None
        statuses = ", ".join(sorted({sample.status.value for sample in kept})) or "none kept"
        return None, (
            f"{len(samples)} samples ({statuses}), reward {next(iter(rewards))}; written to {path}"
        )


def trained_tokens_are_the_engines(
    samples: Sequence[Any], replies: Sequence[EngineReply], hint: str
) -> tuple[int, list[EngineReply]]:
    """Every loss-1 token of every kept sample, run by run: each run is one or more engine
    generations back to back, each after exactly the prompt the engine was sent, with the
    engine's logprobs. Returns the trained tokens and the generations they are."""
    by_prompt: dict[tuple[int, ...], list[EngineReply]] = {}
    for reply in replies:
        by_prompt.setdefault(reply.input_ids, []).append(reply)
    trained = 0
    used: list[EngineReply] = []
    for sample in samples:
        if sample.remove_sample:
            continue
        tokens = list(sample.tokens)
        start = len(tokens) - sample.response_length
        mask = list(sample.loss_mask or ())
        logprobs = list(sample.rollout_log_probs or ())
        for first, end in _runs(mask):
            at = first
            while at < end:
                a = start + at
                prompt = tuple(tokens[:a])
                candidates = by_prompt.get(prompt, [])
                where = f"sample {sample.index}, response tokens {at}:{end}"
                if not candidates:
                    raise StepFailed(
                        f"{where} are trained, but the engine was never sent the prompt before "
                        f"them ({a} tokens)",
                        hint,
                    )
                match = _generation_at(candidates, tokens[a : start + end], logprobs[at:end])
                if match is None:
                    raise StepFailed(_mismatch(where, candidates, tokens[a : start + end]), hint)
                used.append(match)
                at += len(match.output_ids)
            trained += end - first
    return trained, used


def _generation_at(
    candidates: Sequence[EngineReply], ids: Sequence[int], logprobs: Sequence[float]
) -> EngineReply | None:
    for reply in candidates:
        size = len(reply.output_ids)
        if not size or size > len(ids):
            continue
        if tuple(ids[:size]) == reply.output_ids and tuple(logprobs[:size]) == reply.logprobs:
            return reply
    return None


def _mismatch(where: str, candidates: Sequence[EngineReply], ids: Sequence[int]) -> str:
    if any(tuple(ids[: len(r.output_ids)]) == r.output_ids for r in candidates if r.output_ids):
        return f"{where}: the trained logprobs are not the ones the engine returned"
    return f"{where}: the trained ids are not what the engine generated after that prompt"


def _runs(mask: Sequence[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    start = None
    for index, value in enumerate([*mask, 0]):
        if value and start is None:
            start = index
        elif not value and start is not None:
            runs.append((start, index))
            start = None
    return runs


def _reward(value: float | None) -> str:
    return "not graded" if value is None else f"{value:g}"


def _sample_json(sample: Any) -> dict[str, Any]:
    data = dataclasses.asdict(sample)
    return json.loads(json.dumps(data, default=_plain))  # type: ignore[no-any-return]


def _plain(value: object) -> object:
    if isinstance(value, enum.Enum):
        return value.value
    return str(value)


def _write_report(
    path: Path, reports: Sequence[StepReport], chosen: ResolvedSettings, passed: bool
) -> None:
    document = {
        "passed": passed,
        "steps": [dataclasses.asdict(report) for report in reports],
        "settings": chosen.record(),
    }
    path.write_text(json.dumps(document, indent=2), encoding="utf-8")
