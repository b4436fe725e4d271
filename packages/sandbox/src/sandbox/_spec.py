"""What a sandbox should look like, as typed data every backend understands."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from types import MappingProxyType


@dataclass(frozen=True, slots=True)
class EmptyWorkspace:
    """Start with an empty workspace directory."""


@dataclass(frozen=True, slots=True)
class DirectoryWorkspace:
    """Start with a copy of a host directory (symlinks preserved, never followed)."""

    source: Path


@dataclass(frozen=True, slots=True)
class GitWorkspace:
    """Start with a checkout of `commit` from the local repository `repo` (see workspace.py).

    The checkout shares the source's object store read-only, so creating it is cheap and the
    agent can neither read nor corrupt anything of the source beyond its objects: its config
    (a remote's credentials), hooks, reflogs and refs are not mounted. Every object is, though,
    by its id: give it a repository that holds only what the agent may see.
    """

    repo: Path
    commit: str


@dataclass(frozen=True, slots=True)
class ImageWorkspace:
    """The image's own directory at `path` (None: the image's working directory), made
    writable where it is: the workspace is mounted at `path` and starts as a copy of the
    image's content there. SWE-bench images keep the task's repository at ``/testbed`` (their
    working directory), with its environment installed in editable mode against that path.
    Needs `SandboxSpec.image`."""

    path: PurePosixPath | None = None

    def __post_init__(self) -> None:
        if self.path is None:
            return
        if not self.path.is_absolute() or self.path == PurePosixPath("/"):
            raise ValueError(f"ImageWorkspace.path must be an absolute directory: {self.path}")


WorkspaceSource = EmptyWorkspace | DirectoryWorkspace | GitWorkspace | ImageWorkspace


@dataclass(frozen=True, slots=True)
class RegistryImage:
    """An image in an OCI registry, by reference: ``[host[:port]/]repository[:tag][@digest]``
    (``python:3.11`` is Docker Hub's ``library/python:3.11``). The local backend pulls it once
    per node into its image cache; a digest pins it."""

    reference: str


@dataclass(frozen=True, slots=True)
class OciLayoutImage:
    """An image in an OCI image layout on the host (``oci-layout``, ``index.json``,
    ``blobs/``): the manifest whose ``org.opencontainers.image.ref.name`` is `ref`, or the only
    one when `ref` is None."""

    path: Path
    ref: str | None = None


@dataclass(frozen=True, slots=True)
class RootfsImage:
    """A root file system already unpacked on the host, used read-only as it is, with what an
    image's configuration would say: its environment, working directory and user."""

    path: Path
    env: Mapping[str, str] = field(default_factory=dict)
    working_dir: PurePosixPath | None = None
    user: str | None = None

    def __post_init__(self) -> None:
        validate_env(self.env)
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))


@dataclass(frozen=True, slots=True)
class E2BTemplate:
    """An E2B sandbox template, by id or name (built from the task's Dockerfile or image; see
    the E2B docs of this package)."""

    template_id: str


ImageSource = RegistryImage | OciLayoutImage | RootfsImage | E2BTemplate
"""The task's own environment. The local backend runs on registry images, OCI layouts and root
file systems; E2B on templates. A backend given a kind it cannot run raises
`UnsupportedSpecError`."""


@dataclass(frozen=True, slots=True)
class ForwardedEndpoint:
    """A host TCP endpoint (the protocol adapter) made reachable from inside the sandbox.

    Inside, it is `http://127.0.0.1:<sandbox_port>` (`Sandbox.endpoint_url` says exactly);
    nothing else on the host network is reachable.
    """

    host: str
    port: int
    sandbox_port: int | None = None

    def __post_init__(self) -> None:
        for value in (self.port, self.sandbox_port):
            if value is not None and not 0 < value < 65536:
                raise ValueError(f"invalid TCP port: {value}")

    @property
    def inside_port(self) -> int:
        return self.sandbox_port if self.sandbox_port is not None else self.port


@dataclass(frozen=True, slots=True)
class ReadOnlyBind:
    """A host path mounted read-only inside the sandbox (an npm install, a package cache).

    `host_programs`: executables in it (paths relative to it) built for the host, which must
    run whatever the sandbox's root: `Sandbox.host_program_argv` says how to start each. On an
    image, a dynamically linked one cannot use the image's loader and libraries (another
    libc, or none), so its library closure is found on the host when the sandbox is created
    and mounted beside the host's loader. Name only what must run there (an agent CLI): every
    one adds its libraries to each sandbox of the spec.
    """

    host_path: Path
    sandbox_path: PurePosixPath
    host_programs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.sandbox_path.is_absolute():
            raise ValueError(f"sandbox_path must be absolute: {self.sandbox_path}")
        for program in self.host_programs:
            parts = PurePosixPath(program).parts
            if not parts or parts[0] == "/" or ".." in parts or program != "/".join(parts):
                raise ValueError(f"a host program must be a plain relative path: {program!r}")

    def host_program_paths(self) -> list[tuple[Path, PurePosixPath]]:
        """Each host program's file on the host and its path inside."""
        return [(self.host_path / p, self.sandbox_path / p) for p in self.host_programs]


GiB = 1 << 30
MiB = 1 << 20
DEFAULT_READ_BYTES = 256 * MiB
"""The largest file `Sandbox.read_file` returns unless told otherwise."""


@dataclass(frozen=True, slots=True)
class ResourceLimits:
    """What one sandbox may consume; None means unlimited.

    The defaults bound a runaway episode (a fork bomb, a leaking test suite, a disk filler)
    without getting in the way of an agent CLI and a project's test suite. Each backend
    enforces what it can and documents how: the local backend uses a cgroup per sandbox where
    the host lets it (processes, memory, CPU) and rlimits otherwise, and sizes the tmpfs file
    systems the sandbox writes to; on E2B the VM's size is the limit.
    """

    max_processes: int | None = 2048
    """Processes and threads of the whole sandbox at once (cgroup pids.max). Without a pids
    cgroup: RLIMIT_NPROC, counted per host user (shared by a non-root caller's sandboxes)."""
    memory_bytes: int | None = 8 * GiB
    """Memory of the whole sandbox, tmpfs files included (cgroup memory limit); a command is
    the OOM killer's first choice, never init. Without a memory cgroup: RLIMIT_DATA per
    process, and tmpfs files count only against their own sizes."""
    cpu_cores: float | None = None
    """CPU bandwidth of the whole sandbox in cores (cgroup cpu quota); None: a fair share."""
    cpu_seconds: int | None = None
    """CPU time of any one process (RLIMIT_CPU: SIGXCPU, then SIGKILL)."""
    workspace_bytes: int | None = 8 * GiB
    """Size of the workspace file system."""
    scratch_bytes: int | None = 2 * GiB
    """Size of each scratch file system: /tmp, /var/tmp, the home directory, /dev/shm."""
    max_open_files: int | None = 65536
    """Open files per process (RLIMIT_NOFILE)."""
    max_file_size_bytes: int | None = None
    """Largest file any process may write (RLIMIT_FSIZE: SIGXFSZ)."""
    max_output_bytes: int | None = 64 * MiB
    """Output kept of each stream (stdout, stderr) of each command; the rest is read and
    dropped, never stored on the host, and the command reports this limit hit."""
    max_connections: int | None = 256
    """Connections to the forwarded endpoint relayed at once; more are closed at once (each
    costs the host descriptors)."""

    def __post_init__(self) -> None:
        for name in self.__slots__:
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"ResourceLimits.{name} must be positive or None, got {value}")


@dataclass(frozen=True, slots=True)
class SandboxSpec:
    """Everything a backend needs to create one sandbox.

    `env` is the base environment of every command (per-command `env` is layered on top).
    `network=None` means no network at all.
    """

    workspace: WorkspaceSource = field(default_factory=EmptyWorkspace)
    image: ImageSource | None = None
    """The root file system: None runs on the host's own /usr and /etc, read-only."""
    env: Mapping[str, str] = field(default_factory=dict)
    network: ForwardedEndpoint | None = None
    read_only_binds: tuple[ReadOnlyBind, ...] = ()
    scratch_dirs: tuple[PurePosixPath, ...] = ()
    """More empty writable directories, each a file system of `limits.scratch_bytes` (on an
    image's read-only root, where a task's tests expect to write: Harbor's /logs, /tests)."""
    limits: ResourceLimits = field(default_factory=ResourceLimits)

    def __post_init__(self) -> None:
        for path in self.scratch_dirs:
            if not path.is_absolute() or path == PurePosixPath("/") or ".." in path.parts:
                raise ValueError(f"scratch_dirs must be absolute directories: {path}")
        if isinstance(self.workspace, ImageWorkspace) and self.image is None:
            raise ValueError("an ImageWorkspace needs SandboxSpec.image")
        validate_env(self.env)
        # A private read-only copy: a caller mutating its dict later cannot change the spec.
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))

    def host_programs(self) -> list[tuple[Path, PurePosixPath]]:
        """Every bind's host programs: (file on the host, path inside)."""
        return [path for bind in self.read_only_binds for path in bind.host_program_paths()]


def validate_env(env: Mapping[str, str]) -> None:
    """Reject names and values the kernel cannot pass to a process."""
    for key, value in env.items():
        if not key or "=" in key or "\0" in key:
            raise ValueError(f"invalid environment variable name: {key!r}")
        if "\0" in value:
            raise ValueError(f"environment variable {key} contains a NUL byte")
