"""The demo as a real child process: it runs end to end, and it stops cleanly when told to.

`swe-rl` runs here exactly as the README's first command runs it. The test process is a child
subreaper, so any process the run lets go of comes back to it and is counted; the child gets a
private TMPDIR, where the sandboxes keep their state, so leftovers are visible too.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from machine_load import slowdown

APP = Path(__file__).resolve().parents[1]
_PR_SET_CHILD_SUBREAPER = 36


def our_children() -> dict[int, str]:
    """pid -> "state command" of every process whose parent is this test process."""
    me = str(os.getpid())
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text()
                command = stat[stat.index("(") + 1 : stat.rindex(")")]
                fields = stat.rsplit(")", 1)[1].split()
                if fields[1] == me:
                    found[int(entry.name)] = f"{fields[0]} {command}"
    return found


@pytest.fixture
def subreaper() -> Iterator[None]:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    try:
        yield
    finally:
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        for pid in our_children():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)


def start_demo(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[str], Path, Path]:
    out = tmp_path / "run"
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    child = subprocess.Popen(
        [sys.executable, str(APP), "--out", str(out), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "TMPDIR": str(scratch), "COLUMNS": "120"},
    )
    return child, out, scratch


def leftovers(scratch: Path) -> list[str]:
    return sorted(p.name for p in scratch.iterdir() if p.name.startswith("sandbox-4"))


def wait_for_samples(out: Path, child: subprocess.Popen[str], at_least: int) -> None:
    samples = out / "samples.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise AssertionError(f"the demo ended early:\n{child.communicate()[0]}")
        if samples.exists() and len(samples.read_text().splitlines()) >= at_least:
            return
        time.sleep(0.1)
    raise AssertionError("no episode finished within 120 s")


def orphans_alive(timeout: float = 5.0) -> dict[int, str]:
    """Processes handed to us (the subreaper) that are still alive after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        alive = {pid: s for pid, s in our_children().items() if not s.startswith("Z ")}
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


@pytest.mark.slow
def test_the_demo_runs_end_to_end_and_leaves_nothing(tmp_path: Path, subreaper: None) -> None:
    child, out, scratch = start_demo(tmp_path, "-k", "2", "--concurrency", "3")
    output, _ = child.communicate(timeout=300)
    assert child.returncode == 0, output
    assert "The policy is SCRIPTED" in output
    # Piped, as here: no live bar, so a line says what is going on at each step.
    assert "building the Qwen3 tokenizer" in output
    assert "running 6 episodes, 3 at a time" in output
    assert [line.split(":")[0] for line in output.splitlines() if " finished: " in line] == [
        f"episode {n}/6 finished" for n in range(1, 7)
    ]
    # The table names the files grading refused (the scripted cheats rewrite the tests), and
    # says what the masked tokens are.
    assert "refused test_" in output
    assert "system prompt and tool schemas" in output
    run = json.loads((out / "run.json").read_text())
    episodes = run["episodes"]
    assert len(episodes) == 6
    assert {e["status"] for e in episodes} == {"completed"}
    assert {e["reward"] for e in episodes} == {0.0, 1.0}
    assert all(e["advantage"] != 0 for e in episodes)
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(samples) >= 6
    for sample in samples:
        assert len(sample["loss_mask"]) == sample["response_length"]
        assert len(sample["rollout_log_probs"]) == sample["response_length"]
        assert sample["rollout_id"] is not None
    for episode in episodes:
        assert (out / episode["dir"] / "tree.json").is_file()
    assert (out / "viewer.html").stat().st_size > 10_000
    assert our_children() == {}  # nothing orphaned, nothing left unreaped
    assert leftovers(scratch) == []


@pytest.mark.slow
def test_sigterm_finishes_what_it_can_and_exits_clean(tmp_path: Path, subreaper: None) -> None:
    child, out, scratch = start_demo(tmp_path, "-k", "4", "--concurrency", "2")
    wait_for_samples(out, child, at_least=1)
    child.send_signal(signal.SIGTERM)
    started = time.monotonic()
    output, _ = child.communicate(timeout=120)  # a hang; how quick it was is checked next
    assert time.monotonic() - started < 10 * slowdown(), output
    assert child.returncode == 130, output
    run = json.loads((out / "run.json").read_text())
    assert run["interrupted"] is True
    reasons = [e["reason"] for e in run["episodes"]]
    assert "interrupted" in reasons
    finished = [e for e in run["episodes"] if e["status"] == "completed"]
    assert finished
    # The stopped episodes are no silent failure: no alarm; the run says it was interrupted.
    assert run["alarms"] == []
    assert run["gates"]["zero_trainable"]["episodes"] == len(reasons) - reasons.count("interrupted")
    assert "interrupted: " in output
    written = {
        json.loads(line)["index"] for line in (out / "samples.jsonl").read_text().splitlines()
    }
    assert {e["index"] for e in finished} <= written
    # A launcher killed mid-create can hand its already-exited helpers (a `mount` of the
    # staging step) to the subreaper as zombies: ours to reap, not a leak. Nothing may live.
    assert orphans_alive() == {}
    assert leftovers(scratch) == []


@pytest.mark.slow
@pytest.mark.parametrize("how", ["second signal", "SIGKILL"])
def test_a_hard_stop_kills_every_sandbox_and_the_next_run_sweeps(
    tmp_path: Path, subreaper: None, how: str
) -> None:
    child, out, scratch = start_demo(tmp_path, "-k", "4", "--concurrency", "3")
    wait_for_samples(out, child, at_least=1)
    time.sleep(0.5)  # episodes are mid-flight
    if how == "SIGKILL":
        child.kill()
    else:
        child.send_signal(signal.SIGTERM)
        child.send_signal(signal.SIGTERM)
    started = time.monotonic()
    child.communicate(timeout=120)  # a hang; how quick it was is checked next
    assert time.monotonic() - started < 5 * slowdown()
    assert orphans_alive() == {}  # every sandbox died with its owner
    sweep = (
        "import asyncio, pathlib, sys\n"
        "from sandbox import LocalBackend, LocalConfig\n"
        "backend = LocalBackend(LocalConfig(state_root=pathlib.Path(sys.argv[1])))\n"
        "asyncio.run(backend.enforcement())\n"
    )
    subprocess.run([sys.executable, "-c", sweep, str(scratch)], check=True, timeout=60)
    assert leftovers(scratch) == []
