"""The escape suite: code inside a sandbox is the attacker; every attack here must fail.

Each test runs an attack from inside a real sandbox and checks its effect from the host, so a
test passes only if the host is really unharmed, not merely because a command printed an
error. CI runs this file as root and again as an unprivileged user (docs/isolation.md lists
the attacks and the layer that stops each).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import errno
import json
import os
import socket
import uuid
from collections.abc import AsyncIterator
from pathlib import Path, PurePosixPath

import pytest

from sandbox import (
    ForwardedEndpoint,
    GitWorkspace,
    LocalBackend,
    LocalSandbox,
    ReadOnlyBind,
    Sandbox,
    SandboxSpec,
    UnsupportedSpecError,
)
from sandbox._local._seccomp import DENYLIST

from .conftest import SUBORDINATE_IDS, git, local_config
from .host_processes import host_uid_of, unique_sleep, until_no_process, wait_for_process

AS_ROOT = os.geteuid() == 0


async def attack(box: Sandbox, script: str) -> str:
    """Run `script` inside; return its stdout, where each attack prints what it achieved."""
    result = await box.exec(script, timeout=30)
    assert not result.timed_out, f"attack hung:\n{script}"
    return result.stdout


# -- privileges -------------------------------------------------------------------------------


async def test_commands_have_no_capabilities_no_new_privileges_and_a_filter(
    box: LocalSandbox,
) -> None:
    status = dict(
        line.split(":\t", 1)
        for line in (await box.read_text("/proc/self/status")).splitlines()
        if ":\t" in line
    )
    for field in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(status[field], 16) == 0, field
    assert status["NoNewPrivs"].strip() == "1"
    assert status["Seccomp"].strip() == "2"  # filter mode
    # The same holds for a process several forks and execs down, and for a detached one.
    deep = await box.exec("bash -c 'sh -c \"grep -E ^CapEff /proc/self/status\"'")
    assert deep.stdout.split() == ["CapEff:", "0000000000000000"]
    detached = await box.start("grep -E '^(CapBnd|Seccomp):' /proc/self/status")
    assert (await detached.wait(timeout=10)).stdout.split() == [
        "CapBnd:",
        "0000000000000000",
        "Seccomp:",
        "2",
    ]


async def own_uids(backend: LocalBackend) -> bool:
    """Whether each sandbox of this backend gets a host uid of its own (root, or subordinate
    ids); where the tests were told it must, it must."""
    own = "one uid per sandbox" in (await backend.enforcement()).host_uid
    if SUBORDINATE_IDS:
        assert own, (await backend.enforcement()).host_uid
    return own


async def test_processes_run_as_an_unprivileged_host_uid(
    backend: LocalBackend, box: LocalSandbox
) -> None:
    marker = unique_sleep()
    await box.exec(f"sleep {marker} > /dev/null 2>&1 &")
    (pid,) = await wait_for_process(marker)
    uid = host_uid_of(pid)
    assert uid != 0
    assert uid == box.host_uid == host_uid_of(box.init_pid)
    assert (uid != os.geteuid()) == await own_uids(backend)
    assert (await box.exec("id -u")).stdout == "0\n"  # "root" inside owns nothing outside


async def test_each_sandbox_gets_its_own_uid(backend: LocalBackend) -> None:
    if not await own_uids(backend):
        pytest.skip("a non-root caller without subordinate ids can map only its own uid")
    boxes = await asyncio.gather(*(backend.create(SandboxSpec()) for _ in range(4)))
    try:
        uids = {box.host_uid for box in boxes if isinstance(box, LocalSandbox)}
        assert len(uids) == 4
        assert os.geteuid() not in uids
    finally:
        await asyncio.gather(*(box.close() for box in boxes))


async def test_a_sandbox_cannot_take_a_per_user_kernel_quota_from_its_neighbours(
    backend: LocalBackend,
) -> None:
    # inotify instances are counted per user (fs.inotify.max_user_instances, 128 here): with
    # one uid for all, one sandbox holding them all broke inotify for its neighbours and the
    # caller. Root's sandboxes each count for a uid of their own; a non-root caller's are
    # charged to the caller whatever their uid (it owns their user namespaces), so each may
    # take only a share.
    enforcement = await backend.enforcement()
    if not await own_uids(backend):
        assert any("quotas" in line for line in enforcement.fallbacks)
        pytest.skip("all sandboxes run as the caller here, as enforcement() says")
    hog = (
        "import ctypes, time\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "held = [fd for fd in iter(lambda: libc.inotify_init(), -1)]\n"
        "print(len(held), flush=True)\n"
        "time.sleep(60)\n"
    )
    probe = "import ctypes; print(ctypes.CDLL(None).inotify_init() >= 0)"
    async with (
        await backend.create(SandboxSpec()) as greedy,
        await backend.create(SandboxSpec()) as neighbour,
    ):
        process = await greedy.start(f"python3 -c '{hog}'")
        for _ in range(300):
            if process.stdout_path.read_text().strip():
                break
            await asyncio.sleep(0.1)
        taken = int(process.stdout_path.read_text())
        assert taken > 0
        if not AS_ROOT:
            assert any(f"may take {taken} " in line for line in enforcement.fallbacks)
        assert (await neighbour.exec(f'python3 -c "{probe}"')).stdout == "True\n"
        fd = ctypes.CDLL(None, use_errno=True).inotify_init()
        assert fd >= 0, "the caller lost inotify"
        os.close(fd)
        await process.kill()


async def test_without_subordinate_ids_sandboxes_run_as_the_caller(tmp_path: Path) -> None:
    backend = LocalBackend(local_config(tmp_path, subordinate_ids=False))
    async with await backend.create(SandboxSpec()) as box:
        assert isinstance(box, LocalSandbox)
        expected = os.geteuid() if not AS_ROOT else box.host_uid
        assert box.host_uid == expected == host_uid_of(box.init_pid)
        assert (await box.exec("id -u")).stdout == "0\n"


async def test_setuid_binaries_grant_nothing(box: LocalSandbox) -> None:
    out = await attack(box, "su -c 'echo ESCALATED'; su nobody -c 'echo SWITCHED'; echo done")
    assert out == "done\n"


async def test_pid_one_cannot_be_killed_read_or_traced(box: LocalSandbox) -> None:
    out = await attack(
        box,
        "kill -9 1; kill -INT 1; kill -TERM 1; "
        "cat /proc/1/environ; cat /proc/1/fd/3 </dev/null; "
        "python3 -c 'import ctypes; l = ctypes.CDLL(None, use_errno=True); "
        'print("ptrace", l.ptrace(16, 1, 0, 0), ctypes.get_errno())\'',
    )
    assert "ptrace -1 1" in out  # EPERM
    assert (await box.exec("echo alive")).stdout == "alive\n"  # init survived all of it


# -- the host's file system -------------------------------------------------------------------


@pytest.mark.parametrize("target", ["/usr", "/etc"])
async def test_read_only_host_directories_cannot_be_remounted_or_written(
    box: LocalSandbox, target: str
) -> None:
    planted = f"{target}/sandbox-escape-{uuid.uuid4().hex}"
    out = await attack(
        box,
        f"mount -o remount,bind,rw {target}; touch {planted}; "
        f"umount {target}; touch {planted}; echo x >> {target}/ld.so.preload",
    )
    assert not Path(planted).exists(), out
    assert (
        not Path("/etc/ld.so.preload").exists() or "x" not in Path("/etc/ld.so.preload").read_text()
    )


async def test_the_shadow_file_stays_hidden(box: LocalSandbox) -> None:
    out = await attack(box, "umount /etc/shadow; cat /etc/shadow; head -c 100 /etc/shadow")
    assert "root:" not in out


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("/proc/sys/vm/overcommit_ratio", "51"),
        ("/proc/sys/kernel/core_pattern", "|/tmp/sandbox-escape %p"),
        ("/proc/sys/kernel/hostname", "escaped"),
    ],
)
async def test_kernel_settings_cannot_be_changed(box: LocalSandbox, path: str, value: str) -> None:
    before = Path(path).read_text()
    out = await attack(box, f"echo '{value}' > {path}; mount -o remount,rw /proc/sys")
    assert Path(path).read_text() == before, out


async def test_kernel_memory_and_sysrq_are_out_of_reach(box: LocalSandbox) -> None:
    out = await attack(
        box,
        "echo h > /proc/sysrq-trigger && echo SYSRQ; "
        "head -c 16 /proc/kcore | wc -c; head -c 1 /proc/kallsyms | wc -c",
    )
    assert "SYSRQ" not in out
    assert out.split().count("0") >= 2, out  # nothing read from either file


async def test_the_source_object_store_cannot_be_written(
    backend: LocalBackend, tmp_path: Path
) -> None:
    repo = tmp_path / "source"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "a.txt").write_text("a\n")
    git(repo, "add", "a.txt")
    git(repo, "commit", "-qm", "a")
    objects = repo / ".git" / "objects"
    before = sorted(p.name for p in objects.rglob("*"))
    spec = SandboxSpec(workspace=GitWorkspace(repo, "HEAD"))
    async with await backend.create(spec) as box:
        out = await attack(
            box,
            f"touch {objects}/planted; mount -o remount,rw {objects}; "
            f"touch {objects}/planted; chmod -R u+w {objects}; "
            f"rm -rf {objects}/info; git gc --prune=now -q",
        )
    assert sorted(p.name for p in objects.rglob("*")) == before, out


async def test_host_files_outside_the_binds_are_invisible(
    box: LocalSandbox, tmp_path: Path
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret\n")
    home = Path.home()
    out = await attack(box, f"cat {secret}; ls {tmp_path} /sys /home /opt /srv")
    assert out == ""
    inside_home = (await box.exec(f"ls -A {home}")).stdout.split()
    assert not set(inside_home) & set(os.listdir(home))  # the sandbox's own home, empty
    await box.exec(f"mkdir -p {tmp_path} && echo planted > {secret}")
    assert secret.read_text() == "host secret\n"


async def test_sandboxes_cannot_see_each_other(backend: LocalBackend) -> None:
    marker = unique_sleep()
    async with (
        await backend.create(SandboxSpec()) as one,
        await backend.create(SandboxSpec()) as two,
    ):
        await one.exec(f"echo mine > /workspace/one.txt; echo t > /tmp/one; sleep {marker} &")
        out = await attack(two, f"ls /workspace /tmp; pgrep -f {marker}; ps -eo comm=")
        assert "one" not in out
        assert "sleep" not in out.split()


# -- namespaces, mounts and the system-call filter ----------------------------------------------


async def test_no_mounts_no_new_namespaces_no_nested_sandbox(box: LocalSandbox) -> None:
    out = await attack(
        box,
        "mkdir -p /tmp/m; mount -t tmpfs none /tmp/m && echo MOUNTED; "
        "unshare -Urm true && echo UNSHARED; unshare -U true && echo USERNS; "
        "bwrap --ro-bind / / true && echo NESTED",
    )
    for success in ("MOUNTED", "UNSHARED", "USERNS", "NESTED"):
        assert success not in out, out


_SYSCALL_PROBE = """
import ctypes, errno, json, sys
libc = ctypes.CDLL(None, use_errno=True)
out = {}
for name, number in json.loads(sys.argv[1]).items():
    ctypes.set_errno(0)
    result = libc.syscall(number, 0, 0, 0, 0, 0, 0)
    out[name] = [result, ctypes.get_errno()]
print(json.dumps(out))
"""

# System calls whose *unfiltered* outcome with zero arguments differs from the filter's errno,
# so the test tells the filter apart from the missing capabilities.
_PROBED = (
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "open_by_handle_at",
    "name_to_handle_at",
    "clone3",
    "io_uring_setup",
    "setns",
    "fsopen",
    "open_tree",
    "pidfd_getfd",
    "process_vm_readv",
    "process_vm_writev",
)


def _syscall_numbers(names: tuple[str, ...]) -> dict[str, int]:
    lib = ctypes.CDLL(ctypes.util.find_library("seccomp"))
    lib.seccomp_syscall_resolve_name.argtypes = (ctypes.c_char_p,)
    numbers = {name: lib.seccomp_syscall_resolve_name(name.encode()) for name in names}
    return {name: number for name, number in numbers.items() if number >= 0}


async def test_the_filter_refuses_each_denied_system_call(box: LocalSandbox) -> None:
    expected = {name: group.errno for group in DENYLIST for name in group.syscalls}
    numbers = _syscall_numbers(_PROBED)
    result = await box.exec(f"python3 -c '{_SYSCALL_PROBE}' '{json.dumps(numbers)}'")
    assert result.ok, result.stderr
    outcomes = json.loads(result.stdout)
    for name in numbers:
        assert outcomes[name] == [-1, expected[name]], name


STEAL_STDOUT = """
import ctypes, os, subprocess
libc = ctypes.CDLL(None, use_errno=True)
number = {"x86_64": 438, "aarch64": 438}[os.uname().machine]
child = subprocess.Popen(["sleep", "30"])  # a descendant: ptrace rules would let us take it
pidfd = os.pidfd_open(child.pid)
fd = libc.syscall(number, pidfd, 1, 0)
print(fd, ctypes.get_errno())
child.kill()
"""


async def test_a_command_cannot_take_another_process_descriptors(box: LocalSandbox) -> None:
    """The agent CLI's stdout is a host file: a tool call that took it (pidfd_getfd) could
    write to the host without bound. Taking even a child's stdout, which the kernel's ptrace
    rules alone would allow, is refused."""
    result = await box.exec(f"python3 -c '{STEAL_STDOUT}'; true")
    assert result.stdout.split() == ["-1", str(errno.EPERM)], result.stderr


async def test_a_command_holds_no_descriptor_but_its_own_three(box: LocalSandbox) -> None:
    """Whatever bwrap hands its child beyond init's control socket (the host's end of bwrap's
    info pipe, kept open so that bwrap outlives a killed owner) is closed by init: an
    inheritable descriptor would reach every command."""
    listed = await box.exec("ls /proc/$$/fd; true")  # the shell's own (not exec'd into ls)
    assert listed.stdout.split() == ["0", "1", "2"]


async def test_clone_with_a_namespace_flag_is_refused(box: LocalSandbox) -> None:
    clone_newuser = 0x10000000
    sigchld = 17
    script = (
        "import ctypes; l = ctypes.CDLL(None, use_errno=True); "
        f"r = l.syscall(56, {clone_newuser | sigchld}, 0, 0, 0, 0); "
        "import os; r == 0 and os._exit(0); print(r, ctypes.get_errno())"
    )
    result = await box.exec(f'python3 -c "{script}"')
    assert result.stdout.split() == ["-1", str(errno.EPERM)]


# -- processes, network and environment of the host ---------------------------------------------


async def test_host_processes_are_invisible_and_unsignalable(box: LocalSandbox) -> None:
    me = os.getpid()
    out = await attack(box, f"kill -0 {me} && echo SIGNALLED; ps -eo pid=,comm=")
    assert "SIGNALLED" not in out
    assert out.splitlines()[0].split()[1].startswith("python")  # pid 1 is our init
    assert "pytest" not in out
    os.kill(me, 0)  # and we are of course still here


@pytest.fixture
async def host_server() -> AsyncIterator[int]:
    """A host TCP service on loopback that the sandbox must not reach."""
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    async with server:
        yield server.sockets[0].getsockname()[1]


async def test_host_loopback_dns_and_routes_are_unreachable(
    backend: LocalBackend, host_server: int
) -> None:
    forwarded = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    forwarded_port = forwarded.sockets[0].getsockname()[1]
    spec = SandboxSpec(network=ForwardedEndpoint("127.0.0.1", forwarded_port, 8123))
    probe = "exec 3<>/dev/tcp/127.0.0.1/{port} && echo CONNECTED"
    async with forwarded, await backend.create(spec) as box:
        assert "CONNECTED" in await attack(box, probe.format(port=8123))
        for port in (host_server, forwarded_port, 22, 80):
            assert "CONNECTED" not in await attack(box, probe.format(port=port)), port
        out = await attack(
            box,
            "getent hosts pypi.org && echo RESOLVED; "
            "exec 3<>/dev/tcp/1.1.1.1/53 && echo OUTSIDE; "
            "grep -v '^Iface' /proc/net/route | wc -l; ls /sys/class/net 2>/dev/null",
        )
        assert "RESOLVED" not in out
        assert "OUTSIDE" not in out
        assert "0" in out.split()  # no routes at all


async def test_an_abstract_host_socket_is_unreachable(box: LocalSandbox) -> None:
    name = f"\0sandbox-escape-{uuid.uuid4().hex}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(name)
    listener.listen()
    try:
        script = (
            "import socket; s = socket.socket(socket.AF_UNIX); "
            f"s.connect({name!r}); print('CONNECTED')"
        )
        out = await attack(box, f'python3 -c "{script}"')
        assert "CONNECTED" not in out
    finally:
        listener.close()


async def test_of_the_source_only_its_objects_show_and_no_host_path(
    backend: LocalBackend, source_repo: tuple[Path, str], tmp_path: Path
) -> None:
    repo, base = source_repo
    git(repo, "remote", "add", "origin", "https://user:s3cret@example.invalid/repo.git")
    (repo / ".git" / "hooks" / "post-checkout").write_text("#!/bin/sh\necho hooked\n")
    async with await backend.create(SandboxSpec(workspace=GitWorkspace(repo, base))) as box:
        out = await attack(
            box,
            f"ls -A /run/sandbox/source; test -e {repo} && echo visible || echo absent; "
            "grep -rl s3cret / 2>/dev/null --exclude-dir=proc --exclude-dir=sys "
            "--exclude-dir=usr; git log --oneline --all | wc -l; "
            "sleep 2 & readlink /proc/$!/fd/0 /proc/$!/fd/1 /proc/$!/fd/2",
        )
        # the script's helpers get their stdin from the host: a sealed memory file, no path
        held = await box.run_python(
            "import os; print(os.readlink('/proc/self/fd/0'))", stdin=b"data", timeout=30
        )
    lines = out.splitlines()
    assert lines[:3] == ["HEAD", "objects", "refs"]  # no config, hooks, logs, refs
    assert lines[3] == "absent"  # the source at its host path
    assert "s3cret" not in out  # no file holds it
    assert lines[4] == "1"  # only HEAD's history
    assert str(tmp_path) not in "\n".join(lines[4:]) + held.stdout.decode()
    assert [line.split(":")[0] for line in lines[5:]] == ["/dev/null", "pipe", "pipe"]
    assert held.stdout.decode().startswith("/memfd:stdin")


async def test_a_host_socket_in_a_read_only_bind_is_refused(
    backend: LocalBackend, tmp_path: Path
) -> None:
    # A read-only mount does not stop connect(), and path sockets cross network namespaces:
    # bound, this service would answer commands inside (it did, banner and all).
    exported = tmp_path / "exported"
    (exported / "sub").mkdir(parents=True)
    (exported / "sub" / "data.txt").write_text("data\n")
    service = exported / "sub" / "service.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(service))
    listener.listen()
    spec = SandboxSpec(read_only_binds=(ReadOnlyBind(exported, PurePosixPath("/opt/exported")),))
    try:
        with pytest.raises(UnsupportedSpecError, match=r"service\.sock"):
            await backend.create(spec)
    finally:
        listener.close()
    service.unlink()
    async with await backend.create(spec) as box:
        assert (await box.exec("cat /opt/exported/sub/data.txt")).stdout == "data\n"


async def test_the_host_environment_does_not_leak(
    backend: LocalBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = f"sk-escape-{uuid.uuid4().hex}"
    monkeypatch.setenv("ANTHROPIC_API_KEY", secret)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    async with await backend.create(SandboxSpec()) as box:
        out = await attack(box, "env; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'")
    assert secret not in out


# -- nothing survives close -------------------------------------------------------------------


async def test_nothing_survives_close(backend: LocalBackend) -> None:
    box = await backend.create(SandboxSpec())
    assert isinstance(box, LocalSandbox)
    markers = [unique_sleep() for _ in range(4)]
    await box.exec(
        f"setsid sleep {markers[0]} </dev/null >/dev/null 2>&1 & "
        f"nohup sleep {markers[1]} </dev/null >/dev/null 2>&1 & "
        f"(setsid bash -c '(sleep {markers[2]} &)' &) ; "
        f"trap '' HUP TERM; bash -c 'trap \"\" TERM HUP; exec -a x{markers[3]} sleep 10000' "
        "</dev/null >/dev/null 2>&1 &"
    )
    for marker in markers:
        await wait_for_process(marker)
    state = box._state_dir
    await box.close()
    for marker in markers:
        await until_no_process(marker)
    assert not state.exists()
