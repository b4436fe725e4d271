"""Root file systems for the image tests: a real Debian root built once, and tiny ones built
per test (sandbox.testing builds them; a host that cannot skips, naming why).

The Debian root's cache is `SANDBOX_TEST_IMAGE_CACHE`, or `.cache/test-images` at the top of
the repository.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from sandbox import testing

TESTBED_FILES = testing.TESTBED_FILES


def image_cache() -> Path:
    named = os.environ.get("SANDBOX_TEST_IMAGE_CACHE")
    if named:
        return Path(named)
    return Path(__file__).resolve().parents[3] / ".cache" / "test-images"


def debian_root() -> Path:
    """The Debian root (sandbox.testing.debian_root), built if missing."""
    try:
        return testing.debian_root(image_cache())
    except testing.RootUnavailable as why:
        pytest.skip(str(why))


def static_root(where: Path) -> Path:
    """A root with nothing but one statically linked program (sandbox.testing.static_root)."""
    try:
        return testing.static_root(where)
    except testing.RootUnavailable as why:
        pytest.skip(str(why))


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
