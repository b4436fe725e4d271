"""How busy this machine is right now, measured where a test needs it (every package's tests
import this one file by plain name: the root pytest settings' ``pythonpath`` and tools/ci.py's
``MYPYPATH`` put its folder on their path).

A wall-clock limit is stated for an idle CI machine and multiplied by ``slowdown()``: other jobs
and a busy hypervisor stretch it as they stretch the work, and a stall of several times the
limit still fails. A thread's own CPU time (``time.thread_time``) waits for no CPU, but a busy
host stretches it too: it is divided by ``slowdown(time.thread_time)`` taken right after.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

#: Seconds one round of the reference work takes on an idle CI machine (2.1 GHz Xeon, 2 cores).
IDLE_ROUND = 0.02


def slowdown(clock: Callable[[], float] = time.perf_counter) -> float:
    """How many times an idle machine's time five rounds of fixed pure-Python work take now
    (their median), at least 1: by the wall clock, waits for a CPU count."""
    taken = []
    for _ in range(5):
        start = clock()
        sum(i * i % 7 for i in range(300_000))
        taken.append(clock() - start)
    return max(1.0, statistics.median(taken) / IDLE_ROUND)


def run_delay() -> float:
    """This thread's time so far runnable but waiting for a CPU (the kernel's schedstat), in
    seconds; 0 where the kernel does not keep it."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as stat:
            return int(stat.read().split()[1]) / 1e9
    except OSError:
        return 0.0
