"""A uid of its own for each sandbox of a non-root caller: the caller's subordinate ids.

Without root, every sandbox used to run as the caller's own uid, so the kernel's per-user
quotas (inotify instances, message queues, keys, RLIMIT_NPROC) were shared by all of them and
by the caller: one sandbox holding 128 inotify instances broke inotify for the rest. Rootless
container engines answer this with subordinate ids: `/etc/subuid` and `/etc/subgid` grant a
user a range of host ids, and the setuid helpers `newuidmap`/`newgidmap` (package `uidmap`)
map them into a user namespace the user created.

Each sandbox leases one id of the range (the same offset in both ranges) and boots like this:

1. A small Python wrapper (`WRAPPER`, run with the host's interpreter) creates a user
   namespace, tells the host, and waits.
2. The host maps the namespace: inside uid 0 is the leased host id, inside uid 1 the caller
   (so that root of the namespace may reach the caller's files to stage the bind sources, as
   root does on the host: _stage.py). It attaches the wrapper to the sandbox's cgroups while
   it still runs as the caller (cgroup v1 refuses to move another user's process), then lets
   it go on.
3. The wrapper becomes uid 0 of its namespace, caps what the namespace may take of the
   caller's per-user kernel quotas (below), and executes the staging script, which executes
   bubblewrap, which nests the sandbox's own user namespace (uid 0 there is uid 0 here: the
   leased host id). The caller's uid is not mapped in the sandbox's namespace, and commands
   have no capabilities, so nothing inside can become it.

The caller still owns every namespace involved, so it keeps the right to signal and to end
the sandbox's processes. For the same reason the kernel charges the quotas it counts per user
namespace chain (inotify instances and watches, `fs.inotify.max_user_*`) to the caller, not to
the leased id: no unprivileged setup can change that. So the wrapper limits its namespace to a
share of them (`QUOTA_SHARE`); a sandbox that takes all it can leaves the rest to its neighbours
and the caller. Quotas counted per host uid (RLIMIT_NPROC, POSIX message queues) are the leased
id's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import shutil
from dataclasses import dataclass
from pathlib import Path

from sandbox._errors import SandboxBootError
from sandbox._local._uids import UidRange

# Runs as `python -I -S -c WRAPPER READY_FD GO_FD ARGV...`.
WRAPPER = """
import ctypes, os, sys
ready, go = int(sys.argv[1]), int(sys.argv[2])
if ctypes.CDLL(None, use_errno=True).unshare(0x10000000) != 0:  # CLONE_NEWUSER
    sys.exit(f"cannot create a user namespace: {os.strerror(ctypes.get_errno())}")
os.write(ready, b"1")
os.close(ready)
if os.read(go, 1) != b"1":
    sys.exit("the host did not map the user namespace")
os.close(go)
os.setgroups([])
os.setresgid(0, 0, 0)
os.setresuid(0, 0, 0)
for name, value in zip(("instances", "watches"), sys.argv[3:5]):
    with open(f"/proc/sys/user/max_inotify_{name}", "w") as limit:
        limit.write(value)
os.execvp(sys.argv[5], sys.argv[5:])
"""
QUOTA_SHARE = 8
"""Each sandbox may take this fraction of the caller's inotify instances and watches."""


@dataclass(frozen=True, slots=True)
class SubordinateIds:
    """The caller's subordinate uid and gid ranges, paired by offset, and the helpers."""

    uids: UidRange
    gid_first: int
    newuidmap: str
    newgidmap: str
    inotify_share: tuple[int, int]
    """(instances, watches) each sandbox's namespace may hold: a share of the caller's."""

    def gid_of(self, uid: int) -> int:
        return self.gid_first + (uid - self.uids.first)

    def wrapper_argv(self, python: str, ready: int, go: int) -> list[str]:
        """The wrapper's command line up to the command it executes."""
        instances, watches = self.inotify_share
        return [
            python,
            "-I",
            "-S",
            "-c",
            WRAPPER,
            str(ready),
            str(go),
            str(instances),
            str(watches),
        ]

    @classmethod
    def discover(cls) -> SubordinateIds | str:
        """The caller's ranges, or why there are none to use."""
        newuidmap, newgidmap = shutil.which("newuidmap"), shutil.which("newgidmap")
        if newuidmap is None or newgidmap is None:
            return "newuidmap/newgidmap not found (apt-get install uidmap)"
        uid = os.geteuid()
        names = {str(uid)}
        with contextlib.suppress(KeyError):
            names.add(pwd.getpwuid(uid).pw_name)
        ranges = [_range_in(Path(path), names) for path in ("/etc/subuid", "/etc/subgid")]
        if ranges[0] is None or ranges[1] is None:
            return f"no subordinate ids for uid {uid} in /etc/subuid and /etc/subgid"
        (uid_first, uid_count), (gid_first, gid_count) = ranges[0], ranges[1]
        uids = UidRange(uid_first, min(uid_count, gid_count))
        share = tuple(max(1, _sysctl(f"max_user_{name}") // QUOTA_SHARE) for name in _INOTIFY)
        return cls(uids, gid_first, newuidmap, newgidmap, (share[0], share[1]))

    async def map(self, pid: int, uid: int) -> None:
        """Map the wrapper's namespace: 0 -> the leased id, 1 -> the caller."""
        for helper, inside, caller in (
            (self.newuidmap, uid, os.geteuid()),
            (self.newgidmap, self.gid_of(uid), os.getegid()),
        ):
            process = await asyncio.create_subprocess_exec(
                helper,
                str(pid),
                "0",
                str(inside),
                "1",
                "1",
                str(caller),
                "1",
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
            )
            _, error = await process.communicate()
            if process.returncode != 0:
                raise SandboxBootError(
                    f"{Path(helper).name} failed: {error.decode(errors='replace').strip()}"
                )


_INOTIFY = ("instances", "watches")


def _sysctl(name: str) -> int:
    """The host's inotify limit `name` (the kernel's default where it cannot be read)."""
    try:
        return int(Path(f"/proc/sys/fs/inotify/{name}").read_text())
    except (OSError, ValueError):
        return 128 if name.endswith("instances") else 8192


def _range_in(path: Path, names: set[str]) -> tuple[int, int] | None:
    """The first range `path` grants one of `names` (a user name or a numeric uid)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.strip().split(":")
        if len(parts) == 3 and parts[0] in names and parts[1].isdigit() and parts[2].isdigit():
            first, count = int(parts[1]), int(parts[2])
            if first >= 1000 and count > 0:
                return first, count
    return None
