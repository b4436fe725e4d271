"""Local sandbox lifecycle cost, and the cost of each way to check out a task repository.

    uv run tools/bench/sandbox_bench.py [--rounds 40] [--files 3000]

Sandbox table: create + first `exec("true")` + close of a local sandbox with every isolation
layer on (bubblewrap, our init as pid 1, seccomp, unprivileged uid, per-sandbox cgroups), and
side by side the same with rlimits instead of cgroups; median and p99 of each phase, with 1 and
with 50 sandboxes in flight at once. Target: create <= 50 ms median at concurrency 1.

Checkout table: a synthetic repository (`--files` files, 20 commits) checked out at its first
commit by each candidate method, median of 5 runs; workspace.py explains the pick.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

from sandbox import LocalBackend, LocalConfig, SandboxSpec, checkout_repo

GIT_ENV = {
    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_AUTHOR_NAME": "bench",
    "GIT_AUTHOR_EMAIL": "bench@example.invalid",
    "GIT_COMMITTER_NAME": "bench",
    "GIT_COMMITTER_EMAIL": "bench@example.invalid",
}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def one_lifecycle(backend: LocalBackend) -> tuple[float, float, float]:
    t0 = time.perf_counter()
    box = await backend.create(SandboxSpec())
    t1 = time.perf_counter()
    result = await box.exec("true")
    t2 = time.perf_counter()
    await box.close()
    t3 = time.perf_counter()
    if not result.ok:
        raise RuntimeError(f"exec failed: {result}")
    return t1 - t0, t2 - t1, t3 - t2


async def lifecycle_samples(
    backend: LocalBackend, concurrency: int, rounds: int
) -> list[tuple[float, float, float]]:
    samples: list[tuple[float, float, float]] = []
    while len(samples) < rounds:
        batch = await asyncio.gather(*(one_lifecycle(backend) for _ in range(concurrency)))
        samples.extend(batch)
    return samples


async def sandbox_table(rounds: int, root: Path) -> Table:
    variants = {
        "all layers, cgroups": LocalBackend(LocalConfig(state_root=root)),
        "all layers, rlimits": LocalBackend(LocalConfig(state_root=root, use_cgroups=False)),
    }
    enforcement = await variants["all layers, cgroups"].enforcement()
    table = Table(title=f"local sandbox lifecycle (cgroups: {enforcement.cgroup_controllers})")
    for column in ("variant", "concurrency", "n", "phase", "median ms", "p99 ms"):
        table.add_column(column, justify="right")
    for backend in variants.values():
        await lifecycle_samples(backend, 1, 5)  # warm caches
    for concurrency in (1, 50):
        # Interleave the variants so machine noise hits both alike.
        samples: dict[str, list[tuple[float, float, float]]] = {name: [] for name in variants}
        wanted = max(rounds, concurrency * 2)
        while any(len(found) < wanted for found in samples.values()):
            for name, backend in variants.items():
                samples[name] += await lifecycle_samples(backend, concurrency, concurrency)
        for name, found in samples.items():
            for index, phase in enumerate(("create", "first exec", "close", "total")):
                values = [sum(s) if phase == "total" else s[index] for s in found]
                table.add_row(
                    name,
                    str(concurrency),
                    str(len(values)),
                    phase,
                    f"{statistics.median(values) * 1000:.1f}",
                    f"{percentile(values, 0.99) * 1000:.1f}",
                )
    return table


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, env=GIT_ENV, check=True, capture_output=True)


def make_repo(root: Path, files: int) -> tuple[Path, str]:
    repo = root / "source"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    for index in range(files):
        path = repo / f"pkg{index % 50}" / f"mod{index}.py"
        path.parent.mkdir(exist_ok=True)
        path.write_text(f"VALUE = {index}\n" + "# filler line\n" * 40)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    base = subprocess.run(
        ["git", "rev-parse", "HEAD"],
        cwd=repo,
        env=GIT_ENV,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    for commit in range(19):
        (repo / "pkg0" / "mod0.py").write_text(f"VALUE = {commit}\n")
        git(repo, "commit", "-q", "-am", f"change {commit}")
    return repo, base


def checkout_methods(repo: Path, base: str) -> dict[str, Callable[[Path], None]]:
    def shared_clone(dest: Path) -> None:
        checkout_repo(repo, base, dest)

    def local_clone(dest: Path) -> None:
        git(repo, "clone", "-q", "--local", "--no-checkout", str(repo), str(dest))
        git(dest, "checkout", "-q", "--detach", base)

    def worktree(dest: Path) -> None:
        git(repo, "worktree", "add", "-q", "--detach", str(dest), base)

    def copy_tree(dest: Path) -> None:
        shutil.copytree(repo, dest, symlinks=True)
        git(dest, "checkout", "-q", "--detach", base)

    return {
        "clone --shared (picked)": shared_clone,
        "clone --local (hardlinks)": local_clone,
        "worktree add": worktree,
        "copy + checkout": copy_tree,
    }


def checkout_table(root: Path, files: int) -> Table:
    repo, base = make_repo(root, files)
    table = Table(title=f"checkout of a {files}-file repository at its base commit")
    table.add_column("method")
    table.add_column("median ms", justify="right")
    methods = checkout_methods(repo, base)
    times: dict[str, list[float]] = {name: [] for name in methods}
    # Round-robin over the methods so page-cache warmth and machine noise hit all alike.
    for run in range(5):
        for index, (name, method) in enumerate(methods.items()):
            dest = root / f"method{index}-{run}"
            start = time.perf_counter()
            method(dest)
            times[name].append(time.perf_counter() - start)
    for name, samples in times.items():
        table.add_row(name, f"{statistics.median(samples) * 1000:.1f}")
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--files", type=int, default=3000)
    args = parser.parse_args()
    console = Console()
    with tempfile.TemporaryDirectory(prefix="sandbox-bench-") as tmp:
        root = Path(tmp)
        (root / "state").mkdir()
        console.print(asyncio.run(sandbox_table(args.rounds, root / "state")))
        console.print(checkout_table(root, args.files))


if __name__ == "__main__":
    main()
