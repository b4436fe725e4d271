"""Who owns a sandbox's leftovers, so a later run can sweep what a killed run left behind.

Names of state directories and cgroups embed an owner tag: the pid namespace, pid and start
time of the process that made them. A leftover is stale when its owner lived in our pid
namespace and that exact process (pid and start time together, so a reused pid does not count)
is gone. Leftovers of other pid namespaces (another container sharing the directory) are never
touched: their pids mean nothing here.
"""

from __future__ import annotations

import os
import re
from functools import cache
from pathlib import Path

_TAG = re.compile(r"(?P<ns>\d+)-(?P<pid>\d+)-(?P<start>\d+)-")


@cache
def _pid_namespace() -> int:
    return os.stat("/proc/self/ns/pid").st_ino


def _start_time(pid: int) -> int | None:
    """Start time of `pid` in clock ticks since boot, or None if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def owner_tag() -> str:
    """This process's tag, followed by "-" (callers append a unique suffix)."""
    pid = os.getpid()
    return f"{_pid_namespace()}-{pid}-{_start_time(pid)}-"


def is_stale(name: str) -> bool:
    """True if `name` (after any prefix) carries an owner tag of a dead process of ours."""
    match = _TAG.search(name)
    if match is None or int(match["ns"]) != _pid_namespace():
        return False
    return _start_time(int(match["pid"])) != int(match["start"])
