"""A task's environment as the sandbox's spec: the image, the workspace, and what failed.

The agent's sandbox and the grading sandbox are built from the same task environment, so a
change is graded on the root file system it was made on. A task that names no environment
runs on the host's /usr as before; one whose image holds the repository gets that directory
as its workspace (`ImageWorkspace`), fresh from the image in every sandbox.

A change is captured against the repository the workspace came from: the prepared checkout at
the task's base commit, or, in an image's own directory, the image's repository (the sandbox's
`source_repository`) at its HEAD, or a commit of that directory's plain files as the image has
them; the grading sandbox starts from the same image files. Registry
images and OCI layouts are pulled into the node's image cache (`image_cache_config`).

Environment failures are never the agent's doing and never a reward: an image that cannot be
pulled, a sandbox that cannot boot on it, a test command that cannot start there. Their
reasons start with ENVIRONMENT so runs count them apart (`abort_cause`).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath

from sandbox import (
    CapturedDiff,
    CaptureLimits,
    E2BTemplate,
    ForwardedEndpoint,
    GitWorkspace,
    ImageCacheConfig,
    ImageSource,
    ImageWorkspace,
    OciLayoutImage,
    ReadOnlyBind,
    RegistryCredentials,
    RegistryImage,
    ResourceLimits,
    RootfsImage,
    Sandbox,
    SandboxSpec,
    capture_diff,
)
from swe_rl.task import Environment, RewardFileRunner, SweTask

ENVIRONMENT = "environment"
"""The first word of every reason an episode is aborted for its environment."""

IMAGE_CACHE_ENV = "SWE_RL_IMAGE_CACHE"
PLAIN_HTTP_ENV = "SWE_RL_REGISTRY_PLAIN_HTTP"
CREDENTIALS_ENV = "SWE_RL_REGISTRY_CREDENTIALS"


def default_image_cache() -> Path:
    """Where pulled images are kept: $SWE_RL_IMAGE_CACHE, else ~/.cache/agent-rl/images."""
    named = os.environ.get(IMAGE_CACHE_ENV)
    return Path(named) if named else Path.home() / ".cache" / "agent-rl" / "images"


def image_cache_config(
    root: Path | None = None,
    *,
    plain_http: Sequence[str] = (),
    credentials: Path | None = None,
) -> ImageCacheConfig:
    """The node's image cache: `root` (default `default_image_cache()`), hosts spoken to over
    plain HTTP (`plain_http`, plus $SWE_RL_REGISTRY_PLAIN_HTTP, comma-separated) and registry
    credentials from a JSON file `{"host": {"username": ..., "password": ...}}` (`credentials`,
    else $SWE_RL_REGISTRY_CREDENTIALS). ValueError names a bad credentials file."""
    hosts = [*plain_http, *os.environ.get(PLAIN_HTTP_ENV, "").split(",")]
    path = credentials or (Path(c) if (c := os.environ.get(CREDENTIALS_ENV)) else None)
    return ImageCacheConfig(
        root=root or default_image_cache(),
        plain_http=tuple(dict.fromkeys(h.strip() for h in hosts if h.strip())),
        credentials=_credentials(path) if path is not None else {},
    )


def _credentials(path: Path) -> dict[str, RegistryCredentials]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ValueError(f"registry credentials {path}: {error}") from None
    if not isinstance(data, dict):
        raise ValueError(f"registry credentials {path}: not a JSON object of hosts")
    found = {}
    for host, entry in data.items():
        user = entry.get("username") if isinstance(entry, dict) else None
        password = entry.get("password") if isinstance(entry, dict) else None
        if not isinstance(user, str) or not isinstance(password, str):
            raise ValueError(f"registry credentials {path}: {host} needs username and password")
        found[host] = RegistryCredentials(user, password)
    return found


def image_source(environment: Environment) -> ImageSource:
    """The sandbox's image for a task environment."""
    if environment.image is not None:
        return RegistryImage(environment.image)
    if environment.oci_layout is not None:
        return OciLayoutImage(Path(environment.oci_layout), environment.ref)
    if environment.rootfs is not None:
        return RootfsImage(Path(environment.rootfs), dict(environment.rootfs_env))
    assert environment.e2b_template is not None
    return E2BTemplate(environment.e2b_template)


def workspace_source(task: SweTask, repo: Path | None) -> GitWorkspace | ImageWorkspace:
    """The workspace of a sandbox for `task`: the image's own directory when the image holds
    the repository, else a checkout of the prepared repository `repo` at the base commit."""
    if task.in_image:
        assert task.environment is not None
        workdir = task.environment.workdir
        return ImageWorkspace(PurePosixPath(workdir) if workdir is not None else None)
    if repo is None or task.base_commit is None:
        raise ValueError(f"task {task.instance_id} needs its prepared repository")
    return GitWorkspace(repo, task.base_commit)


def sandbox_spec(
    task: SweTask,
    repo: Path | None,
    *,
    env: Mapping[str, str],
    binds: tuple[ReadOnlyBind, ...] = (),
    limits: ResourceLimits | None = None,
    network: ForwardedEndpoint | None = None,
    grading: bool = False,
) -> SandboxSpec:
    """A sandbox for `task`: on its image (if any), with its workspace. A grading sandbox of a
    Harbor task gets empty writable directories where its verifier reads its tests and writes
    its reward (/tests, /logs) on the image's read-only root."""
    return SandboxSpec(
        workspace=workspace_source(task, repo),
        image=image_source(task.environment) if task.environment is not None else None,
        env=env,
        network=network,
        read_only_binds=binds,
        limits=limits or ResourceLimits(),
        scratch_dirs=scratch_dirs(task) if grading else (),
    )


def scratch_dirs(task: SweTask) -> tuple[PurePosixPath, ...]:
    """The top-level directories a reward_file runner's tests and reward file are under."""
    runner = task.grading.runner
    if not isinstance(runner, RewardFileRunner):
        return ()
    tops = (PurePosixPath(runner.tests_path), PurePosixPath(runner.reward_file).parent)
    return tuple(dict.fromkeys(PurePosixPath("/", p.parts[1]) for p in tops if len(p.parts) > 1))


class CaptureUnsupportedError(RuntimeError):
    """The sandbox has no repository to capture a change against (a backend that keeps no
    base for an image's directory: an E2B template's)."""


async def capture_change(
    box: Sandbox, task: SweTask, repo: Path | None, limits: CaptureLimits
) -> CapturedDiff:
    """The change made in `box`'s workspace: against the prepared repository at the base
    commit, or the image's own repository at its HEAD. ChangeTooLargeError and SandboxError
    as `capture_diff` raises them."""
    if repo is not None and task.base_commit is not None:
        return await capture_diff(box, repo, task.base_commit, limits=limits)
    source, head = await image_base(box, task)
    return await capture_diff(box, source, head, limits=limits)


async def image_base(box: Sandbox, task: SweTask) -> tuple[Path, str]:
    """The repository and commit a change in an image's own directory is captured against:
    the image's, at its HEAD, which must be the task's base commit when the task names one
    (a SWE-bench image checked out elsewhere is not the task's environment).
    CaptureUnsupportedError says why there is none."""
    source = box.source_repository
    if source is None:
        raise CaptureUnsupportedError(
            f"the backend keeps no base of {box.workspace} in the image to capture against"
        )
    head = await asyncio.to_thread(_head, source)
    wanted = task.base_commit
    if wanted is not None and not (head.startswith(wanted) or wanted.startswith(head)):
        raise CaptureUnsupportedError(
            f"the image's repository at {box.workspace} has {head[:12]} checked out, "
            f"not the task's base commit {wanted[:12]}"
        )
    return source, head


def _head(repository: Path) -> str:
    """The commit a host repository (an image's, maybe root-owned) has checked out."""
    done = subprocess.run(
        ["git", "-c", "safe.directory=*", "rev-parse", "--verify", "HEAD^{commit}"],
        cwd=repository,
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GIT_CONFIG_NOSYSTEM": "1"},
    )
    if done.returncode != 0:
        raise CaptureUnsupportedError(
            f"the image's repository {repository} has no commit checked out: "
            f"{done.stderr.strip()[-300:]}"
        )
    return done.stdout.strip()


def environment_reason(task: SweTask, what: str, error: BaseException | str) -> str:
    """An abort reason for an environment failure, naming the environment."""
    where = task.environment.label if task.environment is not None else "the host's /usr"
    return f"{ENVIRONMENT}: {what} ({where}): {error}"


def abort_cause(reason: str) -> str:
    """The cause an aborted episode's reason names, for counting aborts by cause: the reason's
    first word or phrase before a colon (`environment`, `sandbox`, `grading`, ...)."""
    head = reason.split(":", 1)[0].strip()
    return head if head and len(head) <= 40 else "other"
