"""Task images in local sandboxes: first command, create at scale, unpack speed, disk and memory.

    uv run tools/bench/image_bench.py                      # the Debian image (~240 MB), 10-20 min
    uv run tools/bench/image_bench.py --quick              # a ~6 MB image of host binaries, < 1 min
    uv run tools/bench/image_bench.py --concurrency 20 --repo-files 500

The image has two gzip tar layers, as a task image does: an environment (the Debian bookworm
root with python3-minimal and git that the sandbox tests build with mmdebstrap, cached under
.cache/test-images or $SANDBOX_TEST_IMAGE_CACHE, built here by root when missing) and a task
repository in /testbed (`--repo-files` generated Python modules, committed and packed; the
image's WorkingDir). `--quick` replaces the environment with bash, df and their libraries
copied from the host. The layers are made here (GNU tar in PAX format, gzip -6), written as an
OCI layout and pushed with skopeo to Debian's docker-registry, started on 127.0.0.1 with plain
HTTP and no authentication (a token round trip is one small request per pull; see
docs/images.md). Everything runs on loopback; the registry and every temporary directory are
removed at the end, whatever happens.

1. Time to a first command (create + exec("true")): uncached (pull, unpack, boot, workspace
   copy; a fresh cache directory each run, earlier runs' writeback flushed first) from the
   registry and from the OCI layout, and the pull alone (ImageCache.acquire), with the CPU
   this process spent (the pull and unpack run in its worker threads); cached, by tag (the
   registry is asked what the tag names) and by digest (no network), the same root as a
   RootfsImage (no cache at all), and the host-root default.
2. Sandbox create on the cached image at 1 and `--concurrency` in flight: ImageWorkspace (the
   repository copied into the sandbox's tmpfs), the image with an empty workspace, and the
   host-root default (SandboxSpec()), side by side: p50 / p95 / max per create, the wall time
   of a batch, the ratios to the host root.
3. Unpack throughput: the cache's unpacker against GNU tar on the same layer files, both gzip
   and plain tar (and gzip -d alone), MB/s of uncompressed layer data, by wall time and by CPU
   time (this process's and its children's: on a loaded machine the wall time is mostly
   waiting for a core); the trees of the first run are compared entry by entry.
4. 16 sandboxes on one image: the cache's size on disk (du) with none and with 16 open (one
   copy of the image, whatever the count), and what the 16 workspace copies take in tmpfs (df
   inside each sandbox, and the shmem charged to each sandbox's memory cgroup).

Needs root (as the sandboxes' cgroups and the Debian build do), bubblewrap, docker-registry,
skopeo, GNU tar and gzip (`apt-get install -y bubblewrap docker-registry skopeo mmdebstrap`).
Exit status 1 when an answer is wrong: a command fails, a workspace holds the wrong files, a
pull did not land in the cache, the two unpacked trees differ, or the cache holds more than one
copy of the image.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import hashlib
import json
import os
import platform
import random
import resource
import secrets
import shutil
import socket
import stat
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from sandbox import (
    ImageCache,
    ImageCacheConfig,
    ImageWorkspace,
    LocalBackend,
    LocalConfig,
    OciLayoutImage,
    RegistryImage,
    RootfsImage,
    SandboxSpec,
)
from sandbox._images import host_platform
from sandbox._images._unpack import Unpacker
from sandbox._local._commands import CommandSandbox

REPO_ROOT = Path(__file__).resolve().parents[2]
SUITE = "bookworm"
PACKAGES = ("python3-minimal", "git")
BASE_TESTBED = {"calc.py": "def add(a, b):\n    return a - b\n", "README": "a task\n"}
"""The Debian root's /testbed, as the sandbox tests build it (image_roots.py)."""
LAYOUT_REF = "bench"
MB = 1_000_000
MiB = 1 << 20
GIT_ENV = {
    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_AUTHOR_NAME": "bench",
    "GIT_AUTHOR_EMAIL": "bench@example.invalid",
    "GIT_COMMITTER_NAME": "bench",
    "GIT_COMMITTER_EMAIL": "bench@example.invalid",
    "GIT_AUTHOR_DATE": "2024-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2024-01-01T00:00:00Z",
}
WORDS = ("parse", "token", "value", "cache", "index", "route", "frame", "batch", "graph")


class Problems:
    """Wrong answers seen along the way: each one makes the exit status 1."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.found: list[str] = []

    def check(self, ok: bool, what: str) -> None:
        if not ok:
            self.found.append(what)
            self.console.print(f"[bold red]WRONG[/]: {what}")


def run(*command: str | Path, **options: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(part) for part in command], check=True, capture_output=True, text=True, **options
    )


def git(repo: Path, *args: str) -> None:
    run("git", *args, cwd=repo, env=GIT_ENV)


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def du(path: Path) -> int:
    """Bytes `path` takes on disk, as `du` counts them."""
    return int(run("du", "-s", "--block-size=1", path).stdout.split()[0])


def apparent_bytes(path: Path) -> int:
    total = 0
    for top, _, files in os.walk(path):
        for name in files:
            total += os.lstat(os.path.join(top, name)).st_size
    return total


def load() -> str:
    return "/".join(f"{value:.1f}" for value in os.getloadavg())


# -- the image ---------------------------------------------------------------------------------


def image_cache() -> Path:
    named = os.environ.get("SANDBOX_TEST_IMAGE_CACHE")
    return Path(named) if named else REPO_ROOT / ".cache" / "test-images"


def debian_root() -> Path:
    """The sandbox tests' Debian root (image_roots.py), built the same way when missing."""
    cache = image_cache()
    root = cache / f"debian-{SUITE}-{'-'.join(PACKAGES)}"
    if (root / "testbed" / ".git").is_dir():
        return root
    if os.geteuid() != 0:
        raise SystemExit(f"no Debian root at {root}: run once as root to build it")
    if shutil.which("mmdebstrap") is None:
        raise SystemExit("mmdebstrap is not installed (apt-get install mmdebstrap)")
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / "testbed" / ".git").is_dir():
            building = Path(tempfile.mkdtemp(prefix="building-", dir=cache))
            try:
                run(
                    "mmdebstrap",
                    "--quiet",
                    "--variant=essential",
                    f"--include={','.join(PACKAGES)}",
                    SUITE,
                    building,
                )
                make_base_testbed(building / "testbed")
                building.chmod(0o755)
                shutil.rmtree(root, ignore_errors=True)
                building.rename(root)
            except BaseException:
                shutil.rmtree(building, ignore_errors=True)
                raise
    return root


def make_base_testbed(testbed: Path) -> None:
    testbed.mkdir()
    for name, text in BASE_TESTBED.items():
        (testbed / name).write_text(text)
    git(testbed, "init", "-q", "-b", "main")
    git(testbed, "add", "-A")
    git(testbed, "commit", "-q", "-m", "base")


def host_root(where: Path) -> Path:
    """A small root for --quick: the host's bash and df with the libraries they load, an
    /etc/passwd and the same base /testbed as the Debian root."""
    root = where / "quick-root"
    for directory in ("bin", "etc", "root"):
        (root / directory).mkdir(parents=True)
    for program in ("bash", "df"):
        found = shutil.which(program)
        if found is None:
            raise SystemExit(f"{program} is not on PATH")
        shutil.copy2(os.path.realpath(found), root / "bin" / program)
        for line in run("ldd", found).stdout.splitlines():
            words = line.split()
            library = words[2] if "=>" in words and len(words) > 2 else words[0]
            if not library.startswith("/"):
                continue  # the vDSO
            target = root / library.lstrip("/")
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(os.path.realpath(library), target)
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (root / "etc" / "group").write_text("root:x:0:\n")
    make_base_testbed(root / "testbed")
    root.chmod(0o755)
    return root


def module_text(rng: random.Random, index: int) -> str:
    """A Python module of 1-8 KB, varied enough to compress like source does."""
    lines = [f'"""Module {index} of the bench task repository."""', "", "import os", ""]
    target, size, number = rng.randint(1000, 8000), 0, 0
    while size < target:
        name = f"{rng.choice(WORDS)}_{rng.choice(WORDS)}_{number}"
        a, b = rng.choice(WORDS), rng.choice(WORDS)
        body = [
            "",
            f"def {name}({a}, {b}=None):",
            f'    """Return the {a} of {b} ({rng.randint(0, 10**6)})."""',
            f"    if {b} is None:",
            f"        {b} = os.environ.get({name.upper()!r}, {rng.randint(0, 999)})",
            f"    return [{a} * {rng.randint(2, 97)} + item for item in range({b})]",
        ]
        lines += body
        size += sum(len(line) + 1 for line in body)
        number += 1
    return "\n".join(lines) + "\n"


def make_task_layer(base_testbed: Path, layer: Path, files: int) -> int:
    """Layer 2: the base /testbed plus `files` modules, committed and packed. Returns the
    number of files in the layer's /testbed."""
    testbed = layer / "testbed"
    shutil.copytree(base_testbed, testbed, symlinks=True)
    rng = random.Random(17)
    for index in range(files):
        path = testbed / "src" / f"pkg{index % 40}" / f"mod{index}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(module_text(rng, index))
    git(testbed, "add", "-A")
    git(testbed, "commit", "-q", "-m", f"task repository: {files} modules")
    git(testbed, "gc", "-q", "--prune=now")
    return sum(len(names) for _, _, names in os.walk(testbed))


@dataclass(frozen=True)
class Layer:
    tar: Path
    blob: Path
    diff_id: str
    digest: str
    tar_size: int
    blob_size: int


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(4 * MiB):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def pack_layer(directory: Path, out: Path) -> Layer:
    """A reproducible PAX tar of `directory` (names sorted, numeric owners, no atime/ctime)
    and its gzip."""
    tar = out / f"{directory.name}.tar"
    run(
        "tar",
        "--create",
        "--format=pax",
        "--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime",
        "--sort=name",
        "--numeric-owner",
        "-C",
        directory,
        "-f",
        tar,
        ".",
    )
    blob = out / f"{directory.name}.tar.gz"
    with blob.open("wb") as compressed:
        subprocess.run(["gzip", "-n", "-6", "-c", str(tar)], stdout=compressed, check=True)
    return Layer(
        tar, blob, sha256_file(tar), sha256_file(blob), tar.stat().st_size, blob.stat().st_size
    )


def write_layout(path: Path, layers: list[Layer]) -> str:
    """An OCI layout holding one image tagged LAYOUT_REF; returns its manifest digest."""
    blobs = path / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    (path / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')

    def blob(data: bytes, media_type: str) -> dict[str, Any]:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        (blobs / digest.removeprefix("sha256:")).write_bytes(data)
        return {"mediaType": media_type, "digest": digest, "size": len(data)}

    layer_descriptors = []
    for layer in layers:
        os.link(layer.blob, blobs / layer.digest.removeprefix("sha256:"))
        layer_descriptors.append(
            {
                "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                "digest": layer.digest,
                "size": layer.blob_size,
            }
        )
    machine = host_platform()
    config = {
        "os": machine.os,
        "architecture": machine.architecture,
        **({"variant": machine.variant} if machine.variant else {}),
        "config": {
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "WorkingDir": "/testbed",
        },
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]},
        "history": [{"created_by": "image_bench.py"} for _ in layers],
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": blob(json.dumps(config).encode(), "application/vnd.oci.image.config.v1+json"),
        "layers": layer_descriptors,
    }
    descriptor = blob(json.dumps(manifest).encode(), str(manifest["mediaType"]))
    descriptor["annotations"] = {"org.opencontainers.image.ref.name": LAYOUT_REF}
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [descriptor],
    }
    (path / "index.json").write_text(json.dumps(index))
    return str(descriptor["digest"])


# -- the registry ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextmanager
def running_registry(directory: Path) -> Iterator[str]:
    """Debian's docker-registry on 127.0.0.1 (plain HTTP, no auth); yields its host:port and
    stops it on the way out."""
    binary = shutil.which("docker-registry")
    if binary is None:
        raise SystemExit("docker-registry is not installed (apt-get install docker-registry)")
    directory.mkdir()
    host = f"127.0.0.1:{free_port()}"
    config = directory / "registry.yml"
    config.write_text(
        "version: 0.1\n"
        "log:\n  level: error\n  accesslog:\n    disabled: true\n"
        f"storage:\n  filesystem:\n    rootdirectory: {directory / 'storage'}\n"
        f"http:\n  addr: {host}\n  secret: {secrets.token_hex(16)}\n"
    )
    log = directory / "registry.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [binary, "serve", str(config)], stdout=output, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise SystemExit(f"docker-registry exited:\n{log.read_text()}")
            try:
                urllib.request.urlopen(f"http://{host}/v2/", timeout=2).close()
                break
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    raise SystemExit(f"docker-registry did not start:\n{log.read_text()}") from None
                time.sleep(0.05)
        yield host
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def push(layout: Path, host: str, repository: str, home: Path) -> None:
    skopeo = shutil.which("skopeo")
    if skopeo is None:
        raise SystemExit("skopeo is not installed (apt-get install skopeo)")
    run(
        skopeo,
        "--insecure-policy",
        "copy",
        "--quiet",
        "--preserve-digests",
        "--dest-tls-verify=false",
        f"oci:{layout}:{LAYOUT_REF}",
        f"docker://{host}/{repository}",
        env={**os.environ, "HOME": str(home)},
    )


# -- sandboxes ---------------------------------------------------------------------------------


@dataclass
class Bench:
    """What every measurement needs: where things go, the image and how to reach it."""

    work: Path
    host: str
    repository: str
    digest: str
    layout: Path
    layers: list[Layer]
    expected: dict[str, str]
    """Workspace files (relative to /testbed) and their content, to check a copy by."""
    problems: Problems
    progress: Progress
    console: Console
    counter: int = 0
    warm: Path | None = None

    def fresh(self, name: str) -> Path:
        self.counter += 1
        path = self.work / f"{name}-{self.counter}"
        path.mkdir()
        return path

    async def warm_cache(self) -> Path:
        """A cache that holds the image, pulled once for the sections that need it cached."""
        if self.warm is None:
            cache = self.fresh("cache")
            backend = self.backend(cache)
            await first_command(backend, image_spec(self.by_tag()))
            self.warm = cache
        return self.warm

    def images(self, cache: Path) -> ImageCacheConfig:
        return ImageCacheConfig(root=cache, plain_http=(self.host,))

    def backend(self, cache: Path) -> LocalBackend:
        state = self.fresh("state")
        return LocalBackend(LocalConfig(state_root=state, images=self.images(cache)))

    def by_tag(self) -> RegistryImage:
        return RegistryImage(f"{self.host}/{self.repository}")

    def by_digest(self) -> RegistryImage:
        name = self.repository.rpartition(":")[0]
        return RegistryImage(f"{self.host}/{name}@{self.digest}")

    async def check_workspace(self, box: CommandSandbox, what: str) -> None:
        for name, text in self.expected.items():
            found = await box.read_text(name)
            self.problems.check(found == text, f"{what}: the workspace's {name} differs")

    def check_cached(self, cache: Path, what: str) -> None:
        unpacked = cache / "images" / self.digest.removeprefix("sha256:") / "rootfs"
        self.problems.check(unpacked.is_dir(), f"{what}: no unpacked root in the cache")


async def first_command(backend: LocalBackend, spec: SandboxSpec) -> tuple[float, float]:
    """create, then exec("true"): the seconds each took."""
    t0 = time.perf_counter()
    box = await backend.create(spec)
    t1 = time.perf_counter()
    try:
        result = await box.exec("true")
        t2 = time.perf_counter()
    finally:
        await box.close()
    if not result.ok:
        raise RuntimeError(f"exec('true') failed: {result}")
    return t1 - t0, t2 - t1


def image_spec(
    image: RegistryImage | OciLayoutImage | RootfsImage, workspace: bool = True
) -> SandboxSpec:
    return (
        SandboxSpec(image=image, workspace=ImageWorkspace())
        if workspace
        else SandboxSpec(image=image)
    )


@dataclass
class Row:
    create: list[float] = field(default_factory=list)
    exec: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)

    def totals(self) -> list[float]:
        if not self.exec:
            return self.create
        return [c + e for c, e in zip(self.create, self.exec, strict=True)]


async def first_command_table(bench: Bench, runs: int, rounds: int) -> Table:
    rows: dict[str, Row] = {
        name: Row()
        for name in (
            "registry by tag, uncached",
            "OCI layout, uncached",
            "ImageCache.acquire alone, registry, uncached",
            "registry by tag, cached",
            "registry by digest, cached",
            "RootfsImage of the cached root (no cache)",
            "host root: SandboxSpec() (no image)",
        )
    }
    task = bench.progress.add_task("first command, uncached", total=3 * runs)
    for _ in range(runs):  # the three uncached kinds in turn, so noise hits them alike
        for name, image in (
            ("registry by tag, uncached", bench.by_tag()),
            ("OCI layout, uncached", OciLayoutImage(bench.layout, LAYOUT_REF)),
        ):
            cache = bench.fresh("cache")
            backend = bench.backend(cache)
            await backend.enforcement()  # the backend's one-time probe, not the image's cost
            await asyncio.to_thread(os.sync)  # earlier runs' writeback, out of this one's time
            cpu = own_cpu_seconds()
            create, first_exec = await first_command(backend, image_spec(image))
            rows[name].cpu.append(own_cpu_seconds() - cpu)
            rows[name].create.append(create)
            rows[name].exec.append(first_exec)
            bench.check_cached(cache, name)
            await asyncio.to_thread(shutil.rmtree, cache)
            bench.progress.advance(task)
        cache = bench.fresh("cache")
        images = ImageCache(bench.images(cache))
        await asyncio.to_thread(os.sync)
        cpu, t0 = own_cpu_seconds(), time.perf_counter()
        lease = await images.acquire(bench.by_tag())
        row = rows["ImageCache.acquire alone, registry, uncached"]
        row.create.append(time.perf_counter() - t0)
        row.cpu.append(own_cpu_seconds() - cpu)
        await lease.release()
        bench.check_cached(cache, "ImageCache.acquire")
        await asyncio.to_thread(shutil.rmtree, cache)
        bench.progress.advance(task)

    cache = await bench.warm_cache()
    backend = bench.backend(cache)
    await backend.enforcement()  # the backend's one-time probe, not counted
    async with await backend.create(image_spec(bench.by_digest())) as box:
        await bench.check_workspace(box, "cached by digest")
    rootfs = RootfsImage(
        cache / "images" / bench.digest.removeprefix("sha256:") / "rootfs",
        working_dir=PurePosixPath("/testbed"),
    )
    # Its first create searches the root for sockets, once per backend: not counted.
    await first_command(backend, image_spec(rootfs))
    cached = {
        "registry by tag, cached": image_spec(bench.by_tag()),
        "registry by digest, cached": image_spec(bench.by_digest()),
        "RootfsImage of the cached root (no cache)": image_spec(rootfs),
        "host root: SandboxSpec() (no image)": SandboxSpec(),
    }
    task = bench.progress.add_task("first command, cached", total=rounds * len(cached))
    for _ in range(rounds):
        for name, spec in cached.items():
            create, first_exec = await first_command(backend, spec)
            rows[name].create.append(create)
            rows[name].exec.append(first_exec)
            bench.progress.advance(task)

    table = Table(title=f"time to a first command (load {load()} at the end)")
    for column in (
        "source",
        "n",
        "create median",
        "first exec median",
        "total median",
        "min-max",
        "CPU of this process",
    ):
        table.add_column(column, justify="right" if column != "source" else "left")
    for name, row in rows.items():
        totals = row.totals()
        table.add_row(
            name,
            str(len(totals)),
            seconds(statistics.median(row.create)),
            seconds(statistics.median(row.exec)) if row.exec else "-",
            seconds(statistics.median(totals)),
            f"{seconds(min(totals))}-{seconds(max(totals))}",
            seconds(statistics.median(row.cpu)) if row.cpu else "-",
        )
    return table


def seconds(value: float) -> str:
    return f"{value:.2f} s" if value >= 1 else f"{value * 1000:.0f} ms"


async def create_batch(
    backend: LocalBackend, spec: SandboxSpec, count: int
) -> tuple[list[float], float, list[CommandSandbox]]:
    """`count` creates at once: each one's seconds, the batch's wall time, the sandboxes."""

    async def one() -> tuple[float, CommandSandbox]:
        t0 = time.perf_counter()
        box = await backend.create(spec)
        return time.perf_counter() - t0, box

    start = time.perf_counter()
    done = await asyncio.gather(*(one() for _ in range(count)), return_exceptions=True)
    wall = time.perf_counter() - start
    boxes = [item[1] for item in done if isinstance(item, tuple)]
    failures = [item for item in done if isinstance(item, BaseException)]
    if failures:
        await asyncio.gather(*(box.close() for box in boxes))
        raise failures[0]
    return [item[0] for item in done if isinstance(item, tuple)], wall, boxes


async def concurrency_table(bench: Bench, concurrency: int, rounds: int, batches: int) -> Table:
    cache = await bench.warm_cache()
    backend = bench.backend(cache)
    await backend.enforcement()  # the backend's one-time probe, not counted
    variants = {
        "host root: SandboxSpec()": SandboxSpec(),
        "image + ImageWorkspace": image_spec(bench.by_tag()),
        "image, empty workspace": image_spec(bench.by_tag(), workspace=False),
    }
    table = Table(title=f"sandbox create on a cached image, by tag (load {load()} at the start)")
    for column in (
        "variant",
        "in flight",
        "n",
        "p50",
        "p95",
        "max",
        "batch wall (median)",
        "p50 vs host",
        "wall vs host",
    ):
        table.add_column(column, justify="left" if column == "variant" else "right")
    for spec in variants.values():  # warm-up, not counted
        await first_command(backend, spec)
    for in_flight, repeats in ((1, rounds), (concurrency, batches)):
        creates: dict[str, list[float]] = {name: [] for name in variants}
        walls: dict[str, list[float]] = {name: [] for name in variants}
        task = bench.progress.add_task(
            f"create, {in_flight} in flight", total=repeats * len(variants)
        )
        for _ in range(repeats):  # the variants in turn, so noise hits them alike
            for name, spec in variants.items():
                times, wall, boxes = await create_batch(backend, spec, in_flight)
                try:
                    if spec.workspace == ImageWorkspace():
                        await bench.check_workspace(boxes[0], f"{name}, {in_flight} in flight")
                finally:
                    await asyncio.gather(*(box.close() for box in boxes))
                creates[name] += times
                walls[name].append(wall)
                bench.progress.advance(task)
        host_p50 = statistics.median(creates["host root: SandboxSpec()"])
        host_wall = statistics.median(walls["host root: SandboxSpec()"])
        for name in variants:
            p50, wall = statistics.median(creates[name]), statistics.median(walls[name])
            table.add_row(
                name,
                str(in_flight),
                str(len(creates[name])),
                seconds(p50),
                seconds(percentile(creates[name], 0.95)),
                seconds(max(creates[name])),
                seconds(wall),
                f"{p50 / host_p50:.2f}x",
                f"{wall / host_wall:.2f}x",
            )
        table.add_section()
    return table


# -- unpack throughput -------------------------------------------------------------------------


def unpack_ours(layers: list[Layer], target: Path, compressed: bool) -> None:
    root_fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY)
    try:
        unpacker = Unpacker(root_fd)
        for layer in layers:
            path = layer.blob if compressed else layer.tar
            digest = layer.digest if compressed else layer.diff_id
            size = layer.blob_size if compressed else layer.tar_size
            with path.open("rb") as stream:
                unpacker.apply(stream, digest, size, layer.diff_id)
        unpacker.finish()
    finally:
        os.close(root_fd)


def unpack_tar(layers: list[Layer], target: Path, compressed: bool) -> None:
    for layer in layers:
        path, flag = (layer.blob, "-xzf") if compressed else (layer.tar, "-xf")
        run("tar", "--numeric-owner", "--same-owner", "-p", "-C", target, flag, path)


def listing(root: Path) -> dict[str, tuple[object, ...]]:
    """Every entry under `root`: type, mode, owner, size, link target, device, mtime."""
    entries: dict[str, tuple[object, ...]] = {}
    for top, dirs, files in os.walk(root):
        for name in [".", *dirs, *files] if top == str(root) else [*dirs, *files]:
            path = os.path.normpath(os.path.join(top, name))
            info = os.lstat(path)
            kind = stat.S_IFMT(info.st_mode)
            entries[os.path.relpath(path, root)] = (
                kind,
                stat.S_IMODE(info.st_mode),
                info.st_uid,
                info.st_gid,
                info.st_size if kind == stat.S_IFREG else 0,
                os.readlink(path) if kind == stat.S_IFLNK else "",
                info.st_rdev if kind in (stat.S_IFCHR, stat.S_IFBLK) else 0,
                info.st_mtime_ns // 1_000_000_000,
            )
    return entries


def differences(
    ours: dict[str, tuple[object, ...]], theirs: dict[str, tuple[object, ...]]
) -> list[str]:
    found = [f"only ours: {path}" for path in sorted(ours.keys() - theirs.keys())]
    found += [f"only tar's: {path}" for path in sorted(theirs.keys() - ours.keys())]
    found += [
        f"{path}: ours {ours[path]}, tar {theirs[path]}"
        for path in sorted(ours.keys() & theirs.keys())
        if ours[path] != theirs[path]
    ]
    return found


def gzip_only(layers: list[Layer], target: Path, compressed: bool) -> None:
    for layer in layers:
        with open(os.devnull, "wb") as sink:
            subprocess.run(["gzip", "-dc", str(layer.blob)], stdout=sink, check=True)


def own_cpu_seconds() -> float:
    """CPU time of this process, every thread (the pull and unpack run in worker threads)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def cpu_seconds() -> float:
    """CPU time of this process (every thread) and of its waited-for children (tar, gzip)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


OURS_GZ, TAR_GZ = "ours (the cache's Unpacker), gzip layers", "GNU tar -xzf, gzip layers"
OURS_TAR, TAR_TAR = "ours, plain tar layers", "GNU tar -xf, plain tar layers"
GZIP_ONLY = "gzip -dc > /dev/null (decompression alone)"


def unpack_table(bench: Bench, runs: int) -> Table:
    layers = bench.layers
    data = sum(layer.tar_size for layer in layers)
    methods: dict[str, tuple[Callable[[list[Layer], Path, bool], None], bool]] = {
        OURS_GZ: (unpack_ours, True),
        TAR_GZ: (unpack_tar, True),
        GZIP_ONLY: (gzip_only, True),
        OURS_TAR: (unpack_ours, False),
        TAR_TAR: (unpack_tar, False),
    }
    for layer in layers:  # every method reads the files from the page cache
        for path in (layer.blob, layer.tar):
            with path.open("rb") as file:
                while file.read(4 * MiB):
                    pass
    walls: dict[str, list[float]] = {name: [] for name in methods}
    cpus: dict[str, list[float]] = {name: [] for name in methods}
    task = bench.progress.add_task("unpack throughput", total=runs * len(methods))
    for run_index in range(runs):  # the methods in turn, so noise and writeback hit all alike
        trees: dict[str, Path] = {}
        for name, (method, compressed) in methods.items():
            target = bench.fresh("unpack")
            os.sync()  # the previous run's writeback, out of this one's time
            cpu, t0 = cpu_seconds(), time.perf_counter()
            method(layers, target, compressed)
            walls[name].append(time.perf_counter() - t0)
            cpus[name].append(cpu_seconds() - cpu)
            trees[name] = target
            bench.progress.advance(task)
        if run_index == 0:
            theirs = listing(trees[TAR_GZ])
            for name in (OURS_GZ, OURS_TAR):
                found = differences(listing(trees[name]), theirs)
                bench.problems.check(
                    not found,
                    f"{name} and GNU tar unpacked different trees ({len(found)} entries): "
                    + "; ".join(found[:5]),
                )
        for tree in trees.values():
            shutil.rmtree(tree)
    table = Table(
        title=f"unpack of the image's {len(layers)} layers, {data / MB:,.0f} MB of tar, "
        f"{len(listing_of_layers(bench)):,} entries (load {load()} at the end)"
    )
    for column in (
        "method",
        "n",
        "wall",
        "MB/s",
        "CPU",
        "MB per CPU-s",
        "wall / tar's",
        "CPU / tar's",
    ):
        table.add_column(column, justify="left" if column == "method" else "right")
    for name, (_, compressed) in methods.items():
        wall, cpu = statistics.median(walls[name]), statistics.median(cpus[name])
        reference = TAR_GZ if compressed else TAR_TAR
        table.add_row(
            name,
            str(len(walls[name])),
            seconds(wall),
            f"{data / MB / wall:,.0f}",
            seconds(cpu),
            f"{data / MB / cpu:,.0f}",
            f"{wall / statistics.median(walls[reference]):.2f}x",
            f"{cpu / statistics.median(cpus[reference]):.2f}x",
        )
        if name == GZIP_ONLY:
            table.add_section()
    return table


def listing_of_layers(bench: Bench) -> list[str]:
    """The entries of every layer's tar (what an unpacker creates, one by one)."""
    names: list[str] = []
    for layer in bench.layers:
        names += run("tar", "-tf", layer.tar).stdout.splitlines()
    return names


# -- disk and memory ---------------------------------------------------------------------------


def meminfo_shmem() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("Shmem:"):
            return int(line.split()[1]) * 1024
    return 0


def cgroup_paths(cgroup_file: str) -> tuple[str | None, str | None]:
    """The memory cgroup (v1) and the unified one (v2) a /proc/<pid>/cgroup text names."""
    v1 = v2 = None
    for line in cgroup_file.splitlines():
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if "memory" in controllers.split(","):
            v1 = path
        elif number == "0" and controllers == "":
            v2 = path
    return v1, v2


def memory_cgroup_dir(cgroup_file: str) -> Path | None:
    """The host directory of the memory cgroup a sandbox's /proc/self/cgroup names. Sandboxes
    have a cgroup namespace rooted where they were started (our own cgroup), so the path they
    see is tried below ours first, then from the hierarchy's root."""
    inside_v1, inside_v2 = cgroup_paths(cgroup_file)
    own_v1, own_v2 = cgroup_paths(Path("/proc/self/cgroup").read_text())
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        before, _, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if not tail:
            continue
        mount_point, kind, options = Path(fields[4]), tail[0], tail[-1].split(",")
        if kind == "cgroup" and "memory" in options and inside_v1 is not None:
            inside, own = inside_v1, own_v1
        elif kind == "cgroup2" and inside_v1 is None and inside_v2 is not None:
            inside, own = inside_v2, own_v2
        else:
            continue
        for candidate in (
            mount_point / (own or "/").lstrip("/") / inside.lstrip("/"),
            mount_point / inside.lstrip("/"),
        ):
            if (candidate / "memory.stat").is_file():
                return candidate
    return None


def shmem_of(directory: Path | None) -> int | None:
    if directory is None:
        return None
    try:
        text = (directory / "memory.stat").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "shmem":
            return int(value)
    return None


async def disk_table(bench: Bench, count: int) -> Table:
    cache = await bench.warm_cache()
    backend = bench.backend(cache)
    await backend.enforcement()  # the backend's one-time probe, not counted
    image_dir = cache / "images" / bench.digest.removeprefix("sha256:")
    testbed = image_dir / "rootfs" / "testbed"
    record = json.loads((image_dir / "image.json").read_text())

    def images_in_cache() -> int:
        return sum(1 for _ in (cache / "images").iterdir())

    before, images_before = du(cache), images_in_cache()
    shmem_before = meminfo_shmem()
    task = bench.progress.add_task(f"{count} sandboxes on one image", total=count)
    _, wall, boxes = await create_batch(backend, image_spec(bench.by_tag()), count)
    bench.progress.advance(task, count)
    used: list[int] = []
    charged: list[int | None] = []
    try:
        after, images_after = du(cache), images_in_cache()
        shmem_after = meminfo_shmem()
        state = du(backend.config.state_root or cache)
        for box in boxes:
            await bench.check_workspace(box, f"{count} open")
            df = await box.exec(f"df -B1 --output=used {box.workspace}")
            bench.problems.check(df.ok, f"df in a sandbox failed: {df.stderr}")
            used.append(int(df.stdout.split()[-1]) if df.ok else 0)
            cgroup = await box.exec('echo "$(</proc/self/cgroup)"')
            charged.append(shmem_of(memory_cgroup_dir(cgroup.stdout)))
    finally:
        await asyncio.gather(*(box.close() for box in boxes))
    one_copy = images_before == images_after == 1 and abs(after - before) < MiB
    bench.problems.check(
        one_copy,
        f"the cache grew with {count} sandboxes open: {before} -> {after} bytes, "
        f"{images_before} -> {images_after} images",
    )
    table = Table(title=f"{count} sandboxes on one image (load {load()} at the end)")
    for column in ("what", "value", "one copy", "note"):
        table.add_column(column, justify="right" if column == "value" else "left")
    rows: list[tuple[str, str, str, str]] = [
        (
            "cache on disk (du), none open",
            f"{before / MB:,.1f} MB",
            "yes" if images_before == 1 else "NO",
            f"unpacked root {record['size'] / MB:,.1f} MB + layer blobs "
            f"{du(cache / 'blobs') / MB:,.1f} MB; {images_before} image",
        ),
        (
            f"cache on disk (du), {count} open",
            f"{after / MB:,.1f} MB",
            "yes" if one_copy else "NO",
            f"{images_after} image; {after - before:+,} bytes",
        ),
        (f"{count} creates at once (wall)", seconds(wall), "", "ImageWorkspace, by tag"),
        (f"sandbox state directories, {count} open (du)", f"{state / MB:,.2f} MB", "", "on disk"),
        (
            "the image's /testbed",
            f"{apparent_bytes(testbed) / MB:,.2f} MB",
            "",
            f"apparent size; {du(testbed) / MB:,.2f} MB on disk",
        ),
        (
            "workspace tmpfs used (df inside), per sandbox",
            f"{statistics.median(used) / MB:,.2f} MB",
            "",
            f"median; min {min(used) / MB:,.2f}, max {max(used) / MB:,.2f}",
        ),
        (
            f"workspace tmpfs used, sum of {count}",
            f"{sum(used) / MB:,.1f} MB",
            "",
            "memory, not disk: one copy per sandbox",
        ),
    ]
    if all(value is not None for value in charged):
        known = [value for value in charged if value is not None]
        rows.append(
            (
                f"shmem charged to the {count} sandboxes' memory cgroups",
                f"{sum(known) / MB:,.1f} MB",
                "",
                f"every tmpfs of theirs (workspace, /tmp, home); per sandbox median "
                f"{statistics.median(known) / MB:,.2f} MB",
            )
        )
    else:
        rows.append(("shmem charged to the sandboxes' cgroups", "n/a", "", "no memory cgroup"))
    rows.append(
        (
            "host Shmem growth (/proc/meminfo)",
            f"{(shmem_after - shmem_before) / MB:,.1f} MB",
            "",
            "machine-wide: other work moves it too",
        )
    )
    for row in rows:
        table.add_row(*row)
    return table


# -- main --------------------------------------------------------------------------------------


async def measure(bench: Bench, args: argparse.Namespace) -> list[Table]:
    tables: list[Table] = []
    steps: list[Callable[[], Awaitable[Table]]] = [
        lambda: first_command_table(bench, args.uncached_runs, args.rounds),
        lambda: concurrency_table(bench, args.concurrency, args.rounds, args.batches),
        lambda: disk_table(bench, args.open),
    ]
    for step in steps:
        table = await step()
        bench.console.print(table)
        tables.append(table)
    return tables


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a ~6 MB image of the host's bash and df instead of the Debian root, 50 modules, "
        "8 in flight, fewer runs: a smoke run (~30 s)",
    )
    parser.add_argument(
        "--repo-files",
        type=int,
        default=None,
        help="modules in the image's task repository (default 2000; --quick 50)",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="creates in flight at once in table 2 (default 50; --quick 8)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="sequential creates per variant, cached (default 20; --quick 3)",
    )
    parser.add_argument(
        "--batches",
        type=int,
        default=None,
        help="batches per variant at --concurrency (default 2; --quick 1)",
    )
    parser.add_argument(
        "--uncached-runs",
        type=int,
        default=None,
        help="runs of each uncached measurement, each on a fresh cache (default 3; --quick 1)",
    )
    parser.add_argument(
        "--unpack-runs",
        type=int,
        default=None,
        help="runs of each unpack method (default 3; --quick 1)",
    )
    parser.add_argument(
        "--open", type=int, default=16, help="sandboxes open at once in table 4 (default 16)"
    )
    args = parser.parse_args(argv)
    quick = args.quick
    for name, full, small in (
        ("repo_files", 2000, 50),
        ("concurrency", 50, 8),
        ("rounds", 20, 3),
        ("batches", 2, 1),
        ("uncached_runs", 3, 1),
        ("unpack_runs", 3, 1),
    ):
        if getattr(args, name) is None:
            setattr(args, name, small if quick else full)
    if os.geteuid() != 0:
        raise SystemExit("run as root: the sandboxes' cgroups and the image's owners need it")

    console = Console(width=max(shutil.get_terminal_size((150, 40)).columns, 150))
    console.print(
        f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} cpus, "
        f"load average {load()} at the start (other work skews the timings); "
        f"{'quick image' if quick else 'Debian image'}, {args.repo_files} modules in /testbed",
        style="dim",
    )
    problems = Problems(console)
    with (
        tempfile.TemporaryDirectory(prefix="image-bench-") as temporary,
        Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        ) as progress,
    ):
        work = Path(temporary)
        work.chmod(0o755)
        task = progress.add_task("building the image", total=4)
        base = host_root(work) if quick else debian_root()
        progress.advance(task)
        (work / "layers" / "testbed").mkdir(parents=True)
        task_files = make_task_layer(base / "testbed", work / "layers" / "testbed", args.repo_files)
        progress.advance(task)
        layers = [
            pack_layer(base, work / "layers"),
            pack_layer(work / "layers" / "testbed", work / "layers"),
        ]
        progress.advance(task)
        layout = work / "layout"
        digest = write_layout(layout, layers)
        progress.advance(task)
        repository = f"bench/{'quick' if quick else 'debian'}:v1"
        expected = dict(BASE_TESTBED)
        if args.repo_files:
            expected["src/pkg0/mod0.py"] = module_text(random.Random(17), 0)
        console.print(
            f"image {digest[:19]}: layers "
            + ", ".join(
                f"{layer.tar_size / MB:,.1f} MB tar / {layer.blob_size / MB:,.1f} MB gzip"
                for layer in layers
            )
            + f"; /testbed holds {task_files} files",
            style="dim",
        )
        with running_registry(work / "registry") as host:
            task = progress.add_task(f"skopeo copy to {host} (plain HTTP, no auth)", total=1)
            push(layout, host, repository, work)
            progress.advance(task)
            console.print(
                f"pushed to docker-registry at {host}/{repository}: plain HTTP, no "
                "authentication (one token request per pull where a registry asks for one)",
                style="dim",
            )
            bench = Bench(
                work,
                host,
                repository,
                digest,
                layout,
                layers,
                expected,
                problems,
                progress,
                console,
            )
            asyncio.run(measure(bench, args))
            console.print(unpack_table(bench, args.unpack_runs))
    console.print(f"load average at the end: {load()}", style="dim")
    if problems.found:
        console.print(f"[bold red]{len(problems.found)} wrong answer(s)[/]")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
