"""Our interpreter inside a root file system that is not the host's (a task's image).

Init and the file helpers are Python scripts run by the host's own interpreter. On the host's
root it finds its loader and libraries where it was built to; in an image it would find the
image's (another glibc, musl, or none at all). So in an image the interpreter is started
through the host's dynamic loader, named explicitly, with the host libraries it needs mounted
beside it (``ld.so --library-path <dir> python``): nothing of the image is loaded, and nothing
leaks to the commands it starts, which run on the image's own loader and libraries (no
``LD_LIBRARY_PATH`` in anyone's environment).

The libraries are the closure the loader itself reports (``ld.so --list``) for the interpreter
and every extension module of its standard library, found once per backend.
"""

from __future__ import annotations

import os
import re
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from sandbox._errors import SandboxUnavailableError

#: Where the host's loader and libraries appear inside.
RUNTIME_MOUNT = PurePosixPath("/run/sandbox/runtime")
_PT_INTERP = 3
_LISTED = re.compile(r"^\s*(\S+)\s+=>\s+(/\S+)\s+\(0x[0-9a-f]+\)$")


@dataclass(frozen=True, slots=True)
class HostRuntime:
    """The host interpreter's loader and shared libraries, and its standard library."""

    loader: Path
    libraries: tuple[tuple[str, Path], ...]
    """(name the loader looks for, host file) of every shared library of the closure."""
    stdlib: Path
    """The standard library directory (``<prefix>/lib/python3.X``)."""

    def mounts(self, python: Path, python_mount: PurePosixPath) -> list[tuple[Path, PurePosixPath]]:
        """Host files to bind read-only, and where each appears inside: the loader and libraries
        in RUNTIME_MOUNT, the interpreter and its standard library under `python_mount` (laid
        out as an installation, so the interpreter finds its prefix from its own path)."""
        binds = [(self.loader, RUNTIME_MOUNT / self.loader.name)]
        binds += [(path, RUNTIME_MOUNT / name) for name, path in self.libraries]
        binds.append((python, self.python_inside(python, python_mount)))
        binds.append((self.stdlib, python_mount / "lib" / self.stdlib.name))
        return binds

    def python_inside(self, python: Path, python_mount: PurePosixPath) -> PurePosixPath:
        return python_mount / "bin" / python.name

    def argv(self, python: Path, python_mount: PurePosixPath) -> tuple[str, ...]:
        """The command prefix that runs the interpreter inside, through the host's loader."""
        loader = str(RUNTIME_MOUNT / self.loader.name)
        inside = str(self.python_inside(python, python_mount))
        return (loader, "--library-path", str(RUNTIME_MOUNT), inside)

    @classmethod
    def discover(cls, python: Path, prefix: Path) -> HostRuntime:
        """The runtime of `python` (installed under `prefix`), as its loader resolves it."""
        loader = _interpreter_of(python)
        stdlib = prefix / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
        if not (stdlib / "os.py").is_file():
            raise SandboxUnavailableError(f"no standard library at {stdlib}")
        objects = [python, *sorted((stdlib / "lib-dynload").glob("*.so"))]
        libraries: dict[str, Path] = {}
        for path in objects:
            for name, found in _listed(loader, path):
                libraries.setdefault(name, Path(os.path.realpath(found)))
        libraries.pop(loader.name, None)
        return cls(Path(os.path.realpath(loader)), tuple(sorted(libraries.items())), stdlib)


def _interpreter_of(binary: Path) -> Path:
    """The dynamic loader an ELF executable names (its PT_INTERP)."""
    with open(binary, "rb") as file:
        header = file.read(64)
        if header[:4] != b"\x7fELF" or header[4] != 2:
            raise SandboxUnavailableError(f"{binary} is not a 64-bit ELF executable")
        order = "<" if header[5] == 1 else ">"
        (phoff,) = struct.unpack_from(order + "Q", header, 32)
        phentsize, phnum = struct.unpack_from(order + "HH", header, 54)
        for index in range(phnum):
            file.seek(phoff + index * phentsize)
            kind, _, offset, _, _, size = struct.unpack(order + "IIQQQQ", file.read(40))
            if kind == _PT_INTERP:
                file.seek(offset)
                return Path(file.read(size).rstrip(b"\0").decode())
    raise SandboxUnavailableError(f"{binary} is statically linked: it names no loader")


def _listed(loader: Path, path: Path) -> list[tuple[str, str]]:
    """What the loader would load for `path`, as (name, host path) pairs."""
    try:
        listing = subprocess.run(
            [str(loader), "--list", str(path)],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
            env={"LC_ALL": "C"},
        ).stdout
    except (OSError, subprocess.SubprocessError) as error:
        raise SandboxUnavailableError(f"{loader} --list {path} failed: {error}") from error
    found = []
    for line in listing.splitlines():
        match = _LISTED.match(line)
        if match is not None:
            found.append((match[1], match[2]))
        elif "not found" in line:
            raise SandboxUnavailableError(f"{path} needs a library the host lacks: {line.strip()}")
    return found
