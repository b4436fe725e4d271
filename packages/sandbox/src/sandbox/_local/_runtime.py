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

Other host programs a spec names (`ReadOnlyBind.host_programs`: an agent CLI built for the
host's glibc) are started the same way on an image, their closures added to the same
directory: :func:`program_commands`. A statically linked one, or one that is no ELF program
(a script, whose interpreter is then the sandbox's), runs as it is.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

from sandbox._errors import SandboxUnavailableError, UnsupportedSpecError

#: Where the host's loader and libraries appear inside.
RUNTIME_MOUNT = PurePosixPath("/run/sandbox/runtime")
_PT_INTERP = 3
_MATERIALIZE_LOCK = threading.Lock()
_LISTED = re.compile(r"^\s*(\S+)\s+=>\s+(/\S+)\s+\(0x[0-9a-f]+\)$")


@dataclass(frozen=True, slots=True)
class HostRuntime:
    """The host interpreter's loader and shared libraries, and its standard library."""

    loader: Path
    libraries: tuple[tuple[str, Path], ...]
    """(name the loader looks for, host file) of every shared library of the closure."""
    stdlib: Path
    """The standard library directory (``<prefix>/lib/python3.X``)."""

    def mounts(
        self, python: Path, python_mount: PurePosixPath, directory: Path
    ) -> list[tuple[Path, PurePosixPath]]:
        """Host files to bind read-only, and where each appears inside: the loader and libraries
        (`directory`, as `materialize` made it) at RUNTIME_MOUNT, the interpreter and its
        standard library under `python_mount` (laid out as an installation, so the interpreter
        finds its prefix from its own path)."""
        binds = [(directory, RUNTIME_MOUNT)]
        binds.append((python, self.python_inside(python, python_mount)))
        binds.append((self.stdlib, python_mount / "lib" / self.stdlib.name))
        return binds

    def materialize(self, root: Path) -> Path:
        """The loader and libraries gathered in one directory under `root` (hard links, or
        copies where the host refuses a link), so a sandbox binds one directory, not one file
        per library: each bind is a mount in every sandbox's creation. Made once per closure
        (named by each file's path, inode, size and time) and reused, by later processes too;
        blocking."""
        files = [(self.loader.name, self.loader), *self.libraries]
        key = hashlib.sha256()
        for name, path in files:
            info = os.stat(path)
            key.update(
                f"{name}\0{path}\0{info.st_ino}\0{info.st_size}\0{info.st_mtime_ns}\n".encode()
            )
        final = root / f"runtime-{key.hexdigest()[:24]}"
        with _MATERIALIZE_LOCK:
            if final.is_dir():
                return final
            staging = Path(tempfile.mkdtemp(prefix="runtime-staging-", dir=root))
            try:
                for name, path in files:
                    try:
                        os.link(path, staging / name)
                    except OSError:
                        shutil.copy2(path, staging / name)
                staging.chmod(0o755)
                staging.rename(final)
            except OSError:
                shutil.rmtree(staging, ignore_errors=True)
                if not final.is_dir():  # another process won the race: theirs is the same
                    raise
        return final

    def python_inside(self, python: Path, python_mount: PurePosixPath) -> PurePosixPath:
        return python_mount / "bin" / python.name

    def prefix(self) -> tuple[str, ...]:
        """What starts a host program inside through the host's loader, the program's path and
        arguments following: the loader, told where the libraries are."""
        return (str(RUNTIME_MOUNT / self.loader.name), "--library-path", str(RUNTIME_MOUNT))

    def argv(self, python: Path, python_mount: PurePosixPath) -> tuple[str, ...]:
        """The command prefix that runs the interpreter inside, through the host's loader."""
        return (*self.prefix(), str(self.python_inside(python, python_mount)))

    def including(self, programs: Sequence[Path]) -> HostRuntime:
        """This runtime with the libraries of `programs` (dynamically linked host executables)
        too. One directory serves every program, so a name must mean one file for all of them;
        and they must need the host's loader, the only one mounted."""
        libraries = dict(self.libraries)
        for program in programs:
            loader = elf_interpreter(program)
            if loader is None or Path(os.path.realpath(loader)) != self.loader:
                raise UnsupportedSpecError(
                    f"host program {program} needs the loader {loader}, not the host's "
                    f"{self.loader}"
                )
            for name, path in _closure(self.loader, program, _stamp(program)):
                known = libraries.setdefault(name, path)
                if known != path:
                    raise UnsupportedSpecError(
                        f"host program {program} needs {name} from {path}, but {known} is the "
                        "one the sandbox's other host programs load under that name"
                    )
        libraries.pop(self.loader.name, None)
        return replace(self, libraries=tuple(sorted(libraries.items())))

    @classmethod
    def discover(cls, python: Path, prefix: Path) -> HostRuntime:
        """The runtime of `python` (installed under `prefix`), as its loader resolves it."""
        loader = elf_interpreter(python)
        if loader is None:
            raise SandboxUnavailableError(f"{python} names no loader: it is statically linked")
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


def program_commands(
    programs: Sequence[tuple[Path, PurePosixPath]], runtime: HostRuntime | None
) -> tuple[HostRuntime | None, dict[str, tuple[str, ...]]]:
    """How each host program (its host file, its path inside) is started, and the runtime
    that carries their libraries: on the host's own root (`runtime` None) every program runs
    natively; on an image a dynamically linked one runs through the host's loader, anything
    else as it is. Blocking: lists each new program's closure once (``ld.so --list``)."""
    commands: dict[str, tuple[str, ...]] = {}
    dynamic: list[Path] = []
    for host, inside in programs:
        try:
            info = os.stat(host)
        except OSError as error:
            raise UnsupportedSpecError(f"host program {host}: {error.strerror}") from error
        if not stat.S_ISREG(info.st_mode) or not info.st_mode & 0o111:
            raise UnsupportedSpecError(f"host program {host} is not an executable file")
        if runtime is not None and elf_interpreter(host) is not None:
            dynamic.append(host)
            commands[str(inside)] = (*runtime.prefix(), str(inside))
        else:
            commands[str(inside)] = (str(inside),)
    if dynamic and runtime is not None:
        runtime = runtime.including(dynamic)
    return runtime, commands


def elf_interpreter(binary: Path) -> Path | None:
    """The dynamic loader a 64-bit ELF executable names (its PT_INTERP); None for a static
    one or a file that is no such program."""
    with open(binary, "rb") as file:
        header = file.read(64)
        if len(header) < 64 or header[:4] != b"\x7fELF" or header[4] != 2:
            return None
        order = "<" if header[5] == 1 else ">"
        (phoff,) = struct.unpack_from(order + "Q", header, 32)
        phentsize, phnum = struct.unpack_from(order + "HH", header, 54)
        for index in range(phnum):
            file.seek(phoff + index * phentsize)
            kind, _, offset, _, _, size = struct.unpack(order + "IIQQQQ", file.read(40))
            if kind == _PT_INTERP:
                file.seek(offset)
                return Path(file.read(size).rstrip(b"\0").decode())
    return None


def _stamp(path: Path) -> tuple[int, int, int]:
    info = os.stat(path)
    return info.st_ino, info.st_size, info.st_mtime_ns


@functools.lru_cache(maxsize=32)
def _closure(
    loader: Path, program: Path, stamp: tuple[int, int, int]
) -> tuple[tuple[str, Path], ...]:
    """`program`'s libraries (name, host file), listed once per version of the file (`stamp`):
    a sandbox of the same CLI pays nothing for it again."""
    del stamp  # part of the cache key only
    return tuple(
        (name, Path(os.path.realpath(found)))
        for name, found in _listed(loader, program)
        if "/" not in name  # the loader itself, listed by the path the program names
    )


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
