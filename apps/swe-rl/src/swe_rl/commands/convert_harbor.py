"""`swe-rl convert-harbor DIR OUT`: Harbor task directories -> task rows (swe_rl/harbor.py),
building their images with buildah when asked."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from swe_rl.commands._arguments import local_images, positive_float, registry_access, write_rows
from swe_rl.errors import UsageError

if TYPE_CHECKING:
    from swe_rl.image_build import BuildahBuilder, BuiltImage

NAME = "convert-harbor"
HELP = "Harbor task directories -> task rows"
DESCRIPTION = (
    "Convert a Harbor task directory, or a directory of them, to task rows: "
    "instruction.md is the prompt, the task's image its environment, tests/test.sh its "
    "verifier (copied into the grading sandbox after the agent's change, its reward file "
    "the reward), solution/ its reference (read by `validate` only). Tasks whose "
    "environment is a Dockerfile that builds an image are built with --build-images "
    "(buildah, no daemon), else skipped with the reason."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("input", type=Path, metavar="DIR")
    parser.add_argument("output", type=Path)
    parser.add_argument(
        "--workdir",
        metavar="PATH",
        help="the workspace when a task names none (default: the image's working directory)",
    )
    local_images(parser)
    parser.add_argument(
        "--build-images",
        action="store_true",
        help="build the images of tasks whose Dockerfile builds one with buildah (root, or "
        "rootless with subordinate ids), each into an OCI layout under --images-dir; tasks "
        "that name an image keep it, pulled from its registry. An unchanged task is not "
        "built again",
    )
    parser.add_argument(
        "--registry-mirror",
        type=_mirror,
        action="append",
        default=[],
        metavar="HOST=MIRROR",
        help="pull HOST's images (base images of builds) from MIRROR first, e.g. "
        "docker.io=mirror.internal:5000; repeatable",
    )
    registry_access(parser)
    parser.add_argument(
        "--build-storage",
        type=Path,
        default=Path.home() / ".cache" / "agent-rl" / "buildah",
        metavar="DIR",
        help="buildah's storage, where base images are kept between builds (default: %(default)s)",
    )
    parser.add_argument(
        "--build-timeout",
        type=positive_float,
        default=3600.0,
        metavar="SECONDS",
        help="longest one image build may take (default: %(default)s)",
    )


def _mirror(text: str) -> tuple[str, str]:
    host, _, mirror = (part.strip() for part in text.partition("="))
    if not host or not mirror:
        raise argparse.ArgumentTypeError(f"not HOST=MIRROR: {text!r}")
    return host, mirror


def run(args: argparse.Namespace) -> int:
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
    write_rows(args.output, converted.rows)
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
