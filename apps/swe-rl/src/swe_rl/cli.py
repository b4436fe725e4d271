"""`swe-rl`: the command line. With no arguments it runs the local demo.

    swe-rl                         the demo: scripted policy, real Claude Code, real sandboxes
    swe-rl rollout ...             the same episodes against a real SGLang server and checkpoint
    swe-rl check ...               preflight: one episode of one task, step by step
    swe-rl train RUN.toml          launch slime (`--dry-run` prints the command)
    swe-rl view RUN_DIR            (re)write a run's HTML trajectory viewer
    swe-rl convert-swebench IN OUT SWE-bench-family rows -> task rows, each in its image
    swe-rl convert-harbor DIR OUT  Harbor task directories -> task rows
    swe-rl validate TASKS          every task: empty change 0, reference solution 1

Bad arguments or inputs get one line saying what is wrong (exit 2), never a traceback; a run
interrupted with Ctrl-C stops cleanly (exit 130).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from rich.console import Console
from rich.markup import escape

from swe_rl import __version__, check_command
from swe_rl.engine_url import add_engine_arguments
from swe_rl.errors import UsageError
from swe_rl.rollout_flags import add_settings_arguments

if TYPE_CHECKING:
    from swe_rl.image_build import BuildahBuilder, BuiltImage

PROG = "swe-rl"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Reinforcement learning of coding agents on SWE tasks: real agent CLIs in "
        "sandboxes, token-faithful trajectories, tamper-proof grading, slime for training. "
        "Without a command, runs the local demo.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    demo = commands.add_parser(
        "demo",
        help="the local demo (the default): a scripted policy, real CLI, real sandboxes",
        description="Create tiny real repositories with a bug, run K episodes per task with a "
        "real agent CLI in local sandboxes through the real adapter, with the engine double "
        "playing a SCRIPTED policy (no model runs: there is no GPU here), grade them, compute "
        "GRPO advantages and write the samples and the trajectory viewer.",
    )
    _agent_options(demo)
    demo.add_argument("-k", "--episodes-per-task", type=_positive_int, default=4, metavar="K")
    demo.add_argument("--concurrency", type=_positive_int, default=4, metavar="N")
    demo.add_argument(
        "--out",
        type=Path,
        default=Path("runs/demo"),
        metavar="DIR",
        help="where the run's samples, episodes and viewer go (default: %(default)s)",
    )

    rollout = commands.add_parser(
        "rollout",
        help="run episodes of a task file against a real SGLang server",
        description="Run K episodes per task against a real SGLang server and the checkpoint "
        "it serves, grade them and write slime samples. Refuses to run model-written code "
        "outside a sandbox unless told to.",
    )
    rollout.add_argument("tasks", type=Path, help="task file (JSONL rows {prompt, metadata})")
    add_engine_arguments(rollout)
    _agent_options(rollout)
    rollout.add_argument("-k", "--episodes-per-task", type=_positive_int, default=8, metavar="K")
    rollout.add_argument("--concurrency", type=_positive_int, default=8, metavar="N")
    rollout.add_argument(
        "--sandbox",
        choices=("local", "e2b"),
        default="local",
        help="where episodes run (default: %(default)s)",
    )
    rollout.add_argument(
        "--ray", metavar="ADDRESS", help="spread episodes over the nodes of this Ray cluster"
    )
    rollout.add_argument("--out", type=Path, required=True, metavar="DIR")
    add_settings_arguments(rollout)
    _image_cache(rollout)
    rollout.add_argument(
        "--unsafe-no-sandbox",
        action="store_true",
        help="run the agent's commands as plain host processes (NEVER with "
        "a model you do not trust)",
    )

    check = commands.add_parser(
        "check", help=check_command.HELP, description=check_command.DESCRIPTION
    )
    check_command.add_check_arguments(check)
    _agent_options(check)
    _image_cache(check)

    train = commands.add_parser(
        "train",
        help="launch slime from a run file",
        description="Build the slime command from a TOML run file (see slime-backend's "
        "docs/example-run.toml) and submit it as a Ray job.",
    )
    train.add_argument("config", type=Path, help="the run file (TOML)")
    train.add_argument(
        "--dry-run",
        action="store_true",
        help="print the command and the files it would write, run nothing",
    )

    view = commands.add_parser(
        "view",
        help="write a run's HTML trajectory viewer",
        description="(Re)write RUN_DIR/viewer.html from the run's saved session trees.",
    )
    view.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    view.add_argument(
        "--checkpoint",
        type=Path,
        metavar="DIR",
        help="decode tokens with this checkpoint's tokenizer (default: the one the run recorded)",
    )

    convert = commands.add_parser(
        "convert-swebench",
        help="SWE-bench-family rows -> task rows, each in its own image",
        description="Convert SWE-bench-family rows (JSONL, or a JSON list) to task rows that "
        "run in each instance's image, with the official harness's test command and log "
        "parser (the swebench package). The gold patch goes to the row's reference (read by "
        "`validate` only), never to what an episode sees. Rows that cannot be graded are "
        "skipped and listed with the reason.",
    )
    convert.add_argument("input", type=Path)
    convert.add_argument("output", type=Path)
    convert.add_argument(
        "--image-prefix",
        default="swebench/sweb.eval.x86_64.",
        metavar="PREFIX",
        help="registry and repository prefix of the images (default: %(default)s; a mirror: "
        "registry.example/swebench/sweb.eval.x86_64.)",
    )
    convert.add_argument("--image-tag", default="latest", metavar="TAG")
    convert.add_argument(
        "--image-column",
        metavar="NAME",
        help="take each row's image from this column (SWE-smith: image_name, R2E-Gym: "
        "docker_image)",
    )
    _local_images(convert)
    convert.add_argument(
        "--template-prefix",
        metavar="PREFIX",
        help="E2B: a template per instance, PREFIX + instance_id",
    )
    convert.add_argument(
        "--test-command",
        metavar="CMD",
        help="the test command of every row (repositories the harness has no spec for)",
    )
    convert.add_argument(
        "--log-parser",
        metavar="NAME",
        help="the harness's log parser of every row: a repository (owner/name) or a parser "
        "function (parse_log_pytest)",
    )

    harbor = commands.add_parser(
        "convert-harbor",
        help="Harbor task directories -> task rows",
        description="Convert a Harbor task directory, or a directory of them, to task rows: "
        "instruction.md is the prompt, the task's image its environment, tests/test.sh its "
        "verifier (copied into the grading sandbox after the agent's change, its reward file "
        "the reward), solution/ its reference (read by `validate` only). Tasks whose "
        "environment is a Dockerfile that builds an image are built with --build-images "
        "(buildah, no daemon), else skipped with the reason.",
    )
    harbor.add_argument("input", type=Path, metavar="DIR")
    harbor.add_argument("output", type=Path)
    harbor.add_argument(
        "--workdir",
        metavar="PATH",
        help="the workspace when a task names none (default: the image's working directory)",
    )
    _local_images(harbor)
    harbor.add_argument(
        "--build-images",
        action="store_true",
        help="build the images of tasks whose Dockerfile builds one with buildah (root, or "
        "rootless with subordinate ids), each into an OCI layout under --images-dir; tasks "
        "that name an image keep it, pulled from its registry. An unchanged task is not "
        "built again",
    )
    harbor.add_argument(
        "--registry-mirror",
        type=_mirror,
        action="append",
        default=[],
        metavar="HOST=MIRROR",
        help="pull HOST's images (base images of builds) from MIRROR first, e.g. "
        "docker.io=mirror.internal:5000; repeatable",
    )
    _registry_access(harbor)
    harbor.add_argument(
        "--build-storage",
        type=Path,
        default=Path.home() / ".cache" / "agent-rl" / "buildah",
        metavar="DIR",
        help="buildah's storage, where base images are kept between builds (default: %(default)s)",
    )
    harbor.add_argument(
        "--build-timeout",
        type=_positive_float,
        default=3600.0,
        metavar="SECONDS",
        help="longest one image build may take (default: %(default)s)",
    )

    validate = commands.add_parser(
        "validate",
        help="check that every task grades the empty change 0 and its reference 1",
        description="For every task, in its own environment: the empty change must earn 0 and "
        "the reference solution (SWE-bench's gold patch, Harbor's solution/) must earn 1. "
        "Prints a table, writes the passing rows to --out, names every failure's reason. "
        "Resumable: results go to a state file as they come, and a rerun skips the tasks "
        "already validated.",
    )
    validate.add_argument("tasks", type=Path, help="task file (JSONL rows)")
    validate.add_argument(
        "--out", type=Path, metavar="FILE", help="where the passing rows go (JSONL)"
    )
    validate.add_argument(
        "--state",
        type=Path,
        metavar="FILE",
        help="the state file (default: TASKS with .validate-state.jsonl)",
    )
    validate.add_argument("--concurrency", type=_positive_int, default=4, metavar="N")
    validate.add_argument(
        "--retry-failed", action="store_true", help="validate earlier failures again"
    )
    validate.add_argument(
        "--logs", type=Path, metavar="DIR", help="keep every grading log under DIR"
    )
    validate.add_argument(
        "--cache-dir",
        type=Path,
        default=Path.home() / ".cache" / "agent-rl",
        metavar="DIR",
        help="prepared repositories (default: %(default)s)",
    )
    _image_cache(validate)
    return parser


def _image_cache(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--image-cache",
        type=Path,
        metavar="DIR",
        help="where registry images and OCI layouts are unpacked (default: "
        "$SWE_RL_IMAGE_CACHE, else ~/.cache/agent-rl/images)",
    )
    _registry_access(parser)


def _registry_access(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--plain-http",
        action="append",
        default=[],
        metavar="HOST[:PORT]",
        help="a registry spoken to over plain HTTP (a loopback or private one); repeatable, "
        "also $SWE_RL_REGISTRY_PLAIN_HTTP (comma-separated)",
    )
    parser.add_argument(
        "--registry-credentials",
        type=Path,
        metavar="FILE",
        help='JSON {"host": {"username": ..., "password": ...}} (default: '
        "$SWE_RL_REGISTRY_CREDENTIALS)",
    )


def _local_images(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--images-dir",
        type=Path,
        metavar="DIR",
        help="local images instead of a registry: one per image name under DIR (its / and : "
        "as _), as --image-format says",
    )
    parser.add_argument(
        "--image-format",
        choices=("oci_layout", "rootfs"),
        default="oci_layout",
        help="what --images-dir holds (default: %(default)s)",
    )


def _agent_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--agent",
        choices=("claude-code", "codex"),
        default="claude-code",
        help="the agent CLI (default: %(default)s)",
    )


def _mirror(text: str) -> tuple[str, str]:
    host, _, mirror = (part.strip() for part in text.partition("="))
    if not host or not mirror:
        raise argparse.ArgumentTypeError(f"not HOST=MIRROR: {text!r}")
    return host, mirror


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    console = Console(stderr=True, soft_wrap=True)
    words = list(sys.argv[1:] if argv is None else argv)
    if not words or (words[0] not in _HANDLERS and words[0] not in _TOP_LEVEL_OPTIONS):
        words = ["demo", *words]  # the demo is the default command, options and all
    try:
        args = build_parser().parse_args(words)
        return _HANDLERS[args.command](args)
    except UsageError as error:
        console.print(f"[bold red]{PROG}:[/] {escape(str(error))}", highlight=False)
        return 2
    except KeyboardInterrupt:
        console.print(f"[bold red]{PROG}:[/] interrupted")
        return 130


def _convert(args: argparse.Namespace) -> int:
    from swe_rl.swebench import ConversionOptions, convert_rows

    rows = _read_rows(args.input)
    options = ConversionOptions(
        image_prefix=args.image_prefix,
        image_tag=args.image_tag,
        image_column=args.image_column,
        images_dir=args.images_dir,
        image_format=args.image_format,
        template_prefix=args.template_prefix,
        test_command=args.test_command,
        log_parser=args.log_parser,
    )
    converted = convert_rows(rows, options)
    _write_rows(args.output, converted.rows)
    console = Console()
    console.print(f"wrote {len(converted.rows)} task rows to {args.output}")
    for line, instance, reason in converted.skipped:
        console.print(f"  skipped row {line} ({instance}): {reason}", highlight=False)
    return 0


def _convert_harbor(args: argparse.Namespace) -> int:
    from swe_rl.harbor import HarborOptions, convert_tasks, task_directories

    try:
        directories = task_directories(args.input)
    except OSError as error:
        raise UsageError(f"cannot read {args.input}: {error.strerror}") from None
    if not directories:
        raise UsageError(f"{args.input} holds no Harbor task (no task.toml)")
    console = Console(soft_wrap=True)  # a reason's path or build log stays whole
    if args.build_images:
        options = HarborOptions(workdir=args.workdir, builder=_builder(args, console))
    else:
        options = HarborOptions(
            workdir=args.workdir, images_dir=args.images_dir, image_format=args.image_format
        )
    converted = convert_tasks(directories, options)
    _write_rows(args.output, converted.rows)
    console.print(f"wrote {len(converted.rows)} task rows to {args.output}")
    for directory, reason in converted.skipped:
        console.print(f"  skipped {directory}: {reason}", highlight=False, markup=False)
    return 0


def _builder(args: argparse.Namespace, console: Console) -> _ShownBuilds:
    """`--build-images`: buildah, with the mirrors, plain-HTTP hosts and credentials given."""
    from swe_rl.environment import image_cache_config
    from swe_rl.image_build import BuildahBuilder, BuildConfig

    if args.images_dir is None:
        raise UsageError("--build-images needs --images-dir (where the built images go)")
    if args.image_format != "oci_layout":
        raise UsageError("--build-images writes OCI layouts: --image-format must be oci_layout")
    if shutil.which("buildah") is None:
        raise UsageError("--build-images needs buildah (Debian: apt-get install buildah)")
    try:
        registries = image_cache_config(
            plain_http=args.plain_http, credentials=args.registry_credentials
        )
    except ValueError as error:
        raise UsageError(str(error)) from None
    mirrors: dict[str, tuple[str, ...]] = {}
    for host, mirror in args.registry_mirror:
        mirrors[host] = (*mirrors.get(host, ()), mirror)
    config = BuildConfig(
        images_dir=args.images_dir.resolve(),
        storage_dir=args.build_storage.resolve(),
        mirrors=mirrors,
        plain_http=registries.plain_http,
        credentials=registries.credentials,
        timeout_s=args.build_timeout,
    )
    return _ShownBuilds(BuildahBuilder(config), console)


class _ShownBuilds:
    """The image builder, each build shown while it runs (the task, the time so far) and
    reported when done."""

    def __init__(self, builder: BuildahBuilder, console: Console) -> None:
        self.builder = builder
        self.console = console

    def build(self, name: str, context: Path) -> BuiltImage:
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        columns = (SpinnerColumn(), TextColumn("building {task.description}", markup=False))
        terminal = self.console.is_terminal  # elsewhere (a log): the result line only
        with Progress(
            *columns,
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
            disable=not terminal,
        ) as shown:
            shown.add_task(name, total=None)
            built = self.builder.build(name, context)
        if built.built:
            self.console.print(f"  built {name} in {built.seconds:.1f} s", markup=False)
        else:
            self.console.print(f"  {name}: built before ({built.tag})", markup=False)
        return built


def _write_rows(path: Path, rows: Sequence[dict[str, object]]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", encoding="utf-8") as out:
            for row in rows:
                out.write(json.dumps(row) + "\n")
    except OSError as error:
        raise UsageError(f"cannot write {path}: {error.strerror}") from None


def _validate(args: argparse.Namespace) -> int:
    from swe_rl.validate_command import run_validate

    return asyncio.run(run_validate(args))


def _read_rows(path: Path) -> list[dict[str, object]]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise UsageError(f"cannot read {path}: {error.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path} is not UTF-8 text") from None
    stripped = text.lstrip()
    try:
        if stripped.startswith("["):
            rows = json.loads(text)
        else:
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    except ValueError as error:
        raise UsageError(f"{path} is neither JSONL nor a JSON list: {error}") from None
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        raise UsageError(f"{path} must hold JSON objects, one per row")
    return rows


def _train(args: argparse.Namespace) -> int:
    from slime_backend import ConfigError
    from slime_backend.launcher import SlimeRunner

    try:
        runner = SlimeRunner.from_toml(args.config)
        if args.dry_run:
            runner.dry_run()
            return 0
        return runner.submit()  # without Ray: a ConfigError before anything is written
    except (OSError, ConfigError) as error:
        raise UsageError(str(error)) from None


def _demo(args: argparse.Namespace) -> int:
    from swe_rl.demo.run import run_demo

    return asyncio.run(run_demo(args))


def _rollout(args: argparse.Namespace) -> int:
    from swe_rl.rollout_command import run_rollout

    return asyncio.run(run_rollout(args))


def _view(args: argparse.Namespace) -> int:
    from swe_rl.viewing import write_run_viewer

    path = write_run_viewer(args.run_dir, args.checkpoint)
    Console().print(f"wrote {path}")
    return 0


_TOP_LEVEL_OPTIONS = ("-h", "--help", "--version")
_HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "demo": _demo,
    "rollout": _rollout,
    "check": check_command.run,
    "train": _train,
    "view": _view,
    "convert-swebench": _convert,
    "convert-harbor": _convert_harbor,
    "validate": _validate,
}
