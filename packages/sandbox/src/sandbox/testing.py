"""Root file systems for tests of what runs on a task's image (`SandboxSpec.image`), shared by
this package's tests and the cross-package ones (an agent CLI in an image).

A Debian root is what a task's image holds (its own libc, Python and git, a repository at
/testbed, and a plain directory at /app), built with Debian's `mmdebstrap` from Debian's
packages into a cache the caller names, once: by root only (in a temporary directory, renamed
into place under a lock); other users use a cache root built. A static root is the least an
image can be: one statically linked program (gcc's), no libc, Python or shell. A host that
cannot build one raises `RootUnavailable`, naming why, for the test to skip.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

SUITE = "bookworm"
PACKAGES = ("python3-minimal", "git")
TESTBED_FILES = {"calc.py": "def add(a, b):\n    return a - b\n", "README": "a task\n"}
#: /app: a plain directory, no repository, as a Dockerfile's COPY leaves one (`*.log` ignored
#: by its own .gitignore; run.sh executable; `link` a symbolic link to data.txt).
APP_FILES = {
    "calc.py": "def add(a, b):\n    return a - b\n",
    "data.txt": "kept\n",
    "run.sh": "#!/bin/sh\necho run\n",
    ".gitignore": "*.log\n",
    "old.log": "ignored by the image's own rules\n",
}
_GIT_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
}


class RootUnavailable(Exception):
    """This host cannot build the root; the message says why."""


def _complete(root: Path) -> bool:
    return (root / "testbed" / ".git").is_dir() and (root / "app" / "run.sh").is_file()


def debian_root(cache: Path) -> Path:
    """The Debian root (see the module docstring) in `cache`, built if missing."""
    root = cache / f"debian-{SUITE}-{'-'.join(PACKAGES)}"
    if _complete(root):
        return root
    if os.geteuid() != 0:
        raise RootUnavailable(f"no Debian test root at {root}: root builds it")
    if shutil.which("mmdebstrap") is None:
        raise RootUnavailable("mmdebstrap is not installed (apt-get install mmdebstrap)")
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _complete(root):
            _build(root)
    return root


def _build(root: Path) -> None:
    building = Path(tempfile.mkdtemp(prefix="building-", dir=root.parent))
    try:
        include = f"--include={','.join(PACKAGES)}"
        argv = ["mmdebstrap", "--quiet", "--variant=essential", include, SUITE, str(building)]
        subprocess.run(argv, check=True, capture_output=True)
        testbed = building / "testbed"
        testbed.mkdir()
        for name, text in TESTBED_FILES.items():
            (testbed / name).write_text(text)
        for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "base"]):
            subprocess.run(
                ["git", *args], cwd=testbed, env=_GIT_ENV, check=True, capture_output=True
            )
        app = building / "app"
        app.mkdir()
        for name, text in APP_FILES.items():
            (app / name).write_text(text)
        (app / "run.sh").chmod(0o755)
        (app / "link").symlink_to("data.txt")
        building.chmod(0o755)
        shutil.rmtree(root, ignore_errors=True)
        building.rename(root)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise


def static_root(where: Path) -> Path:
    """A root in `where` with nothing but one statically linked program (/bin/hello, printing
    "static hello"), /etc (with a marker file) and an empty /testbed."""
    compiler = shutil.which("gcc")
    if compiler is None:
        raise RootUnavailable("gcc is not installed")
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
        raise RootUnavailable(f"cannot link statically here: {built.stderr.strip()[-300:]}")
    (root / "etc" / "marker").write_text("the image's own /etc\n")
    return root
