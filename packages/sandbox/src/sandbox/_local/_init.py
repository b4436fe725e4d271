"""The sandbox's pid 1: starts commands when the host asks and reports when they exit.

This file runs *inside* a local sandbox (the host copies it in read-only and starts it as
bubblewrap's payload), so it imports nothing but the standard library and never the `sandbox`
package. Being pid 1 is the point: bubblewrap drops every capability, sets no_new_privs and
installs the seccomp filter right before starting it, and every process of the sandbox
descends from it, so those restrictions hold for every command without exception. Nothing
ever enters the sandbox's namespaces from outside.

It talks to the host over one SOCK_SEQPACKET socket inherited at start (one datagram per
message, JSON, file descriptors attached with SCM_RIGHTS). The socket has no name in any file
system, and pid 1 makes itself non-dumpable, so sandboxed code can neither connect to it nor
take it from /proc/1/fd. Signals from inside the pid namespace cannot kill pid 1 either: the
kernel drops them unless pid 1 handles them, and it handles only SIGCHLD.

Host -> init:
  {"op": "spawn", "id": N, "argv": [...], "env": {...}, "cwd": "..."}
      + fds stdin, stdout, stderr   -> {"id": N, "pid": P} or {"id": N, "error": "..."}
      A body too large for one datagram comes as {"op": "spawn", "id": N, "body": true}
      with the JSON in a fourth fd.
  {"op": "signal", "pid": P, "sig": S}     (no reply) signal the process group P leads,
      only while P is a command we started and have not reaped.
  {"op": "listen", "id": N, "port": PORT}  -> {"id": N} + the listening TCP socket, bound
      to 127.0.0.1:PORT inside the sandbox's network namespace, for the host to serve.
  {"op": "killall", "id": N, "timeout": S} -> {"id": N, "remaining": K} once every other
      process of the sandbox is gone (K = 0), or S seconds passed. SIGKILL to pid -1 reaches
      every process of the pid namespace but init, daemons that left their session included,
      and a fork racing it either finishes before (its child is signalled too) or fails.
Init -> host:
  {"ev": "ready"} once, then {"ev": "exit", "pid": P, "returncode": R, "full": [...],
  "rlimit_kills": {...}} for each command (R as in subprocess: negative for a signal). "full"
  names the size limits whose tmpfs had less than FULL_BYTES free when the command ended;
  "rlimit_kills" counts, since init started, the other processes it reaped (orphans) that died
  of SIGXCPU or SIGXFSZ, by limit. The host closing its end ends the sandbox.
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import json
import os
import resource
import selectors
import signal
import socket
import sys
import time

MAX_DATAGRAM = 60 * 1024
MAX_FDS = 4
_FD_BYTES = array.array("i").itemsize
ANCILLARY_SPACE = socket.CMSG_SPACE(MAX_FDS * _FD_BYTES)
_PR_SET_DUMPABLE = 4
# Python ignores these itself; ignored dispositions survive exec, so commands get defaults.
_RESET_IN_CHILD = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGCHLD)
FULL_BYTES = 1 << 20
"""A tmpfs with less room than this is reported full: a write got ENOSPC, or was about to."""
_RLIMIT_SIGNALS = {int(signal.SIGXCPU): "cpu_seconds", int(signal.SIGXFSZ): "max_file_size_bytes"}


class Init:
    def __init__(self, control: socket.socket, tmpfs: list[tuple[str, str]]) -> None:
        self.control = control
        self.running: set[int] = set()
        self.tmpfs = tmpfs
        """(mount point, the ResourceLimits field that sizes it)"""
        self.rlimit_kills = dict.fromkeys(_RLIMIT_SIGNALS.values(), 0)

    def send(self, message: dict[str, object], fds: tuple[int, ...] = ()) -> None:
        data = json.dumps(message).encode()
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        self.control.sendmsg([data], ancillary)

    def serve(self) -> None:
        wake_read, wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_write)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        selector = selectors.DefaultSelector()
        selector.register(self.control, selectors.EVENT_READ, "control")
        selector.register(wake_read, selectors.EVENT_READ, "children")
        self.send({"ev": "ready"})
        while True:
            for key, _ in selector.select():
                if key.data == "children":
                    while True:
                        try:
                            if not os.read(wake_read, 4096):
                                break
                        except BlockingIOError:
                            break
                    self.reap()
                else:
                    self.receive()

    def receive(self) -> None:
        try:
            data, ancillary, flags, _ = self.control.recvmsg(
                MAX_DATAGRAM, ANCILLARY_SPACE, socket.MSG_DONTWAIT
            )
        except BlockingIOError:
            return
        except OSError:
            os._exit(0)
        if not data:  # the host closed its end: the sandbox is over
            os._exit(0)
        fds = received_fds(ancillary)
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            os._exit(70)  # a host-side bug; dying ends the sandbox loudly
        try:
            self.handle(json.loads(data), fds)
        finally:
            for fd in fds:
                os.close(fd)

    def handle(self, message: dict[str, object], fds: list[int]) -> None:
        op = message.get("op")
        if op == "spawn":
            if message.get("body"):
                message = {**json.loads(_read_all(fds.pop())), "id": message["id"]}
            self.spawn(message, fds)
        elif op == "signal":
            pid = int(str(message["pid"]))
            if pid in self.running:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, int(str(message["sig"])))
        elif op == "listen":
            self.listen(message)
        elif op == "killall":
            self.kill_all(message)

    def spawn(self, message: dict[str, object], fds: list[int]) -> None:
        request = message["id"]
        argv_in, env_in = message["argv"], message["env"]
        assert isinstance(argv_in, list)
        assert isinstance(env_in, dict)
        argv = [str(part) for part in argv_in]
        env = {str(key): str(value) for key, value in env_in.items()}
        cwd = str(message["cwd"])
        if len(fds) != 3:
            self.send({"id": request, "error": "spawn needs stdin, stdout and stderr"})
            return
        report_read, report_write = os.pipe()
        pid = os.fork()
        if pid == 0:
            _become(argv, env, cwd, fds, report_write)
        os.close(report_write)
        failure = _read_all(report_read)
        if failure:
            self.send({"id": request, "error": failure.decode(errors="replace")})
            return  # the child exits 127 and is reaped untracked
        self.running.add(pid)
        self.send({"id": request, "pid": pid})

    def listen(self, message: dict[str, object]) -> None:
        request = message["id"]
        try:
            server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind(("127.0.0.1", int(str(message["port"]))))
            server.listen(1024)
        except OSError as error:
            self.send({"id": request, "error": f"cannot listen: {error}"})
            return
        with server:
            self.send({"id": request}, (server.fileno(),))

    def kill_all(self, message: dict[str, object]) -> None:
        """SIGKILL every other process until none is left (zombies reaped as they appear).

        Blocks init for as long as the processes take to die (milliseconds; a process in
        uninterruptible sleep dies when it wakes), bounded by the request's timeout."""
        deadline = time.monotonic() + float(str(message.get("timeout", 10.0)))
        while True:
            try:
                os.kill(-1, signal.SIGKILL)
            except ProcessLookupError:  # nothing but init is left
                self.reap()
                self.send({"id": message["id"], "remaining": 0})
                return
            self.reap()
            if time.monotonic() > deadline:
                self.send({"id": message["id"], "remaining": _other_processes()})
                return
            time.sleep(0.002)

    def reap(self) -> None:
        """Reap every child that has exited, then report the commands among them (orphans
        adopted by pid 1 are only counted when a limit's signal killed them)."""
        exited: list[tuple[int, int]] = []
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            code = os.waitstatus_to_exitcode(status)
            if pid in self.running:
                self.running.discard(pid)
                exited.append((pid, code))
            elif (limit := _RLIMIT_SIGNALS.get(-code)) is not None:
                self.rlimit_kills[limit] += 1
        if exited:
            full = self.full()
            for pid, code in exited:
                self.send(
                    {
                        "ev": "exit",
                        "pid": pid,
                        "returncode": code,
                        "full": full,
                        "rlimit_kills": self.rlimit_kills,
                    }
                )

    def full(self) -> list[str]:
        """The size limits whose file system is (nearly) full now."""
        full = []
        for path, limit in self.tmpfs:
            try:
                usage = os.statvfs(path)
            except OSError:
                continue
            if usage.f_bavail * usage.f_frsize < FULL_BYTES and limit not in full:
                full.append(limit)
        return full


def _become(argv: list[str], env: dict[str, str], cwd: str, fds: list[int], report: int) -> None:
    """In the forked child: become the command, or report why not and exit 127."""
    try:
        signal.set_wakeup_fd(-1)
        for signum in _RESET_IN_CHILD:
            signal.signal(signum, signal.SIG_DFL)
        os.setsid()
        # First in line for the OOM killer: when the sandbox's memory runs out (its tmpfs files
        # count), a command dies and reports the limit, not init and the sandbox with it.
        if os.getuid() != 0:
            # As an image's user, uid 0 is not mapped: /proc/self of a non-dumpable process
            # (forked from init) belongs to nobody we are. execve makes it dumpable anyway.
            ctypes.CDLL(None).prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)
        with open("/proc/self/oom_score_adj", "w") as adj:
            adj.write("1000")
        os.chdir(cwd)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        os.execve(argv[0], argv, env)
    except BaseException as error:
        os.write(report, f"cannot start {argv[0]} in {cwd}: {error}".encode()[:4000])
    finally:
        os._exit(127)


def received_fds(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    """File descriptors passed with SCM_RIGHTS, made non-inheritable."""
    fds: list[int] = []
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(data) - len(data) % _FD_BYTES
            fds.extend(array.array("i", data[:usable]))
    for fd in fds:
        os.set_inheritable(fd, False)
    return fds


def _other_processes() -> int:
    """Processes of this pid namespace besides init (the sandbox's own /proc)."""
    return sum(name.isdigit() and name != "1" for name in os.listdir("/proc"))


def _read_all(fd: int) -> bytes:
    chunks = []
    try:
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def _lower_limit(kind: int, value: int) -> None:
    """Set the limit to `value`, or keep the host's where it is already lower.

    CPU time gets a hard limit a second above the soft one: the soft limit sends SIGXCPU
    (which says why), the hard one SIGKILL for a process that ignores it.
    """
    _, host_hard = resource.getrlimit(kind)
    hard = value + 1 if kind == resource.RLIMIT_CPU else value
    if host_hard != resource.RLIM_INFINITY:
        value, hard = min(value, host_hard), min(hard, host_hard)
    resource.setrlimit(kind, (value, hard))


def main() -> None:
    control_fd = int(sys.argv[1])
    config = json.loads(sys.argv[2])
    os.set_inheritable(control_fd, False)
    # Whatever else bwrap passed on (the host's end of its info pipe) is not the sandbox's:
    # an inheritable fd would reach every command.
    os.closerange(3, control_fd)
    _, most = resource.getrlimit(resource.RLIMIT_NOFILE)
    os.closerange(control_fd + 1, 1 << 20 if most == resource.RLIM_INFINITY else most)
    # Non-dumpable: no /proc/1/{fd,mem,environ} and no ptrace for the sandbox's processes.
    ctypes.CDLL(None).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    for name, value in config.get("rlimits", []):
        _lower_limit(getattr(resource, name), value)
    control = socket.socket(fileno=control_fd)
    control.setblocking(True)
    Init(control, [(str(path), str(limit)) for path, limit in config.get("tmpfs", [])]).serve()


if __name__ == "__main__":
    main()
