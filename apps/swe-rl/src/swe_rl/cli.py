"""`swe-rl`: the command line. With no arguments it runs the local demo.

    swe-rl                         the demo: scripted policy, real Claude Code, real sandboxes
    swe-rl rollout ...             the same episodes against a real SGLang server and checkpoint
    swe-rl train RUN.toml          launch slime (`--dry-run` prints the command)
    swe-rl view RUN_DIR            (re)write a run's HTML trajectory viewer
    swe-rl convert-swebench IN OUT SWE-bench rows -> task rows

Bad arguments or inputs get one line saying what is wrong (exit 2), never a traceback; a run
interrupted with Ctrl-C stops cleanly (exit 130).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from rich.console import Console

from swe_rl import __version__
from swe_rl.errors import UsageError

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
    rollout.add_argument(
        "--engine-url",
        required=True,
        metavar="URL",
        help="SGLang server (or router), e.g. http://10.0.0.5:30000",
    )
    rollout.add_argument(
        "--checkpoint",
        type=Path,
        required=True,
        metavar="DIR",
        help="the Hugging Face checkpoint directory the engine serves "
        "(tokenizer and chat template)",
    )
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
    rollout.add_argument(
        "--context-tokens",
        type=_positive_int,
        metavar="N",
        help="context length (default: what the engine reports)",
    )
    rollout.add_argument(
        "--budget",
        type=_positive_float,
        default=1800.0,
        metavar="SECONDS",
        help="wall-clock budget of each agent run (default: %(default)s)",
    )
    rollout.add_argument(
        "--unsafe-no-sandbox",
        action="store_true",
        help="run the agent's commands as plain host processes (NEVER with "
        "a model you do not trust)",
    )

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
        help="SWE-bench rows -> task rows",
        description="Convert SWE-bench rows (JSONL, or a JSON list) to task rows. The gold "
        "patch is never copied. Rows whose tests pytest does not run are skipped and listed.",
    )
    convert.add_argument("input", type=Path)
    convert.add_argument("output", type=Path)
    source = convert.add_mutually_exclusive_group()
    source.add_argument(
        "--repos-dir",
        type=Path,
        metavar="DIR",
        help="local mirrors, one per repository, named owner__name",
    )
    source.add_argument(
        "--template-prefix",
        metavar="PREFIX",
        help="E2B template per instance: PREFIX + instance_id",
    )
    convert.add_argument(
        "--setup-command",
        action="append",
        default=[],
        metavar="CMD",
        help="a setup command for every task (repeatable)",
    )
    convert.add_argument(
        "--python",
        default="python3",
        metavar="CMD",
        help="the task environment's interpreter that has pytest (default: python3)",
    )
    convert.add_argument(
        "--pytest-plugin",
        action="append",
        default=[],
        metavar="MODULE",
        help="a pytest plugin module the tests need; plugin autoloading is off (repeatable)",
    )
    return parser


def _agent_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--agent",
        choices=("claude-code", "codex"),
        default="claude-code",
        help="the agent CLI (default: %(default)s)",
    )


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
        console.print(f"[bold red]{PROG}:[/] {error}", highlight=False)
        return 2
    except KeyboardInterrupt:
        console.print(f"[bold red]{PROG}:[/] interrupted")
        return 130


def _convert(args: argparse.Namespace) -> int:
    from swe_rl.swebench import ConversionOptions, convert_rows

    rows = _read_rows(args.input)
    options = ConversionOptions(
        repos_dir=args.repos_dir,
        template_prefix=args.template_prefix,
        setup_commands=tuple(args.setup_command),
        python=args.python,
        plugins=tuple(args.pytest_plugin),
    )
    converted = convert_rows(rows, options)
    try:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        with args.output.open("w", encoding="utf-8") as out:
            for row in converted.rows:
                out.write(json.dumps(row) + "\n")
    except OSError as error:
        raise UsageError(f"cannot write {args.output}: {error.strerror}") from None
    console = Console()
    console.print(f"wrote {len(converted.rows)} task rows to {args.output}")
    for line, instance, reason in converted.skipped:
        console.print(f"  skipped row {line} ({instance}): {reason}", highlight=False)
    return 0


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
    except (OSError, ConfigError) as error:
        raise UsageError(str(error)) from None
    if args.dry_run:
        runner.dry_run()
        return 0
    return runner.submit()


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
    "train": _train,
    "view": _view,
    "convert-swebench": _convert,
}
