"""A task's image built from its Dockerfile without a container daemon, with buildah.

Harbor tasks often give their environment as a Dockerfile that builds (RUN, COPY, ENV, ...).
`BuildahBuilder` builds one such build context into an OCI image layout, which the sandbox runs
like any other image: `<images_dir>/<task name>`, tagged with a hash of the context (every
file's relative path, mode and bytes), so an unchanged context is never built again (a rerun
over a dataset resumes) and a changed one is. Base images stay in buildah's storage between
builds; the built image is removed from it once in its layout.

buildah runs with chroot isolation and the vfs storage driver: no daemon, no OCI runtime and no
overlay mounts needed, so it works where containers do not nest (rootless buildah needs
subordinate ids in /etc/subuid and /etc/subgid). RUN steps get the host's network: chroot
isolation has no network namespace of its own, and dataset Dockerfiles need it for apt and pip.

Registry mirrors, plain-HTTP hosts and credentials reach buildah as a registries.conf and an
auth file generated into a private temporary directory for each build, never the user's own
containers configuration. This module reads no environment variables: the caller configures.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from sandbox import RegistryCredentials

RECIPE = b"swe-rl image build 1"
"""Part of every tag: bump it when how an image is built changes, so old layouts are rebuilt."""
DOCKER_HUB = "docker.io"
_DOCKER_HUB_ALIASES = frozenset({"docker.io", "registry-1.docker.io", "index.docker.io"})
_TAIL_CHARS = 2000


class BuildError(Exception):
    """An image could not be built; the message says why (buildah's own words at its end)."""


@dataclass(frozen=True, slots=True)
class BuildConfig:
    images_dir: Path
    """Where the OCI image layouts go, one directory per task."""
    storage_dir: Path
    """buildah's storage: base images pulled once are kept here between builds."""
    mirrors: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Registry host -> mirror hosts tried first, in order (a cluster's pull-through cache)."""
    plain_http: tuple[str, ...] = ()
    """Hosts (registries or mirrors) spoken to over plain HTTP, their TLS unchecked."""
    credentials: Mapping[str, RegistryCredentials] = field(default_factory=dict)
    """Registry (or mirror) host -> credentials."""
    timeout_s: float = 3600.0
    """Longest buildah may take over one step: the build, or its push into the layout."""
    buildah: str = "buildah"
    """The buildah executable (a name looked up on PATH, or a path)."""


@dataclass(frozen=True, slots=True)
class BuiltImage:
    layout: Path
    """The OCI image layout holding the image (its only one)."""
    tag: str
    """The image's tag in `layout`: the build context's hash."""
    built: bool
    """False when the layout already held this context's image (nothing was built)."""
    seconds: float


class BuildahBuilder:
    """Builds task images into OCI layouts with buildah; one process per build, each layout
    locked while it is checked and built, so concurrent converters build it once."""

    def __init__(self, config: BuildConfig) -> None:
        self.config = config

    def build(self, name: str, context: Path) -> BuiltImage:
        """The image of `context` (a directory holding a Dockerfile) for task `name`.
        BuildError says why there is none."""
        started = time.monotonic()
        executable = shutil.which(self.config.buildah)
        if executable is None:
            raise BuildError(
                f"{self.config.buildah} is not installed (Debian: apt-get install buildah)"
            )
        images = self.config.images_dir
        layout = images / safe_name(name)
        try:
            tag = context_tag(context)
            images.mkdir(parents=True, exist_ok=True)
            with _locked(images / f"{layout.name}.lock"):
                if has_tag(layout, tag):
                    return BuiltImage(layout, tag, False, time.monotonic() - started)
                staging = images / f".{layout.name}.building"
                _remove(staging)
                try:
                    self._build(executable, name, context / "Dockerfile", staging, tag)
                    _replace(layout, staging)
                finally:
                    _remove(staging)
        except OSError as error:
            raise BuildError(f"{layout}: {error}") from None
        return BuiltImage(layout, tag, True, time.monotonic() - started)

    def _build(self, executable: str, name: str, dockerfile: Path, layout: Path, tag: str) -> None:
        """buildah build, its image pushed into `layout` as `tag`, then removed from buildah's
        storage (the image lives on in its layout; its base stays for the next build)."""
        reference = f"localhost/swe-rl-build/{_repository(name)}:{tag}"
        with tempfile.TemporaryDirectory(prefix="swe-rl-build-") as private:
            buildah, env = self._buildah(executable, Path(private))
            build = ["build", "--isolation", "chroot", "--pull=false", "--tag", reference]
            build += ["--authfile", str(Path(private) / "auth.json"), "--file", str(dockerfile)]
            self._run([*buildah, *build, str(dockerfile.parent)], env, "build")
            try:
                self._run(
                    [*buildah, "push", "--quiet", reference, f"oci:{layout}:{tag}"], env, "push"
                )
            finally:
                subprocess.run(
                    [*buildah, "rmi", reference], env=env, capture_output=True, check=False
                )

    def _buildah(self, executable: str, private: Path) -> tuple[list[str], dict[str, str]]:
        """buildah's command and environment: its storage, and registries.conf and auth.json
        generated into `private`, the only containers configuration it reads."""
        (private / "registries.conf").write_text(registries_conf(self.config), encoding="utf-8")
        (private / "registries.conf.d").mkdir()
        auth = private / "auth.json"
        auth.touch(mode=0o600)
        auth.write_text(auth_file(self.config.credentials), encoding="utf-8")
        storage = self.config.storage_dir
        command = [
            executable,
            "--root",
            str(storage / "root"),
            "--runroot",
            str(storage / "run"),
            "--storage-driver",
            "vfs",
            "--registries-conf-dir",  # empty: none of the system's drop-ins
            str(private / "registries.conf.d"),
            "--short-name-alias-conf",
            str(private / "short-name-aliases.conf"),
        ]
        env = {**os.environ, "CONTAINERS_REGISTRIES_CONF": str(private / "registries.conf")}
        return command, env

    def _run(self, command: list[str], env: dict[str, str], what: str) -> None:
        with tempfile.TemporaryFile() as output:
            # A session of its own: a timeout (or Ctrl-C) ends buildah and its RUN steps.
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
            try:
                code = process.wait(timeout=self.config.timeout_s)
            except subprocess.TimeoutExpired:
                _kill(process)
                raise BuildError(
                    f"buildah {what} took longer than {self.config.timeout_s:g} s: {_tail(output)}"
                ) from None
            except BaseException:
                _kill(process)
                raise
            if code != 0:
                raise BuildError(f"buildah {what} failed (exit {code}): {_tail(output)}")


def context_tag(context: Path) -> str:
    """A hash of the build context: every entry's relative path and mode, each file's bytes,
    each symbolic link's target (and the build recipe). OSError if it cannot be read."""
    digest = hashlib.sha256(RECIPE)
    for directory, names, files in os.walk(context):
        names.sort()
        for entry in sorted([*names, *files]):
            path = Path(directory, entry)
            info = path.lstat()
            relative = path.relative_to(context).as_posix().encode()
            digest.update(b"%d:%s:%o\0" % (len(relative), relative, info.st_mode))
            if stat.S_ISLNK(info.st_mode):
                digest.update(os.readlink(path).encode() + b"\0")
            elif stat.S_ISREG(info.st_mode):
                digest.update(b"%d\0" % info.st_size)
                with path.open("rb") as file:
                    while chunk := file.read(1 << 20):
                        digest.update(chunk)
    return digest.hexdigest()[:32]


def safe_name(name: str) -> str:
    """A task name as one directory name: anything but letters, digits, `.`, `_` and `-` as
    `_`, no leading dot."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".")[:200] or "_"


def has_tag(layout: Path, tag: str) -> bool:
    """Whether the OCI layout's index names a manifest `tag` whose blob is there."""
    try:
        index = json.loads((layout / "index.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    for manifest in index.get("manifests", []) if isinstance(index, dict) else []:
        annotations = manifest.get("annotations") or {}
        if annotations.get("org.opencontainers.image.ref.name") != tag:
            continue
        algorithm, _, hexdigest = str(manifest.get("digest", "")).partition(":")
        return bool(hexdigest) and (layout / "blobs" / algorithm / hexdigest).is_file()
    return False


def registries_conf(config: BuildConfig) -> str:
    """containers-registries.conf(5) for `config`: Docker Hub searched for short names (as a
    Dockerfile's FROM means them), each mirrored registry's mirrors in order, plain-HTTP
    hosts `insecure` (HTTP allowed, TLS unchecked)."""
    plain = dict.fromkeys(_host(h) for h in config.plain_http)
    registries: dict[str, list[str]] = {}
    for registry, given in config.mirrors.items():
        registries.setdefault(_host(registry), []).extend(given)
    for host in plain:
        registries.setdefault(host, [])
    lines = [f"unqualified-search-registries = [{_toml(DOCKER_HUB)}]"]
    for host, mirrors in registries.items():
        lines += ["", "[[registry]]", f"prefix = {_toml(host)}", f"location = {_toml(host)}"]
        lines.append(f"insecure = {_toml(host in plain)}")
        for mirror in dict.fromkeys(mirrors):
            lines += ["", "[[registry.mirror]]", f"location = {_toml(mirror)}"]
            lines.append(f"insecure = {_toml(_host(mirror) in plain)}")
    return "\n".join(lines) + "\n"


def auth_file(credentials: Mapping[str, RegistryCredentials]) -> str:
    """containers-auth.json(5): `{"auths": {host: {"auth": base64("user:password")}}}`."""
    auths = {
        _host(host): {"auth": base64.b64encode(f"{c.username}:{c.password}".encode()).decode()}
        for host, c in credentials.items()
    }
    return json.dumps({"auths": auths}, indent=2) + "\n"


def _host(host: str) -> str:
    """Docker Hub by the one name containers' configuration knows it by."""
    return DOCKER_HUB if host in _DOCKER_HUB_ALIASES else host


def _toml(value: str | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value)  # a JSON string is a TOML basic string


def _repository(name: str) -> str:
    """A name for the built image in buildah's storage: lower case, unique per task name."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:60] or "task"
    return f"{slug}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _replace(layout: Path, staging: Path) -> None:
    """`staging` renamed to `layout`, the older image there (another context's) removed."""
    old = layout.with_name(f".{layout.name}.old")
    _remove(old)
    if layout.exists():
        layout.rename(old)
    staging.rename(layout)
    _remove(old)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _kill(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _tail(output: IO[bytes]) -> str:
    """The end of buildah's output, where it says what failed."""
    output.seek(0)
    text = output.read().decode("utf-8", "replace").strip()
    if len(text) <= _TAIL_CHARS:
        return text
    tail = text[-_TAIL_CHARS:]
    _, newline, lines = tail.partition("\n")  # from a line's start, where there is one
    return "..." + (lines if newline else tail)
