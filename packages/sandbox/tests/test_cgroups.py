"""Cgroup discovery and limit files for layouts this CI machine does not have (pure cgroup v2,
containers), from the kernel's own file formats. (Creating real groups is covered by the limits
and leak suites, which run on this machine's cgroup v1 hierarchies.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox._local._cgroups import CgroupLimits, parse_mounts, parse_own_cgroups, write_limit

SYSTEMD_V2 = """\
24 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate
"""
HYBRID = """\
30 25 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec shared:4 - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:5 - cgroup2 cgroup2 rw
33 30 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:8 - cgroup cgroup rw,cpu,cpuacct
34 30 0:30 / /sys/fs/cgroup/pids rw,nosuid shared:9 - cgroup cgroup rw,pids
35 30 0:31 / /sys/fs/cgroup/memory rw,nosuid shared:10 - cgroup cgroup rw,memory
"""
# A v1 container without a cgroup namespace: the mount's root is the container's own group.
CONTAINER_V1 = """\
600 590 0:40 /docker/abc123 /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory
"""


def test_pure_v2_under_systemd() -> None:
    (mount,) = parse_mounts(SYSTEMD_V2)
    assert (mount.version, str(mount.mountpoint)) == (2, "/sys/fs/cgroup")
    own = parse_own_cgroups("0::/user.slice/user-1000.slice/session-2.scope\n")
    assert own == {"": "/user.slice/user-1000.slice/session-2.scope"}
    assert mount.directory_of(own[""]) == Path(
        "/sys/fs/cgroup/user.slice/user-1000.slice/session-2.scope"
    )


def test_hybrid_hierarchy_maps_each_controller_to_its_mount() -> None:
    mounts = parse_mounts(HYBRID)
    by_controller = {c: m for m in mounts for c in m.controllers}
    assert set(by_controller) == {"cpu", "pids", "memory"}
    assert str(by_controller["cpu"].mountpoint) == "/sys/fs/cgroup/cpu,cpuacct"
    own = parse_own_cgroups("5:memory:/process_api/x\n2:cpu,cpuacct:/\n0::/\n")
    assert own["memory"] == "/process_api/x"
    assert own["cpu"] == own["cpuacct"] == "/"
    assert by_controller["memory"].directory_of(own["memory"]) == Path(
        "/sys/fs/cgroup/memory/process_api/x"
    )


def test_a_container_mount_rooted_at_its_own_group() -> None:
    (mount,) = parse_mounts(CONTAINER_V1)
    own = parse_own_cgroups("7:memory:/docker/abc123\n")
    assert mount.directory_of(own["memory"]) == Path("/sys/fs/cgroup/memory")


def test_mountinfo_escapes_are_decoded() -> None:
    (mount,) = parse_mounts("40 1 0:50 / /mnt/cg\\040v2 rw - cgroup2 none rw\n")
    assert str(mount.mountpoint) == "/mnt/cg v2"


@pytest.mark.parametrize(
    ("version", "files"),
    [
        (
            1,
            {
                "pids.max": "64\n",
                "memory.limit_in_bytes": "268435456\n",
                "memory.memsw.limit_in_bytes": "268435456\n",
                "cpu.cfs_period_us": "100000\n",
                "cpu.cfs_quota_us": "50000\n",
            },
        ),
        (
            2,
            {
                "pids.max": "64\n",
                "memory.max": "268435456\n",
                "memory.swap.max": "0\n",
                "cpu.max": "50000 100000\n",
            },
        ),
    ],
)
def test_limits_are_written_in_each_version_s_format(
    tmp_path: Path, version: int, files: dict[str, str]
) -> None:
    for name in files:  # the kernel creates these with the group; here we do
        (tmp_path / name).write_text("max\n")
    limits = CgroupLimits(max_processes=64, memory_bytes=256 << 20, cpu_cores=0.5)
    for controller in ("pids", "memory", "cpu"):
        write_limit(version, controller, tmp_path, limits)  # type: ignore[arg-type]
    assert {name: (tmp_path / name).read_text() for name in files} == files
