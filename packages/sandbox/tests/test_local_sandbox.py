"""The local sandbox's contract with real processes: commands, deadlines, files, close.

(The isolation layers are attacked in test_escape.py, the limits in test_limits.py.)
"""

from __future__ import annotations

import asyncio
import gc
import logging
from pathlib import Path, PurePosixPath

import pytest
from machine_load import slowdown

from sandbox import (
    CheckoutError,
    DirectoryWorkspace,
    GitWorkspace,
    LocalBackend,
    LocalConfig,
    LocalSandbox,
    ReadOnlyBind,
    SandboxClosedError,
    SandboxCommandError,
    SandboxFileNotFoundError,
    SandboxSpec,
    SandboxUnavailableError,
    UnsupportedSpecError,
)

from .conftest import git, local_config
from .host_processes import unique_sleep, until_no_process, wait_for_process

# -- commands ---------------------------------------------------------------------------------


async def test_exec_reports_exit_codes_output_and_env(box: LocalSandbox) -> None:
    result = await box.exec("echo out; echo err >&2; echo $FOO; pwd; exit 3", env={"FOO": "bar"})
    assert (result.exit_code, result.stdout, result.stderr, result.timed_out) == (
        3,
        f"out\nbar\n{box.workspace}\n",
        "err\n",
        False,
    )
    assert (await box.exec("shopt -q login_shell")).ok  # bash -lc, like E2B
    assert (await box.exec("pwd", cwd="/tmp")).stdout == "/tmp\n"
    assert (await box.exec("mkdir -p sub && cd sub && pwd")).stdout == f"{box.workspace}/sub\n"
    assert (await box.exec("pwd", cwd="sub")).stdout == f"{box.workspace}/sub\n"
    assert (await box.exec("echo $HOME; id -u")).stdout == "/root\n0\n"


async def test_a_missing_working_directory_is_an_error_not_a_hang(box: LocalSandbox) -> None:
    with pytest.raises(SandboxCommandError, match="no/such/dir"):
        await box.exec("true", cwd="/no/such/dir")
    assert (await box.exec("echo still serving")).stdout == "still serving\n"


async def test_large_commands_and_environments_reach_the_shell(box: LocalSandbox) -> None:
    # Together larger than one control message (sent out of band), each under the kernel's
    # 128 KiB limit on one argument or variable.
    big = "x" * 100_000
    result = await box.exec(f"echo ${{#BIG}}; printf %s '{big}' | wc -c", env={"BIG": big})
    assert result.stdout.split() == ["100000", "100000"]


async def test_a_killed_command_is_137_but_not_timed_out(box: LocalSandbox) -> None:
    result = await box.exec("kill -9 $$")
    assert (result.exit_code, result.timed_out) == (137, False)


async def test_timeout_kills_the_command_and_its_children(box: LocalSandbox) -> None:
    marker = unique_sleep()
    result = await box.exec(
        f"echo before; sleep {marker} & sleep {marker}; echo never", timeout=0.5
    )
    assert (result.exit_code, result.timed_out, result.stdout) == (137, True, "before\n")
    assert 0.5 <= result.duration < 0.5 + 4.5 * slowdown()
    await until_no_process(marker)


async def test_a_cancelled_exec_kills_its_command(box: LocalSandbox) -> None:
    marker = unique_sleep()
    task = asyncio.create_task(box.exec(f"sleep {marker}"))
    await wait_for_process(marker)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await until_no_process(marker)


async def test_a_cancelled_exec_then_close_leaves_no_error_unretrieved(box: LocalSandbox) -> None:
    """An interrupted run cancels its episodes' commands and closes their sandboxes at once: the
    cancelled command's exit, never learnt (its sandbox went first), is nobody's error to log."""
    reported: list[dict[str, object]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, context: reported.append(context))
    marker = unique_sleep()
    task = asyncio.create_task(box.exec(f"sleep {marker}"))
    await wait_for_process(marker)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await box.close()
    del task
    for _ in range(3):
        await asyncio.sleep(0.05)
        gc.collect()
    assert reported == []
    await until_no_process(marker)


async def test_background_children_of_a_finished_command_keep_running(box: LocalSandbox) -> None:
    marker = unique_sleep()
    result = await box.exec(f"sleep {marker} > /dev/null 2>&1 &")
    assert result.ok
    # E2B semantics: exec returns, the child lives on. Polled: a child caught mid-exec has an
    # empty command line for a moment (1 in 60 with two busy spinners).
    await wait_for_process(marker)
    await box.close()
    await until_no_process(marker)


async def test_detached_process_wait_kill_and_output_files(box: LocalSandbox) -> None:
    quick = await box.start("echo one; echo two >&2; exit 4")
    done = await quick.wait(timeout=10)
    assert (done.exit_code, done.stdout, done.stderr, done.timed_out) == (
        4,
        "one\n",
        "two\n",
        False,
    )
    assert quick.stdout_path.read_text() == "one\n"

    marker = unique_sleep()
    slow = await box.start(f"echo started; sleep {marker}")
    over = await slow.wait(timeout=0.3)
    assert (over.exit_code, over.timed_out, over.stdout) == (137, True, "started\n")
    await until_no_process(marker)

    marker = unique_sleep()
    killed = await box.start(f"sleep {marker}")
    await killed.kill()
    assert (await killed.wait()).exit_code == 137
    await until_no_process(marker)


async def test_close_kills_everything_even_escaped_daemons(backend: LocalBackend) -> None:
    box = await backend.create(SandboxSpec())
    assert isinstance(box, LocalSandbox)
    markers = [unique_sleep() for _ in range(3)]
    await box.start(f"sleep {markers[0]}")
    await box.exec(f"setsid sleep {markers[1]} > /dev/null 2>&1 < /dev/null &")
    await box.exec(f"nohup setsid bash -c '(sleep {markers[2]} &) &' > /dev/null 2>&1 &")
    for marker in markers:
        await wait_for_process(marker)
    init = box.init_pid
    state = box._state_dir
    await box.close()
    for marker in markers:
        await until_no_process(marker)
    assert not Path(f"/proc/{init}").exists()
    assert not state.exists()
    with pytest.raises(SandboxClosedError):
        await box.exec("true")
    await box.close()  # idempotent


async def test_fifty_concurrent_sandboxes(backend: LocalBackend) -> None:
    async def one(index: int) -> str:
        async with await backend.create(SandboxSpec(env={"INDEX": str(index)})) as box:
            return (await box.exec("echo $INDEX; hostname")).stdout

    outputs = await asyncio.gather(*(one(i) for i in range(50)))
    for index, output in enumerate(outputs):
        assert output == f"{index}\nsandbox\n"


# -- files ------------------------------------------------------------------------------------


async def test_file_round_trips_and_missing_files(box: LocalSandbox) -> None:
    payload = bytes(range(256)) * 100
    await box.write_file("deep/dir/blob.bin", payload)
    assert await box.read_file(f"{box.workspace}/deep/dir/blob.bin") == payload
    await box.write_file("/tmp/t.txt", "héllo\n")
    assert await box.read_text("/tmp/t.txt") == "héllo\n"
    assert (await box.exec("cat /tmp/t.txt")).stdout == "héllo\n"
    await box.write_file("name with 'quotes' and $x.txt", b"")
    assert await box.read_file("name with 'quotes' and $x.txt") == b""
    with pytest.raises(SandboxFileNotFoundError) as missing:
        await box.read_file("nope.txt")
    assert isinstance(missing.value, FileNotFoundError)
    with pytest.raises(SandboxCommandError, match="directory"):
        await box.read_file("deep")


async def test_directory_workspace_is_copied(backend: LocalBackend, tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "pkg").mkdir(parents=True)
    (source / "pkg" / "mod.py").write_text("X = 1\n")
    (source / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (source / "run.sh").chmod(0o755)
    (source / "link").symlink_to("pkg/mod.py")
    async with await backend.create(SandboxSpec(workspace=DirectoryWorkspace(source))) as box:
        assert await box.read_text("pkg/mod.py") == "X = 1\n"
        assert (await box.exec("./run.sh; readlink link")).stdout == "ran\npkg/mod.py\n"
        await box.write_file("pkg/mod.py", "X = 2\n")
    assert (source / "pkg" / "mod.py").read_text() == "X = 1\n"


async def test_git_workspace_is_a_checkout_of_the_base(
    backend: LocalBackend, source_repo: tuple[Path, str]
) -> None:
    repo, base = source_repo
    async with await backend.create(SandboxSpec(workspace=GitWorkspace(repo, base[:10]))) as box:
        assert (await box.exec("git rev-parse HEAD")).stdout.strip() == base
        assert (await box.exec("git status --porcelain")).stdout == ""
        assert not (await box.exec("test -e later.txt")).ok
        await box.exec("echo changed > edit.py && git commit -qam agent", env=_GIT_IDENTITY)
    assert git(repo, "log", "--format=%s") == "later\nbase"  # the source never changes


async def test_bad_workspaces_are_clear_errors(
    backend: LocalBackend, source_repo: tuple[Path, str], tmp_path: Path
) -> None:
    repo, _ = source_repo
    with pytest.raises(CheckoutError, match="not found"):
        await backend.create(SandboxSpec(workspace=GitWorkspace(repo, "deadbeef" * 5)))
    with pytest.raises(UnsupportedSpecError, match="not a directory"):
        await backend.create(SandboxSpec(workspace=DirectoryWorkspace(tmp_path / "missing")))


async def test_read_only_binds_are_visible_and_unwritable(
    backend: LocalBackend, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "pkg.txt").write_text("cached\n")
    spec = SandboxSpec(read_only_binds=(ReadOnlyBind(cache, PurePosixPath("/opt/cache")),))
    async with await backend.create(spec) as box:
        assert (await box.exec("cat /opt/cache/pkg.txt")).stdout == "cached\n"
        assert not (await box.exec("echo x > /opt/cache/new.txt")).ok
        assert not (await box.exec("rm /opt/cache/pkg.txt")).ok
    assert sorted(p.name for p in cache.iterdir()) == ["pkg.txt"]


_GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "agent",
    "GIT_AUTHOR_EMAIL": "agent@example.invalid",
    "GIT_COMMITTER_NAME": "agent",
    "GIT_COMMITTER_EMAIL": "agent@example.invalid",
}


# -- no silent downgrade ----------------------------------------------------------------------


async def test_missing_bubblewrap_is_a_clear_error_not_a_fallback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap anywhere on it
    backend = LocalBackend(local_config(tmp_path))
    with pytest.raises(SandboxUnavailableError, match=r"bubblewrap \(bwrap\) not found"):
        await backend.create(SandboxSpec())


def test_isolation_must_be_named_explicitly() -> None:
    with pytest.raises(ValueError, match="'none' \\(unsafe"):
        LocalConfig(isolation="auto")  # type: ignore[arg-type]


async def test_unsandboxed_mode_is_loud_and_still_kills_what_it_started(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    backend = LocalBackend(LocalConfig(isolation="none", state_root=tmp_path))
    with caplog.at_level(logging.WARNING, logger="sandbox._local"):
        box = await backend.create(SandboxSpec())
    assert not box.isolated
    assert any("never use it for model-written code" in r.message for r in caplog.records)
    assert (await box.exec("pwd")).stdout == f"{box.workspace}\n"
    marker = unique_sleep()
    await box.start(f"sleep {marker}")
    timed = await box.exec(f"sleep {marker}", timeout=0.2)
    assert timed.timed_out
    await box.close()
    await until_no_process(marker)
    assert not Path(box.workspace).exists()
