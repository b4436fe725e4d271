"""`swe-rl rollout`: K episodes per task against a real SGLang server, as slime would run them.

The generate function is slime-backend's, driven with slime's own argument names (the same
path slime's rollout takes on a GPU cluster); only the trainer is missing. Episodes run in this
process, or spread over a Ray cluster's nodes with `--ray ADDRESS` (one rollout worker per
node, each with its own adapter and sandboxes). Model-written code never runs outside a sandbox
unless `--unsafe-no-sandbox` says so.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from swe_rl.commands._arguments import (
    agent_option,
    image_cache,
    positive_int,
    sandbox_choice,
    unsafe_no_sandbox,
)
from swe_rl.engine_url import add_engine_arguments
from swe_rl.errors import UsageError
from swe_rl.rollout_flags import add_settings_arguments

if TYPE_CHECKING:
    from protocol_adapters import Checkpoint

NAME = "rollout"
HELP = "run episodes of a task file against a real SGLang server"
DESCRIPTION = (
    "Run K episodes per task against a real SGLang server and the checkpoint "
    "it serves, grade them and write slime samples. Refuses to run model-written code "
    "outside a sandbox unless told to."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("tasks", type=Path, help="task file (JSONL rows {prompt, metadata})")
    add_engine_arguments(parser)
    agent_option(parser)
    parser.add_argument("-k", "--episodes-per-task", type=positive_int, default=8, metavar="K")
    parser.add_argument("--concurrency", type=positive_int, default=8, metavar="N")
    sandbox_choice(parser, what="episodes run")
    parser.add_argument(
        "--ray", metavar="ADDRESS", help="spread episodes over the nodes of this Ray cluster"
    )
    parser.add_argument("--out", type=Path, required=True, metavar="DIR")
    add_settings_arguments(parser)
    image_cache(parser)
    unsafe_no_sandbox(parser)


def run(args: argparse.Namespace) -> int:
    return asyncio.run(run_rollout(args))


async def run_rollout(args: argparse.Namespace) -> int:
    from slime_backend import (
        AgentSettings,
        BackendSettings,
        SandboxSettings,
        WorkerSettings,
        to_mapping,
    )
    from slime_backend.generate import make_generate
    from slime_backend.testing import StandInSample, slime_args
    from swe_rl.rollout import ConfiguredEpisode
    from swe_rl.rollout_settings import settings_from_args, template_verdict
    from swe_rl.run import GenerateSource, Run, abort_counts, plan
    from swe_rl.task_file import command_rows
    from swe_rl.viewer import write_viewer

    console = Console()
    rows = command_rows(args.tasks, console)
    checkpoint = checkpoint_arg(args.checkpoint)
    chosen = settings_from_args(args, args.checkpoint, checkpoint.template.source)
    template_verdict(checkpoint, chosen.settings.template_mode)
    out: Path = args.out.resolve()  # made by the run, once every check has passed
    isolation = sandbox_isolation(args)
    chosen = chosen.with_engine_context(await engine_context(args.engine_url))
    console.print(chosen.table())
    rollout = chosen.settings
    settings = BackendSettings(
        episode=rollout.episode_settings("swe_rl.rollout.generate"),
        agent=AgentSettings(args.agent),
        sandbox=SandboxSettings(args.sandbox, sandbox_options(args, out, isolation)),
        adapter=rollout.adapter_settings(),
        workers=WorkerSettings(mode="ray" if args.ray else "local"),
    )
    if args.ray:
        _connect_ray(args.ray)
    slime = slime_args(
        args.engine_url, args.checkpoint, settings, **rollout.slime_overrides(chosen.context)
    )
    sampling = rollout.sampling_params()
    generate = make_generate(ConfiguredEpisode(), sample_class=StandInSample)

    run = Run(
        out=out,
        source=GenerateSource(generate, slime, sampling),
        concurrency=args.concurrency,
        title=f"swe-rl rollout: {args.tasks.name}",
        policy=str(args.checkpoint),
        agent=args.agent,
        extra={
            "checkpoint": str(args.checkpoint),
            "conversion": to_mapping(settings.conversion),
            "settings": chosen.record(),
        },
    )
    try:
        result = await run.execute(plan(rows, args.episodes_per_task))
    finally:
        await generate.aclose()
    vocabulary = checkpoint.vocabulary
    viewer = write_viewer(
        out, lambda token: vocabulary.decode([token]), options=settings.conversion
    )
    resolved = sum(record.reward > 0 for record in result.records)
    console.print(
        f"{len(result.records)} episodes ({resolved} rewarded) in {result.duration_s:.0f} s; "
        f"samples: {result.samples_path}; viewer: {viewer}"
    )
    aborts = abort_counts(result.records)
    if aborts:
        counted = ", ".join(f"{cause} {count}" for cause, count in aborts.items())
        console.print(f"aborted (never trained), by cause: {counted}", highlight=False)
    if result.gates.tripped:
        console.print(f"[bold red]ALARM[/] {result.gates.describe()}", highlight=False)
    for problem in result.write_errors:
        console.print(f"[bold red]samples not written[/] {problem}", highlight=False)
    if result.failure is not None:
        console.print(f"[bold red]the run stopped[/] {result.failure}", highlight=False)
    if result.interrupted:
        return 130
    return 1 if result.write_errors or result.failure is not None else 0


def checkpoint_arg(directory: Path) -> Checkpoint:
    """The --checkpoint directory's tokenizer and chat template, or the user's error."""
    from protocol_adapters import CheckpointError, load_checkpoint

    try:
        return load_checkpoint(directory)
    except (OSError, CheckpointError) as error:
        raise UsageError(f"--checkpoint {directory}: {error}") from None


def sandbox_options(args: argparse.Namespace, out: Path, isolation: str) -> dict[str, str]:
    """The sandbox options every rollout worker builds its backend from (swe_rl.rollout):
    where episodes write, the isolation, and the node's image cache and registry settings
    (a bad credentials file is the user's error now, not each worker's later)."""
    from swe_rl.environment import image_cache_config

    options = {
        "artifacts_root": str(out / "episodes"),
        "isolation": isolation,
        "allow_unsandboxed": "true" if args.unsafe_no_sandbox else "false",
    }
    if args.image_cache is not None:
        options["image_cache"] = str(args.image_cache.resolve())
    if args.plain_http:
        options["registry_plain_http"] = ",".join(args.plain_http)
    if args.registry_credentials is not None:
        try:
            image_cache_config(args.image_cache, credentials=args.registry_credentials)
        except ValueError as error:
            raise UsageError(str(error)) from None
        options["registry_credentials"] = str(args.registry_credentials.resolve())
    return options


def sandbox_isolation(args: argparse.Namespace) -> str:
    """bubblewrap, or none when told: a real model's commands never run unsandboxed otherwise."""
    if args.unsafe_no_sandbox:
        return "none"
    if args.sandbox == "local" and shutil.which("bwrap") is None:
        raise UsageError(
            "bubblewrap is not installed, and a real model's commands never run unsandboxed: "
            "install it (sudo apt-get install bubblewrap), use --sandbox e2b, or pass "
            "--unsafe-no-sandbox if you accept running model-written code on this host"
        )
    return "bwrap"


async def engine_context(url: str) -> int:
    """The engine's context length (what SGLang reports), or the user's error saying why not."""
    from protocol_adapters import SGLangConfig, SGLangEngine

    try:
        async with SGLangEngine(SGLangConfig(base_url=url)) as engine:
            return await engine.context_length()
    except Exception as error:
        raise UsageError(
            f"cannot ask the engine at {url} for its context length: {error}"
        ) from None


def _connect_ray(address: str) -> None:
    try:
        import ray
    except ImportError:
        raise UsageError("--ray needs Ray: install agent-rl-swe-rl[ray]") from None
    ray.init(address=address)
