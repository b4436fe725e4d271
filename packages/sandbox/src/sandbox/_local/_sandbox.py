"""A running bubblewrap sandbox: every command is started, waited for and killed by its init.

How one comes to be (bwrap, init, the control channel) is _boot.py; its live parts and their
teardown are _booted.py's `Booted`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from sandbox._local._booted import Booted
from sandbox._local._bwrap import SANDBOX_WORKSPACE
from sandbox._local._cgroups import Counters
from sandbox._local._commands import CommandSandbox, Launched
from sandbox._local._control import InitGoneError
from sandbox._local._forward import HostRelay, RelayBudget

_KILL_ALL_S = 10.0


class LocalSandbox(CommandSandbox):
    """A running bubblewrap sandbox. Create it with `LocalBackend.create`."""

    def __init__(
        self,
        *,
        boot: Booted,
        env: Mapping[str, str],
        keep_state: bool,
        python: tuple[Sequence[str], Mapping[str, str]],
        base_repository: str | None,
        max_output_bytes: int | None,
        source_repository: Path | None = None,
        workspace: str = SANDBOX_WORKSPACE,
        host_programs: Mapping[str, Sequence[str]] | None = None,
        git_argv: Sequence[str] = ("git",),
    ) -> None:
        super().__init__(
            state_dir=boot.state_dir,
            workspace=workspace,
            env=env,
            keep_state=keep_state,
            max_output_bytes=max_output_bytes,
            host_programs=host_programs,
            git_argv=git_argv,
        )
        self._boot = boot
        self._python_inside = python
        self._base_repository = base_repository
        self._source_repository = source_repository
        self._relay: HostRelay | None = None
        self._endpoint_url: str | None = None

    @property
    def endpoint_url(self) -> str | None:
        return self._endpoint_url

    @property
    def isolated(self) -> bool:
        return True

    @property
    def host_uid(self) -> int:
        """The unprivileged host uid every process of this sandbox runs as."""
        return self._boot.host_uid

    @property
    def init_pid(self) -> int:
        """Host pid of the sandbox's pid 1 (our init)."""
        return self._boot.init_pid

    async def _launch(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str,
        stdio: tuple[int, int, int],
    ) -> Launched:
        try:
            pid = await self._boot.channel.spawn(argv, env, cwd, stdio)
        except InitGoneError as gone:
            raise self._boot.why_gone(gone) from gone
        return _InitProcess(self._boot, pid)

    @property
    def base_repository(self) -> str | None:
        return self._base_repository

    @property
    def source_repository(self) -> Path | None:
        return self._source_repository

    def _python(self) -> tuple[Sequence[str], Mapping[str, str]]:
        return self._python_inside

    async def _kill_all(self) -> int:
        return await self._boot.channel.kill_all(_KILL_ALL_S)

    async def _forward(
        self,
        inside_port: int,
        host: str,
        port: int,
        max_connections: int | None,
        budget: RelayBudget,
    ) -> None:
        listener = await self._boot.channel.listen(inside_port)
        self._relay = HostRelay(
            listener, host, port, max_connections=max_connections, budget=budget
        )
        await self._relay.start()
        self._endpoint_url = f"http://127.0.0.1:{inside_port}"

    @property
    def refused_connections(self) -> int:
        """Connections to the forwarded endpoint closed at once because a cap was reached."""
        return self._relay.refused if self._relay is not None else 0

    def _limits_token(self) -> object:
        counters = self._boot.cgroup.counters() if self._boot.cgroup else None
        channel = self._boot.channel
        return counters, self.refused_connections, dict(channel.rlimit_kills)

    def _limits_hit_since(self, token: object) -> tuple[str, ...]:
        """The cgroups' counters, the relay's refusals, and what init reported: tmpfs full
        when the command ended, orphans killed by an rlimit's signal (a command's own death
        by one is in its return code)."""
        assert isinstance(token, tuple)
        counters, refused, kills = token
        hits: tuple[str, ...] = ()
        if isinstance(counters, Counters) and self._boot.cgroup is not None:
            hits = self._boot.cgroup.counters().hits_since(counters)
        if self.refused_connections > refused:
            hits += ("max_connections",)
        channel = self._boot.channel
        hits += tuple(
            limit for limit, count in channel.rlimit_kills.items() if count > kills.get(limit, 0)
        )
        return hits + channel.full

    async def _shutdown(self) -> None:
        if self._relay is not None:
            await self._relay.close()
        await self._boot.stop()


class _InitProcess:
    """A command started by the sandbox's init."""

    def __init__(self, boot: Booted, pid: int) -> None:
        self._boot = boot
        self._pid = pid
        self._returncode: int | None = None

    @property
    def returncode(self) -> int | None:
        return self._returncode

    async def wait(self) -> int:
        try:
            self._returncode = await self._boot.channel.wait(self._pid)
        except InitGoneError as gone:
            raise self._boot.why_gone(gone) from gone
        return self._returncode

    def kill_group(self) -> None:
        self._boot.channel.kill_group(self._pid)
