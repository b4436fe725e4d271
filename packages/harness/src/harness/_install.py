"""Install a pinned agent CLI once per host, into a shared cache directory.

Each pinned CLI gets its own directory `<cache>/<name>@<version>`. The installer fills a
private staging directory; the CLI is verified by running it (`--version`); the marker file
is written; and only then is the staging directory renamed into place. So the final
directory exists only as a verified install, a crash leaves at most a staging directory
(removed by the next installer), and readers never see a half-written tree. A file lock per
CLI version serializes installers across processes; the fast path (already installed)
takes no lock.

`install_once` is that discipline for any installer (npm, pip, a tarball); `install_cli` is
the npm installer the built-in harnesses use.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import tempfile
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness._config import InstallConfig, NpmCli
from harness._errors import InstallError
from harness._lock import file_lock

MARKER_NAME = ".agent-rl-install.json"
_OUTPUT_TAIL = 4000

Populate = Callable[[Path], Awaitable[None]]
"""Fills an empty staging directory with the CLI (raise InstallError on failure)."""


@dataclass(frozen=True, slots=True)
class InstalledCli:
    """A verified install of one pinned CLI on this host.

    spec: what was installed (`@openai/codex@0.169.0`); a harness runs only its own pin.
    prefix: the install directory (read-only from here on; share it, never modify it).
    bin_relative: the command's path relative to `prefix`, the same inside any mount of it.
    version_output: what the CLI printed when the install was verified.
    program_relative: what runs, relative to `prefix`: the native executable the command
    launches (`NpmCli.program`), or None when the command is the program itself.
    """

    spec: str
    prefix: Path
    bin_relative: str
    version_output: str
    program_relative: str | None = None

    @property
    def bin_path(self) -> Path:
        return self.prefix / self.bin_relative

    @property
    def program(self) -> str:
        """What runs, relative to `prefix` (the command itself unless a program is named)."""
        return self.program_relative or self.bin_relative

    @property
    def program_path(self) -> Path:
        return self.prefix / self.program


async def install_cli(cli: NpmCli, config: InstallConfig) -> InstalledCli:
    """Return the verified npm install of `cli`, installing it first if this host lacks it."""

    async def populate(staging: Path) -> None:
        npm = shutil.which(config.npm)
        if npm is None:
            raise InstallError(f"npm not found (looked for {config.npm!r})")
        argv = [npm, "install", "--prefix", str(staging), cli.spec, "--no-audit", "--no-fund"]
        await run_checked(argv, config, config.install_timeout, f"npm install {cli.spec}")

    return await install_once(
        config,
        dir_name=cli.install_dir_name,
        spec=cli.spec,
        bin_relative=f"node_modules/.bin/{cli.bin}",
        expected_version=cli.version,
        populate=populate,
        program_relative=cli.program,
    )


async def install_once(
    config: InstallConfig,
    *,
    dir_name: str,
    spec: str,
    bin_relative: str,
    expected_version: str,
    populate: Populate,
    verify_args: Sequence[str] = ("--version",),
    program_relative: str | None = None,
) -> InstalledCli:
    """Install into `<cache>/<dir_name>` at most once per host, verified and atomically.

    Verification runs what will run (`program_relative`, else the command) with `verify_args`
    and requires `expected_version` in its stdout.
    """
    if "/" in dir_name or dir_name.startswith("."):
        raise ValueError(f"not a cache directory name: {dir_name!r}")
    cache = config.cache_dir
    cache.mkdir(parents=True, exist_ok=True)
    prefix = cache / dir_name
    found = read_install(spec, prefix, bin_relative, program_relative)
    if found is not None:
        return found
    async with file_lock(cache / f".{dir_name}.lock", config.lock_timeout):
        found = read_install(spec, prefix, bin_relative, program_relative)
        if found is not None:
            return found
        await asyncio.to_thread(_remove_leftovers, cache, dir_name)
        staging = cache / f".{dir_name}.partial-{uuid.uuid4().hex}"
        staging.mkdir()
        try:
            await populate(staging)
            if not os.access(staging / bin_relative, os.X_OK):
                raise InstallError(f"the installer left no executable at {bin_relative}")
            binary = staging / (program_relative or bin_relative)
            version_output = await _verify(binary, verify_args, expected_version, config)
            _write_marker(staging, spec, bin_relative, version_output)
            staging.rename(prefix)
        except BaseException:
            await asyncio.to_thread(shutil.rmtree, staging, True)
            raise
    return InstalledCli(spec, prefix, bin_relative, version_output, program_relative)


def read_install(
    spec: str, prefix: Path, bin_relative: str, program_relative: str | None = None
) -> InstalledCli | None:
    """The install at `prefix` if its marker proves a verified install of exactly `spec`."""
    try:
        marker = json.loads((prefix / MARKER_NAME).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict):
        return None
    if marker.get("spec") != spec or marker.get("bin") != bin_relative:
        return None
    version_output = str(marker.get("version_output"))
    installed = InstalledCli(spec, prefix, bin_relative, version_output, program_relative)
    if not os.access(installed.bin_path, os.X_OK) or not os.access(installed.program_path, os.X_OK):
        return None
    return installed


async def run_checked(argv: Sequence[str], config: InstallConfig, timeout: float, what: str) -> str:
    """Run an installer command on the host; raise InstallError unless it exits 0."""
    code, output, errors = await _run(argv, _base_env(config), timeout)
    if code != 0:
        raise InstallError(f"{what} exited {code}: {errors[-_OUTPUT_TAIL:]}")
    return output


async def _verify(
    binary: Path, args: Sequence[str], expected_version: str, config: InstallConfig
) -> str:
    if not os.access(binary, os.X_OK):
        raise InstallError(f"the installer left no executable at {binary}")
    with tempfile.TemporaryDirectory(prefix="harness-verify-") as home:
        # A throwaway HOME: a CLI may create its state directory even for --version.
        env = {**_base_env(config), "HOME": home}
        code, output, errors = await _run([str(binary), *args], env, config.verify_timeout)
    output = output.strip()
    if code != 0:
        raise InstallError(f"{binary} {' '.join(args)} exited {code}: {errors[-_OUTPUT_TAIL:]}")
    if expected_version not in output:
        raise InstallError(f"{binary} printed {output!r}, expected version {expected_version}")
    return output


def _base_env(config: InstallConfig) -> dict[str, str]:
    return dict(os.environ if config.npm_env is None else config.npm_env)


async def _run(argv: Sequence[str], env: dict[str, str], timeout: float) -> tuple[int, str, str]:
    """Run a host command in its own process group; kill the group at the timeout.

    Returns (exit code, stdout, stderr); stdout alone is the answer (Codex prints warnings
    on stderr even for --version).
    """
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except BaseException as error:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
        if isinstance(error, TimeoutError):
            raise InstallError(f"{argv[0]} did not finish within {timeout:.0f}s") from error
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def _write_marker(prefix: Path, spec: str, bin_relative: str, version_output: str) -> None:
    marker = {"spec": spec, "bin": bin_relative, "version_output": version_output}
    tmp = prefix / f"{MARKER_NAME}.tmp"
    tmp.write_text(json.dumps(marker, indent=2) + "\n")
    tmp.rename(prefix / MARKER_NAME)


def _remove_leftovers(cache: Path, dir_name: str) -> None:
    """Under the lock: delete crashed installers' staging dirs and an unverified final dir."""
    for partial in cache.glob(f".{dir_name}.partial-*"):
        shutil.rmtree(partial, ignore_errors=True)
    prefix = cache / dir_name
    if prefix.exists():
        shutil.rmtree(prefix)
