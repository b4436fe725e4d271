"""Installing pinned CLIs from npm: the real packages, a verified marker, idempotence,
concurrency and crash leftovers (the latter with a small real npm package to stay fast)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from harness import (
    CLAUDE_CODE_CLI,
    CODEX_CLI,
    InstallConfig,
    InstalledCli,
    InstallError,
    NpmCli,
    install_cli,
    install_once,
)
from harness._install import MARKER_NAME, read_install

from .conftest import require_npm

# A tiny real CLI (one file, no dependencies) whose `--version` prints its version.
JSON5 = NpmCli("json5", "2.2.3", bin="json5")


def run_version(installed: InstalledCli, home: Path) -> str:
    done = subprocess.run(
        [str(installed.bin_path), "--version"],
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


@pytest.mark.parametrize(
    ("fixture", "cli", "expected"),
    [
        ("claude_install", CLAUDE_CODE_CLI, "2.1.330 (Claude Code)"),
        ("codex_install", CODEX_CLI, "codex-cli 0.169.0"),
    ],
)
def test_real_cli_installs_and_reports_its_pinned_version(
    fixture: str, cli: NpmCli, expected: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    installed: InstalledCli = request.getfixturevalue(fixture)
    assert installed.prefix.name == cli.install_dir_name
    assert installed.spec == cli.spec
    assert installed.bin_relative == f"node_modules/.bin/{cli.bin}"
    assert installed.version_output == expected
    assert run_version(installed, tmp_path) == expected
    marker = json.loads((installed.prefix / MARKER_NAME).read_text())
    assert marker == {
        "spec": cli.spec,
        "bin": installed.bin_relative,
        "version_output": expected,
    }


async def test_installed_cli_is_reused_without_running_npm(
    claude_install: InstalledCli, codex_install: InstalledCli
) -> None:
    # An npm that does not exist proves the fast path never reaches npm.
    config = InstallConfig(cache_dir=claude_install.prefix.parent, npm="no-such-npm-binary")
    assert await install_cli(CLAUDE_CODE_CLI, config) == claude_install
    assert await install_cli(CODEX_CLI, config) == codex_install


@pytest.fixture
def npm_log(tmp_path: Path) -> tuple[Path, Path]:
    """A wrapper around the real npm that logs each invocation; returns (wrapper, log)."""
    require_npm()
    real = shutil.which("npm")
    log = tmp_path / "npm-invocations.log"
    wrapper = tmp_path / "npm-logged"
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> {log}\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper, log


async def test_concurrent_installers_run_npm_once(
    tmp_path: Path, npm_log: tuple[Path, Path]
) -> None:
    wrapper, log = npm_log
    config = InstallConfig(cache_dir=tmp_path / "cache", npm=str(wrapper))
    results = await asyncio.gather(*(install_cli(JSON5, config) for _ in range(4)))
    assert len(set(results)) == 1
    assert len(log.read_text().splitlines()) == 1
    assert results[0].version_output == "2.2.3"
    leftovers = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert leftovers == [f".{JSON5.install_dir_name}.lock", JSON5.install_dir_name]


async def test_crash_leftovers_are_replaced_by_a_verified_install(
    tmp_path: Path, npm_log: tuple[Path, Path]
) -> None:
    wrapper, log = npm_log
    cache = tmp_path / "cache"
    prefix = cache / JSON5.install_dir_name
    # What a crashed installer can leave: a staging directory, and (from an older layout or
    # a hand-made copy) a final directory without a marker.
    (cache / f".{JSON5.install_dir_name}.partial-dead").mkdir(parents=True)
    (prefix / "node_modules").mkdir(parents=True)
    (prefix / "junk").write_text("half written")
    assert read_install(JSON5.spec, prefix, "node_modules/.bin/json5") is None
    installed = await install_cli(JSON5, InstallConfig(cache_dir=cache, npm=str(wrapper)))
    assert installed.prefix == prefix
    assert not (prefix / "junk").exists()
    assert os.access(installed.bin_path, os.X_OK)
    assert [p.name for p in cache.iterdir() if "partial" in p.name] == []
    assert len(log.read_text().splitlines()) == 1


async def test_a_marker_for_another_version_is_not_trusted(
    tmp_path: Path, npm_log: tuple[Path, Path]
) -> None:
    wrapper, _ = npm_log
    cache = tmp_path / "cache"
    installed = await install_cli(JSON5, InstallConfig(cache_dir=cache, npm=str(wrapper)))
    marker = installed.prefix / MARKER_NAME
    data = json.loads(marker.read_text())
    assert read_install(JSON5.spec, installed.prefix, installed.bin_relative) == installed
    marker.write_text(json.dumps({**data, "spec": "json5@2.2.2"}))
    assert read_install(JSON5.spec, installed.prefix, installed.bin_relative) is None
    marker.write_text("{not json")
    assert read_install(JSON5.spec, installed.prefix, installed.bin_relative) is None


async def test_failed_install_raises_and_leaves_nothing_behind(
    tmp_path: Path, npm_log: tuple[Path, Path]
) -> None:
    wrapper, _ = npm_log
    cache = tmp_path / "cache"
    missing = NpmCli("json5", "99.99.99", bin="json5")
    with pytest.raises(InstallError, match=r"npm install json5@99\.99\.99 exited"):
        await install_cli(missing, InstallConfig(cache_dir=cache, npm=str(wrapper)))
    assert [p.name for p in cache.iterdir()] == [f".{missing.install_dir_name}.lock"]


async def test_wrong_bin_name_fails_verification(
    tmp_path: Path, npm_log: tuple[Path, Path]
) -> None:
    wrapper, _ = npm_log
    cache = tmp_path / "cache"
    wrong = NpmCli("json5", "2.2.3", bin="not-json5")
    with pytest.raises(InstallError, match="left no executable"):
        await install_cli(wrong, InstallConfig(cache_dir=cache, npm=str(wrapper)))
    assert not (cache / wrong.install_dir_name).exists()


async def test_missing_npm_is_a_clear_error(tmp_path: Path) -> None:
    config = InstallConfig(cache_dir=tmp_path / "cache", npm="no-such-npm-binary")
    with pytest.raises(InstallError, match="npm not found"):
        await install_cli(JSON5, config)


@pytest.mark.parametrize(
    ("package", "version", "bin_name", "message"),
    [
        ("json5", "^2.2.3", "json5", "exact version"),
        ("json5", "latest", "json5", "exact version"),
        ("JSON5", "2.2.3", "json5", "npm package name"),
        ("@scope/", "1.0.0", "x", "npm package name"),
        ("json5", "2.2.3", "../json5", "command name"),
    ],
)
def test_npm_cli_refuses_ranges_and_bad_names(
    package: str, version: str, bin_name: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        NpmCli(package, version, bin=bin_name)


def test_install_dir_names_are_distinct_and_path_safe() -> None:
    assert CLAUDE_CODE_CLI.install_dir_name == "anthropic-ai+claude-code@2.1.330"
    assert CODEX_CLI.install_dir_name == "openai+codex@0.169.0"
    assert CLAUDE_CODE_CLI.spec == "@anthropic-ai/claude-code@2.1.330"


def script_installer(body: str) -> Callable[[Path], Awaitable[None]]:
    """An installer that is not npm: it writes a shell-script CLI into the staging dir."""

    async def populate(staging: Path) -> None:
        (staging / "bin").mkdir()
        script = staging / "bin" / "tool"
        script.write_text(f"#!/bin/sh\n{body}\n")
        script.chmod(0o755)

    return populate


async def test_install_once_serves_any_installer(tmp_path: Path) -> None:
    config = InstallConfig(cache_dir=tmp_path / "cache", npm="no-such-npm-binary")
    kwargs = {"dir_name": "tool@1.4.0", "spec": "tool==1.4.0", "bin_relative": "bin/tool"}
    installed = await install_once(
        config, expected_version="1.4.0", populate=script_installer("echo tool 1.4.0"), **kwargs
    )
    assert (installed.spec, installed.version_output) == ("tool==1.4.0", "tool 1.4.0")
    # Installed once: a second call with a failing installer never runs it.
    again = await install_once(
        config, expected_version="1.4.0", populate=script_installer("exit 1"), **kwargs
    )
    assert again == installed


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("echo tool 1.3.9", "expected version 1.4.0"),
        ("echo broken >&2; exit 3", "exited 3: broken"),
    ],
)
async def test_install_once_keeps_nothing_that_fails_verification(
    tmp_path: Path, body: str, message: str
) -> None:
    cache = tmp_path / "cache"
    with pytest.raises(InstallError, match=message):
        await install_once(
            InstallConfig(cache_dir=cache),
            dir_name="tool@1.4.0",
            spec="tool==1.4.0",
            bin_relative="bin/tool",
            expected_version="1.4.0",
            populate=script_installer(body),
        )
    assert [p.name for p in cache.iterdir()] == [".tool@1.4.0.lock"]
