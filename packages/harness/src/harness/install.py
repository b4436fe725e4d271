"""Install a pinned agent CLI from npm once per host, into a shared cache directory.

Each (package, version) gets its own directory `<cache>/<name>@<version>`. npm installs into
a private staging directory; the CLI is verified by running `--version`; the marker file is
written; and only then is the staging directory renamed into place. So the final directory
exists only as a verified install, a crash leaves at most a staging directory (removed by
the next installer), and readers never see a half-written tree. A file lock per CLI version
serializes installers across processes; the fast path (already installed) takes no lock.
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
from dataclasses import dataclass
from pathlib import Path

from harness._lock import file_lock
from harness.config import InstallConfig, NpmCli
from harness.errors import InstallError

MARKER_NAME = ".agent-rl-install.json"
_OUTPUT_TAIL = 4000


@dataclass(frozen=True, slots=True)
class InstalledCli:
    """A verified install of one CLI version on this host.

    prefix: the `npm --prefix` directory (read-only from here on; share it, never modify it).
    version_output: what `<bin> --version` printed when the install was verified.
    """

    cli: NpmCli
    prefix: Path
    version_output: str

    @property
    def version(self) -> str:
        return self.cli.version

    @property
    def bin_relative(self) -> str:
        """The command's path relative to `prefix` (the same inside any mount of it)."""
        return f"node_modules/.bin/{self.cli.bin}"

    @property
    def bin_path(self) -> Path:
        return self.prefix / self.bin_relative


async def install_cli(cli: NpmCli, config: InstallConfig) -> InstalledCli:
    """Return the verified install of `cli`, installing it first if this host lacks it."""
    cache = config.cache_dir
    cache.mkdir(parents=True, exist_ok=True)
    prefix = cache / cli.install_dir_name
    found = read_install(cli, prefix)
    if found is not None:
        return found
    async with file_lock(cache / f".{cli.install_dir_name}.lock", config.lock_timeout):
        found = read_install(cli, prefix)
        if found is not None:
            return found
        await asyncio.to_thread(_remove_leftovers, cache, cli, prefix)
        staging = cache / f".{cli.install_dir_name}.partial-{uuid.uuid4().hex}"
        staging.mkdir()
        try:
            await _npm_install(cli, config, staging)
            version_output = await verify_cli(cli, staging, config)
            _write_marker(staging, cli, version_output)
            staging.rename(prefix)
        except BaseException:
            await asyncio.to_thread(shutil.rmtree, staging, True)
            raise
    return InstalledCli(cli=cli, prefix=prefix, version_output=version_output)


def read_install(cli: NpmCli, prefix: Path) -> InstalledCli | None:
    """The install at `prefix` if its marker proves a verified install of exactly `cli`."""
    try:
        marker = json.loads((prefix / MARKER_NAME).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict):
        return None
    expected = {"package": cli.package, "version": cli.version, "bin": cli.bin}
    if any(marker.get(key) != value for key, value in expected.items()):
        return None
    version_output = marker.get("version_output")
    installed = InstalledCli(cli=cli, prefix=prefix, version_output=str(version_output))
    if not os.access(installed.bin_path, os.X_OK):
        return None
    return installed


async def verify_cli(cli: NpmCli, prefix: Path, config: InstallConfig) -> str:
    """Run `<bin> --version` and check it names the pinned version; return its output."""
    binary = prefix / "node_modules" / ".bin" / cli.bin
    if not os.access(binary, os.X_OK):
        raise InstallError(f"npm installed {cli.spec} but {binary} is not an executable")
    with tempfile.TemporaryDirectory(prefix="harness-verify-") as home:
        # A throwaway HOME: a CLI may create its state directory even for --version.
        env = {**_base_env(config), "HOME": home}
        code, output, errors = await _run([str(binary), "--version"], env, config.verify_timeout)
    output = output.strip()
    if code != 0:
        raise InstallError(f"{binary} --version exited {code}: {errors[-_OUTPUT_TAIL:]}")
    if cli.version not in output:
        raise InstallError(f"{binary} --version printed {output!r}, expected {cli.version}")
    return output


async def _npm_install(cli: NpmCli, config: InstallConfig, staging: Path) -> None:
    npm = shutil.which(config.npm)
    if npm is None:
        raise InstallError(f"npm not found (looked for {config.npm!r})")
    argv = [npm, "install", "--prefix", str(staging), cli.spec, "--no-audit", "--no-fund"]
    code, _, errors = await _run(argv, _base_env(config), config.install_timeout)
    if code != 0:
        raise InstallError(f"npm install {cli.spec} exited {code}: {errors[-_OUTPUT_TAIL:]}")


def _base_env(config: InstallConfig) -> dict[str, str]:
    return dict(os.environ if config.npm_env is None else config.npm_env)


async def _run(argv: list[str], env: dict[str, str], timeout: float) -> tuple[int, str, str]:
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


def _write_marker(prefix: Path, cli: NpmCli, version_output: str) -> None:
    marker = {
        "package": cli.package,
        "version": cli.version,
        "bin": cli.bin,
        "version_output": version_output,
    }
    tmp = prefix / f"{MARKER_NAME}.tmp"
    tmp.write_text(json.dumps(marker, indent=2) + "\n")
    tmp.rename(prefix / MARKER_NAME)


def _remove_leftovers(cache: Path, cli: NpmCli, prefix: Path) -> None:
    """Under the lock: delete crashed installers' staging dirs and an unverified final dir."""
    for partial in cache.glob(f".{cli.install_dir_name}.partial-*"):
        shutil.rmtree(partial, ignore_errors=True)
    if prefix.exists():
        shutil.rmtree(prefix)
