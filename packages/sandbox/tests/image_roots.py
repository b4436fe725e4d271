"""Root file systems for the image tests: a real Debian root built once, and tiny ones built
per test.

The Debian root is what a task's image holds (its own libc, Python and git, and a repository at
/testbed), built with Debian's `mmdebstrap` from Debian's packages into a cache shared by test
runs: `SANDBOX_TEST_IMAGE_CACHE`, or `.cache/test-images` at the top of the repository. It is
built by root only (in a temporary directory, renamed into place under a lock); other users use
a cache root built, or skip.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from .conftest import git

SUITE = "bookworm"
PACKAGES = ("python3-minimal", "git")
TESTBED_FILES = {"calc.py": "def add(a, b):\n    return a - b\n", "README": "a task\n"}


def image_cache() -> Path:
    named = os.environ.get("SANDBOX_TEST_IMAGE_CACHE")
    if named:
        return Path(named)
    return Path(__file__).resolve().parents[3] / ".cache" / "test-images"


def debian_root() -> Path:
    """The Debian root (see the module docstring), built if missing."""
    cache = image_cache()
    root = cache / f"debian-{SUITE}-{'-'.join(PACKAGES)}"
    if (root / "testbed" / ".git").is_dir():
        return root
    if os.geteuid() != 0:
        pytest.skip(f"no Debian test root at {root}: root builds it (SANDBOX_TEST_IMAGE_CACHE)")
    if shutil.which("mmdebstrap") is None:
        pytest.skip("mmdebstrap is not installed (apt-get install mmdebstrap)")
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / "testbed" / ".git").is_dir():
            _build(root)
    return root


def _build(root: Path) -> None:
    building = Path(tempfile.mkdtemp(prefix="building-", dir=root.parent))
    try:
        subprocess.run(
            [
                "mmdebstrap",
                "--quiet",
                "--variant=essential",
                f"--include={','.join(PACKAGES)}",
                SUITE,
                str(building),
            ],
            check=True,
            capture_output=True,
        )
        testbed = building / "testbed"
        testbed.mkdir()
        for name, text in TESTBED_FILES.items():
            (testbed / name).write_text(text)
        git(testbed, "init", "-q", "-b", "main")
        git(testbed, "add", "-A")
        git(testbed, "commit", "-q", "-m", "base")
        building.chmod(0o755)
        shutil.rmtree(root, ignore_errors=True)
        building.rename(root)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise


def static_root(where: Path) -> Path:
    """A root with nothing but one statically linked program (no libc, no Python, no shell),
    /etc and an empty /testbed: the least an image can be."""
    compiler = shutil.which("gcc")
    if compiler is None:
        pytest.skip("gcc is not installed")
    root = where / "static-root"
    for directory in ("bin", "etc", "testbed"):
        (root / directory).mkdir(parents=True)
    source = where / "hello.c"
    source.write_text('#include <stdio.h>\nint main(void){puts("static hello");return 0;}\n')
    built = subprocess.run(
        [compiler, "-static", "-O1", "-o", str(root / "bin" / "hello"), str(source)],
        capture_output=True,
        text=True,
        check=False,
    )
    if built.returncode != 0:
        pytest.skip(f"cannot link statically here: {built.stderr.strip()[-300:]}")
    (root / "etc" / "marker").write_text("the image's own /etc\n")
    return root


REPORTER_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
int main(void) {
    char cwd[4096];
    const char *mark = getenv("TASK_MARK"), *home = getenv("HOME");
    printf("uid=%d gid=%d cwd=%s mark=%s home=%s\n", (int)getuid(), (int)getgid(),
           getcwd(cwd, sizeof cwd) ? cwd : "?", mark ? mark : "-", home ? home : "-");
    return 0;
}
"""


def reporter(where: Path) -> bytes:
    """A static program that reports who and where it runs (installed as an image's
    /bin/bash, it answers every command with that)."""
    compiler = shutil.which("gcc")
    if compiler is None:
        pytest.skip("gcc is not installed")
    source = where / "reporter.c"
    source.write_text(REPORTER_C)
    binary = where / "reporter"
    built = subprocess.run(
        [compiler, "-static", "-O1", "-o", str(binary), str(source)],
        capture_output=True,
        text=True,
        check=False,
    )
    if built.returncode != 0:
        pytest.skip(f"cannot link statically here: {built.stderr.strip()[-300:]}")
    return binary.read_bytes()
