"""Per-sandbox limits: a runaway command ends with a clear result; the host and a neighbour
sandbox stay healthy. Run with cgroups (the default where the host allows) and with the
rlimit fallback (`use_cgroups=False`)."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest

from sandbox import ExecResult, InitGoneError, LocalBackend, ResourceLimits, SandboxSpec

from .conftest import local_config

MiB = 1 << 20
AS_ROOT = os.geteuid() == 0
FORK_BOMB = "bomb() { bomb | bomb; }; bomb"  # in the foreground: exec waits for all of it
MEMORY_HOG = "tail /dev/zero"  # buffers an endless line: grows until something stops it


@pytest.fixture(params=["cgroups", "rlimits"])
async def limited(request: pytest.FixtureRequest, tmp_path: Path) -> LocalBackend:
    backend = LocalBackend(local_config(tmp_path, use_cgroups=request.param == "cgroups"))
    enforcement = await backend.enforcement()
    if request.param == "cgroups" and not {"pids", "memory"} <= set(enforcement.cgroup_controllers):
        pytest.fail(f"this host gives no pids/memory cgroups: {enforcement.fallbacks}")
    return backend


def host_can_fork() -> bool:
    return subprocess.run(["true"], check=False).returncode == 0


async def while_running(
    backend: LocalBackend, runaway: str, limits: ResourceLimits, timeout: float
) -> tuple[ExecResult, ExecResult]:
    """Run `runaway` in one sandbox while a neighbour sandbox and the host do ordinary work."""
    async with (
        await backend.create(SandboxSpec(limits=limits)) as bad,
        await backend.create(SandboxSpec()) as neighbour,
    ):
        task = asyncio.create_task(bad.exec(runaway, timeout=timeout))
        await asyncio.sleep(1.5)  # the runaway is at its limit by now
        healthy = await neighbour.exec("echo ok; seq 100 | xargs -n1 -P8 true; echo done")
        assert host_can_fork()
        return await task, healthy


async def test_a_fork_bomb_ends_at_its_deadline_and_harms_no_one(
    limited: LocalBackend,
) -> None:
    fallback = (await limited.enforcement()).cgroup_controllers == ()
    result, neighbour = await while_running(
        limited, FORK_BOMB, ResourceLimits(max_processes=64), timeout=4
    )
    assert result.timed_out or result.exit_code != 0
    assert "fork" in result.stderr  # bash says why: "fork: retry: Resource temporarily ..."
    if not fallback:
        assert "max_processes" in result.limits_hit
    if fallback and not AS_ROOT:
        # RLIMIT_NPROC counts per host user; unprivileged sandboxes share one (docs/isolation.md).
        return
    assert neighbour.stdout == "ok\ndone\n"


async def test_a_memory_hog_is_stopped_and_harms_no_one(limited: LocalBackend) -> None:
    fallback = (await limited.enforcement()).cgroup_controllers == ()
    result, neighbour = await while_running(
        limited, MEMORY_HOG, ResourceLimits(memory_bytes=256 * MiB), timeout=20
    )
    assert not result.timed_out
    assert neighbour.stdout == "ok\ndone\n"
    if fallback:  # RLIMIT_DATA: the allocation fails inside the process
        assert result.exit_code == 1
        assert "memory exhausted" in result.stderr
    else:  # the cgroup's OOM killer
        assert result.exit_code == 137
        assert result.limits_hit == ("memory_bytes",)


async def test_the_workspace_and_scratch_space_are_bounded(tmp_path: Path) -> None:
    backend = LocalBackend(local_config(tmp_path))
    limits = ResourceLimits(workspace_bytes=8 * MiB, scratch_bytes=4 * MiB)
    async with await backend.create(SandboxSpec(limits=limits)) as box:
        sized = {box.workspace: "workspace_bytes"}
        sized |= dict.fromkeys(("/tmp", "/var/tmp", "/root", "/dev/shm"), "scratch_bytes")
        for directory, limit in sized.items():
            full = await box.exec(f"head -c {16 * MiB} /dev/zero > {directory}/fill; echo went on")
            assert "No space left on device" in full.stderr, directory
            assert full.stdout == "went on\n"  # the shell's status says nothing of it ...
            assert limit in full.limits_hit, directory  # ... the report does
            await box.exec(f"rm {directory}/fill")
        assert (await box.exec("echo fine")).limits_hit == ()
        assert (await box.exec("df --output=size -B1 /workspace | tail -1")).stdout.strip() == str(
            8 * MiB
        )


async def test_cpu_time_and_file_size_limits_kill_with_their_signal(tmp_path: Path) -> None:
    backend = LocalBackend(local_config(tmp_path))
    limits = ResourceLimits(cpu_seconds=1, max_file_size_bytes=MiB)
    async with await backend.create(SandboxSpec(limits=limits)) as box:
        spin = await box.exec("while :; do :; done", timeout=30)
        assert (spin.exit_code, spin.limits_hit) == (128 + 24, ("cpu_seconds",))  # SIGXCPU
        big = await box.exec(f"head -c {2 * MiB} /dev/zero > big")
        assert (big.exit_code, big.limits_hit) == (128 + 25, ("max_file_size_bytes",))  # SIGXFSZ


def orphaned(command: str) -> str:
    """A shell line running ``command`` as an orphan and waiting until it is gone.

    The subshell exits at once, so its background child is adopted by the sandbox's init
    (pid 1), which reaps it. The child becomes ``command`` only once adopted: a child that died
    before its subshell exited would be reaped by that shell, not init (on a loaded machine
    ``head`` can finish first), and no orphan would have died.
    """
    adopted = 'while [ "$(cut -d" " -f4 /proc/$$/stat)" != 1 ]; do sleep 0.02; done'
    return (
        f"(sh -c '{adopted}; exec {command}' & echo $! > /tmp/pid); "
        "while kill -0 $(cat /tmp/pid) 2>/dev/null; do sleep 0.1; done"
    )


async def test_an_orphan_killed_by_a_limit_is_reported(limited: LocalBackend) -> None:
    limits = ResourceLimits(cpu_seconds=1, max_file_size_bytes=MiB)
    async with await limited.create(SandboxSpec(limits=limits)) as box:
        big = await box.exec(orphaned(f"head -c {2 * MiB} /dev/zero > big"))
        assert (big.exit_code, big.limits_hit) == (0, ("max_file_size_bytes",))
        spin = await box.exec(orphaned('sh -c "while :; do :; done"'), timeout=60)
        assert (spin.exit_code, spin.limits_hit) == (0, ("cpu_seconds",))
        assert (await box.exec("true")).limits_hit == ()


async def test_tmpfs_filling_the_memory_costs_a_command_not_the_sandbox(
    limited: LocalBackend,
) -> None:
    enforcement = await limited.enforcement()
    if "memory" not in enforcement.cgroup_controllers:
        assert "memory_bytes" in enforcement.unreported
        assert any("tmpfs files do not count" in line for line in enforcement.fallbacks)
        return
    limits = ResourceLimits(memory_bytes=128 * MiB, scratch_bytes=512 * MiB)
    async with await limited.create(SandboxSpec(limits=limits)) as box:
        fill = await box.exec(f"head -c {256 * MiB} /dev/zero > /dev/shm/fill", timeout=60)
        # The command, not init, was the OOM killer's choice (init's death raised before).
        assert (fill.exit_code, fill.limits_hit) == (137, ("memory_bytes",))
        (after,) = await asyncio.gather(
            box.exec("rm /dev/shm/fill && echo alive", timeout=60), return_exceptions=True
        )
        if isinstance(after, InitGoneError):
            # Full of tmpfs files, the sandbox has nothing else to give: unless init is exempt
            # (root with CAP_SYS_RESOURCE) the next fork may take it; then it says why.
            assert not enforcement.oom_exempt_init
            assert "memory_bytes" in str(after)
        else:
            assert isinstance(after, ExecResult), after
            assert after.stdout == "alive\n"


async def test_what_cannot_be_reported_is_named(limited: LocalBackend) -> None:
    enforcement = await limited.enforcement()
    assert "max_open_files" in enforcement.unreported
    async with await limited.create(SandboxSpec(limits=ResourceLimits(max_open_files=64))) as box:
        many = await box.exec("python3 -c 'fs = [open(\"/dev/null\") for _ in range(100)]'")
        assert "Too many open files" in many.stderr
        assert many.limits_hit == ()  # as `unreported` says


async def test_cpu_bandwidth_is_capped(tmp_path: Path) -> None:
    backend = LocalBackend(local_config(tmp_path))
    if "cpu" not in (await backend.enforcement()).cgroup_controllers:
        pytest.skip("no cpu cgroup here")
    script = (
        "import time; start = time.monotonic()\n"
        "while time.monotonic() - start < 2: pass\n"
        "print(time.process_time())"
    )
    async with await backend.create(SandboxSpec(limits=ResourceLimits(cpu_cores=0.2))) as box:
        result = await box.exec(f"python3 -c '{script}'", timeout=30)
    assert float(result.stdout) < 0.8  # 2 s of wall time at 0.2 cores is ~0.4 s of CPU


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="memory_bytes must be positive"):
        ResourceLimits(memory_bytes=0)
