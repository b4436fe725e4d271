"""`Sandbox.kill_all` and `Sandbox.run_python`: what the capture of an agent's change stands on.

kill_all must leave nothing of the agent's running, whatever it did to outlive its command;
run_python must run our script as written, whatever the agent left in the sandbox (rc files,
environment, modules, a fake interpreter).
"""

from __future__ import annotations

import asyncio
import json
import shlex

import pytest
from machine_load import slowdown

from sandbox import (
    KILLED_EXIT_CODE,
    LocalBackend,
    LocalSandbox,
    Sandbox,
    SandboxClosedError,
    SandboxSpec,
    ScriptResult,
)
from sandbox._local._bwrap import SANDBOX_HOME

from .host_processes import host_pids_with, unique_sleep, until_no_process, wait_for_process

# Every process of the sandbox but the `ps` pipeline asking, as "pid args" lines.
OTHERS = "ps -e -o pid=,args= | grep -v -e ' ps -e ' -e ' grep -v ' -e 'bash -lc ps -e '"


async def processes(box: Sandbox) -> list[str]:
    """The sandbox's processes besides init and the command listing them."""
    listing = await box.exec(OTHERS)
    lines = [line.strip() for line in listing.stdout.splitlines() if line.strip()]
    init = [line for line in lines if line.split()[0] == "1"]
    assert len(init) == 1, lines
    return [line for line in lines if line.split()[0] != "1"]


async def count_inside(box: Sandbox, marker: str, args: str | None = None) -> int:
    """Processes whose command line names `marker` (or is exactly `args`)."""
    found = [line.split(None, 1)[1] for line in await processes(box)]
    return sum(line == args if args is not None else marker in line for line in found)


async def until_counted(box: Sandbox, marker: str, count: int, args: str | None = None) -> None:
    for _ in range(500):
        if await count_inside(box, marker, args) >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"fewer than {count} processes with {marker!r} ever ran")


# -- kill_all ---------------------------------------------------------------------------------


async def test_kill_all_kills_every_kind_of_leftover_process(box: LocalSandbox) -> None:
    marker = unique_sleep()
    leftovers = f"""
sleep {marker} &                                              # a plain background job
setsid sleep {marker} > /dev/null 2>&1 < /dev/null &          # a daemon in its own session
nohup sleep {marker} > /dev/null 2>&1 &                       # immune to SIGHUP
( ( sleep {marker} > /dev/null 2>&1 < /dev/null & ) & )      # double-forked, orphaned to init
bash -c 'trap "" TERM HUP INT QUIT USR1 USR2; exec sleep {marker}' &  # ignores all it can
sleep {marker} & kill -STOP $!                                # stopped
for i in $(seq 50); do sleep {marker} & done                  # many children
setsid bash -c 'sleep {marker} & sleep {marker} & wait' > /dev/null 2>&1 < /dev/null &
"""
    assert (await box.exec(leftovers)).ok
    # 58 sleeps and the bash waiting for two of them (its command line names the marker)
    await until_counted(box, marker, 59)
    assert await count_inside(box, marker) == 59
    assert len(host_pids_with(marker)) == 59

    await box.kill_all()

    assert await processes(box) == []
    assert host_pids_with(marker) == []
    assert (await box.exec("echo still serving")).stdout == "still serving\n"
    assert (await box.exec(f"sleep {marker} & echo $!")).ok  # and it can start new ones


async def test_a_started_process_is_killed_with_137(box: LocalSandbox) -> None:
    marker = unique_sleep()
    process = await box.start(f"echo started; sleep {marker}")
    await wait_for_process(marker)
    running = asyncio.create_task(box.exec(f"sleep {marker}"))
    await until_counted(box, marker, 2, args=f"sleep {marker}")  # the started one's and ours

    await box.kill_all()

    result = await process.wait(timeout=10)
    assert (result.exit_code, result.timed_out, result.stdout) == (
        KILLED_EXIT_CODE,
        False,
        "started\n",
    )
    ran = await asyncio.wait_for(running, 10)
    assert (ran.exit_code, ran.timed_out) == (KILLED_EXIT_CODE, False)
    await until_no_process(marker)


async def test_kill_all_stops_a_process_forking_as_fast_as_it_can(
    backend: LocalBackend,
) -> None:
    marker = unique_sleep()
    async with await backend.create(SandboxSpec()) as box:
        await box.start(f"while :; do sleep {marker} & sleep {marker} & done")
        for _ in range(500):
            if len(host_pids_with(marker)) >= 100:
                break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError("the fork loop never got going")
        await box.kill_all()
        assert await processes(box) == []
        assert host_pids_with(marker) == []
        assert (await box.exec("echo alive")).stdout == "alive\n"


async def test_kill_all_with_nothing_running_and_after_close(box: LocalSandbox) -> None:
    await box.kill_all()
    await box.kill_all()
    assert await processes(box) == []
    await box.close()
    with pytest.raises(SandboxClosedError):
        await box.kill_all()


# -- run_python -------------------------------------------------------------------------------


async def run(box: Sandbox, script: str, *args: str) -> ScriptResult:
    result = await box.run_python(script, args, timeout=30)
    assert result.ok, result
    return result


ENV_REPORT = """
import json, os, sys
print(json.dumps({
    "env": dict(os.environ),
    "isolated": sys.flags.isolated,
    "no_site": sys.flags.no_site,
    "ignore_environment": sys.flags.ignore_environment,
    "cwd": os.getcwd(),
    "argv": sys.argv,
    "path": sys.path,
    "executable": sys.executable,
    "modules": sorted(name for name in sys.modules if "custom" in name or name == "site"),
}))
"""


async def test_run_python_gets_only_its_environment_isolated_in_root(
    backend: LocalBackend,
) -> None:
    env = {"FOO": "bar", "PYTHONPATH": "/workspace", "PYTHONHOME": "/nowhere", "PATH": "/evil"}
    async with await backend.create(SandboxSpec(env=env)) as box:
        report = json.loads((await run(box, ENV_REPORT, "a b", "$(touch /tmp/x)", "é")).stdout)
        assert (await box.exec("test -e /tmp/x")).exit_code == 1  # no shell saw the argument
    executable = report["executable"]
    mounted = not executable.startswith("/usr/")
    expected = {"PATH", "LC_ALL"} | ({"LD_LIBRARY_PATH"} if mounted else set())
    assert set(report["env"]) == expected
    assert "/evil" not in report["env"]["PATH"].split(":")
    assert "/usr/bin" in report["env"]["PATH"].split(":")
    assert (report["isolated"], report["no_site"], report["ignore_environment"]) == (1, 1, 1)
    assert report["cwd"] == "/"
    assert report["argv"] == ["-c", "a b", "$(touch /tmp/x)", "é"]
    assert "" not in report["path"]
    assert not any(entry.startswith(("/workspace", "/root", "/tmp")) for entry in report["path"])
    assert report["modules"] == []


PLANT = r"""set -e
marker() { printf 'import os\nopen("/tmp/pwned-%s", "w").close()\n' "$1"; }
for dir in /workspace $HOME /tmp $HOME/.local/lib/python3.11/site-packages; do
    mkdir -p "$dir"
    marker sitecustomize > "$dir/sitecustomize.py"
    marker usercustomize > "$dir/usercustomize.py"
    marker json > "$dir/json.py"
    marker hashlib > "$dir/hashlib.py"
done
echo 'printf x > /tmp/pwned-bashrc' > ~/.bashrc
echo 'export PATH=$HOME/bin:$PATH; printf x > /tmp/pwned-profile' > ~/.bash_profile
cp ~/.bash_profile ~/.profile
mkdir -p $HOME/bin
printf '#!/bin/sh\nprintf x > /tmp/pwned-fake-python\n' > $HOME/bin/python3
chmod +x $HOME/bin/python3
"""


async def test_run_python_ignores_what_the_agent_planted(backend: LocalBackend) -> None:
    env = {
        "PYTHONPATH": "/workspace",
        "PYTHONSTARTUP": "/workspace/json.py",
        "PYTHONUSERBASE": f"{SANDBOX_HOME}/.local",
        "BASH_ENV": f"{SANDBOX_HOME}/.bashrc",
        "PATH": f"{SANDBOX_HOME}/bin:/usr/local/bin:/usr/bin:/bin",
    }
    async with await backend.create(SandboxSpec(env=env)) as box:
        assert (await box.exec(PLANT)).ok
        # The bait works on the agent's own commands: its shells and pythons run it.
        assert (await box.exec("python3 -c pass; /usr/bin/python3 -c 'import json'")).ok
        bitten = await box.exec("ls /tmp | grep pwned- | sort")
        assert bitten.stdout.split() == [
            "pwned-bashrc",
            "pwned-fake-python",
            "pwned-json",
            "pwned-profile",
            "pwned-sitecustomize",
            "pwned-usercustomize",
        ]
        assert (await box.exec("rm -f /tmp/pwned-*")).ok
        # (rm ran through bash -lc, which recreated the profile's marker: clear it without bash)
        await run(box, "import glob, os\nfor f in glob.glob('/tmp/pwned-*'): os.remove(f)")

        result = await run(
            box,
            "import json, hashlib, os\n"
            "bitten = sorted(f for f in os.listdir('/tmp') if f.startswith('pwned-'))\n"
            "print(json.dumps([json.__file__, hashlib.__file__, bitten]))",
        )
    json_file, hashlib_file, bitten_now = json.loads(result.stdout)
    assert bitten_now == []  # nothing of the agent's ran: no rc file, no module, no fake python
    for module in (json_file, hashlib_file):
        assert not module.startswith(("/workspace", "/root", "/tmp", "/json", "/hashlib"))


async def test_run_python_passes_stdin_and_binary_stdout(box: LocalSandbox) -> None:
    data = bytes(range(256)) * 1000
    echoed = await box.run_python(
        "import sys; sys.stdout.buffer.write(sys.stdin.buffer.read()[::-1])", stdin=data
    )
    assert (echoed.exit_code, echoed.stdout, echoed.truncated) == (0, data[::-1], False)
    written = await box.run_python("import sys; sys.stdout.buffer.write(bytes(range(256)))")
    assert written.stdout == bytes(range(256))


async def test_run_python_reports_exit_code_and_stderr(box: LocalSandbox) -> None:
    result = await box.run_python("import sys; print('out'); sys.exit('it failed: \\xe9')")
    assert (result.exit_code, result.stdout, result.stderr, result.timed_out) == (
        1,
        b"out\n",
        "it failed: é\n",
        False,
    )
    assert not result.ok


async def test_run_python_truncates_its_output_at_the_bound(box: LocalSandbox) -> None:
    script = "import sys; sys.stdout.buffer.write(bytes(range(256)) * 4)"
    over = await box.run_python(script, max_output_bytes=100)
    assert (over.exit_code, over.stdout, over.truncated, over.ok) == (
        0,
        bytes(range(100)),
        True,
        False,
    )
    exact = await box.run_python(script, max_output_bytes=1024)
    assert (exact.stdout, exact.truncated, exact.ok) == (bytes(range(256)) * 4, False, True)


async def test_run_python_times_out(box: LocalSandbox) -> None:
    marker = unique_sleep()
    script = (
        f"import subprocess; print('before', flush=True); subprocess.run(['sleep', '{marker}'])"
    )
    result = await box.run_python(script, timeout=0.5)
    assert (result.exit_code, result.timed_out, result.stdout) == (
        KILLED_EXIT_CODE,
        True,
        b"before\n",
    )
    assert 0.5 <= result.duration < 0.5 + 4.5 * slowdown()
    await until_no_process(marker)
    assert (await box.run_python("print(1)")).stdout == b"1\n"


async def test_run_python_on_a_closed_sandbox(backend: LocalBackend) -> None:
    box = await backend.create(SandboxSpec())
    await box.close()
    with pytest.raises(SandboxClosedError):
        await box.run_python("print(1)")


# Renames the lowest directory above `path` that is not a mount point itself (a mount point
# cannot be renamed; a directory holding one can), then plants a fake program at `path`.
SWAP = r"""
target=$1; dir=$(dirname "$target")
while [ "$dir" != / ]; do
    if mv "$dir" "$dir.moved" 2>/dev/null; then
        mkdir -p "$(dirname "$target")"
        printf '#!/bin/sh\necho fake >> /tmp/fake-ran\nprintf "%%s" "not python"\n' > "$target"
        chmod +x "$target"
        echo "swapped $dir"
        exit 0
    fi
    dir=$(dirname "$dir")
done
echo "nothing could be moved"
"""


async def test_run_python_interpreter_cannot_be_swapped(box: LocalSandbox) -> None:
    executable = (await run(box, "import sys; print(sys.executable)")).stdout.decode().strip()
    swap = await box.exec(f"bash -c {shlex.quote(SWAP)} swap {shlex.quote(executable)}")
    assert swap.ok, swap.stderr
    result = await box.run_python("print('real python')", timeout=30)
    fake_ran = await box.exec("test -e /tmp/fake-ran")
    assert (result.stdout, fake_ran.exit_code) == (b"real python\n", 1), swap.stdout
