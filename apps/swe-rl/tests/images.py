"""The fixture tasks' images, built by the tests: a real Debian root file system with its own
Python, pytest and git, and each fixture task's files placed in it.

The Debian root (`mmdebstrap --variant=essential`, bookworm, about a minute) is built once and
kept in the repository's git-ignored `.cache/swe-rl-images/`, under a key of its recipe: built
into a temporary directory and renamed into place (atomic), with a lock so concurrent test
sessions build it once. Each fixture image is a hard-linked copy of that root plus the task's
files, built the same way:

- the SWE-bench-shaped task (`fixtures/swebench/`): the repository at /testbed, committed
  with fixed dates so its base commit is the one the fixture row names;
- the Harbor-shaped task (`fixtures/harbor/`): its working directory /app, plain files as most
  Harbor images have it, and the same with /app a git repository.

They are used as root file systems (`{"rootfs": dir}` environments) under the names the
converters give a local image (`swebench_sweb.eval.x86_64.<key>_latest`, ...).

The Debian root is also packed as an OCI image layout (`debian_layout()`, one layer, with
umoci), the base image a test registry serves for the Dockerfile-built Harbor task.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
CACHE = ROOT / ".cache" / "swe-rl-images"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
SUITE = "bookworm"
PACKAGES = ("python3-minimal", "python3-pytest", "git")
RECIPE = 1  # bump when the recipe below changes
IMAGES_RECIPE = 2  # bump when a fixture image's recipe changes
SWEBENCH_IMAGE = "swebench_sweb.eval.x86_64.fixture_1776_calc-1_latest"
HARBOR_IMAGE = "agent-rl-fixtures_harbor-calc_latest"
_GIT_ENV = {
    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_AUTHOR_NAME": "fixture",
    "GIT_AUTHOR_EMAIL": "fixture@example.invalid",
    "GIT_COMMITTER_NAME": "fixture",
    "GIT_COMMITTER_EMAIL": "fixture@example.invalid",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+00:00",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+00:00",
}


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _built(name: str, build: Any) -> Path:
    """`CACHE/name`, made by `build(directory)` once: into a temporary directory renamed into
    place, under a lock; `name.ready` beside it says it is complete."""
    final = CACHE / name
    ready = CACHE / f"{name}.ready"
    if ready.exists():
        return final
    with _locked(CACHE / f"{name}.lock"):
        if ready.exists():
            return final
        staging = CACHE / f"{name}.tmp-{os.getpid()}"
        for stale in (staging, final):
            if stale.exists():
                subprocess.run(["rm", "-rf", "--one-file-system", str(stale)], check=True)
        staging.parent.mkdir(parents=True, exist_ok=True)
        build(staging)
        staging.rename(final)
        ready.write_text("")
    return final


def debian_root() -> Path:
    """Debian's essential set with python3, pytest and git, and `python` naming python3."""
    key = hashlib.sha256(json.dumps([SUITE, PACKAGES, RECIPE]).encode()).hexdigest()[:12]

    def build(root: Path) -> None:
        subprocess.run(
            [
                "mmdebstrap",
                "--quiet",
                "--variant=essential",
                f"--include={','.join(PACKAGES)}",
                SUITE,
                str(root),
            ],
            check=True,
            capture_output=True,
        )
        (root / "usr/local/bin/python").symlink_to("/usr/bin/python3")

    return _built(f"debian-{SUITE}-{key}", build)


LAYOUT_RECIPE = 1  # bump when debian_layout's recipe changes
LAYOUT_REF = "base"


def debian_layout() -> Path:
    """The Debian root as an OCI image layout holding one image, `LAYOUT_REF`: one gzip
    layer of the whole root (`umoci insert`), the PATH in its configuration."""
    root = debian_root()
    key = hashlib.sha256(f"{root.name}:{LAYOUT_RECIPE}".encode()).hexdigest()[:12]

    def build(layout: Path) -> None:
        image = f"{layout}:{LAYOUT_REF}"
        path = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        for command in (
            ["init", "--layout", str(layout)],
            ["new", "--image", image],
            ["insert", "--image", image, str(root), "/"],
            ["config", "--image", image, f"--config.env={path}", "--config.cmd=/bin/bash"],
            ["gc", "--layout", str(layout)],
        ):
            subprocess.run(["umoci", *command], check=True, capture_output=True)

    return _built(f"debian-layout-{key}", build)


def images_dir() -> Path:
    """Where the fixture images are, one root file system per converted image name."""
    key = f"{debian_root()}:{IMAGES_RECIPE}".encode() + _fixture_digest()
    recipe = hashlib.sha256(key).hexdigest()[:12]
    return CACHE / f"images-{recipe}"


def _image(name: str, add: Any) -> Path:
    base = debian_root()

    def build(root: Path) -> None:
        subprocess.run(["cp", "-al", str(base), str(root)], check=True)
        add(root)

    return _built(f"{images_dir().name}/{name}", build)


def _fixture_digest() -> bytes:
    digest = hashlib.sha256()
    for path in sorted(FIXTURES.rglob("*")):
        if path.is_file():
            digest.update(str(path.relative_to(FIXTURES)).encode() + path.read_bytes())
    return digest.digest()


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", *args], cwd=repo, env=_GIT_ENV, capture_output=True, check=True, text=True
    )
    return done.stdout.strip()


def swebench_row() -> dict[str, Any]:
    """The SWE-bench-shaped fixture row (SWE-bench's public fields)."""
    row: dict[str, Any] = json.loads((FIXTURES / "swebench" / "row.json").read_text())
    row["test_patch"] = (FIXTURES / "swebench" / "test.patch").read_text()
    row["patch"] = (FIXTURES / "swebench" / "gold.patch").read_text()
    return row


def swebench_image() -> Path:
    """The SWE-bench-shaped task's image: the calc repository at /testbed, at the row's base
    commit, in the Debian root."""

    def add(root: Path) -> None:
        testbed = root / "testbed"
        shutil.copytree(FIXTURES / "swebench" / "calc", testbed)
        _git(testbed, "init", "--quiet", "--initial-branch", "main")
        _git(testbed, "add", "--all")
        _git(testbed, "commit", "--quiet", "--message", "base")
        head = _git(testbed, "rev-parse", "HEAD")
        expected = swebench_row()["base_commit"]
        if head != expected:
            raise RuntimeError(f"the fixture's base commit is {head}, its row says {expected}")

    return _image(SWEBENCH_IMAGE, add)


def harbor_image() -> Path:
    """The Harbor-shaped task's image: its working directory /app, committed, in the Debian
    root."""

    def add(root: Path) -> None:
        app = root / "app"
        shutil.copytree(FIXTURES / "harbor" / "calc-image", app)
        _git(app, "init", "--quiet", "--initial-branch", "main")
        _git(app, "add", "--all")
        _git(app, "commit", "--quiet", "--message", "base")

    return _image(HARBOR_IMAGE, add)


def harbor_image_without_repository() -> Path:
    """The Harbor task's image as most Harbor images are: /app holds files, no repository."""

    def add(root: Path) -> None:
        shutil.copytree(FIXTURES / "harbor" / "calc-image", root / "app")

    return _image(f"{HARBOR_IMAGE}-no-git", add)
