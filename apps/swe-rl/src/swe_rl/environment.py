"""A task's environment as the sandbox's spec: the image, the workspace, and what failed.

The agent's sandbox and the grading sandbox are built from the same task environment, so a
change is graded on the root file system it was made on. A task that names no environment
runs on the host's /usr as before; one whose image holds the repository gets that directory
as its workspace (`ImageWorkspace`), fresh from the image in every sandbox.

Environment failures are never the agent's doing and never a reward: an image that cannot be
pulled, a sandbox that cannot boot on it, a test command that cannot start there. Their
reasons start with ENVIRONMENT so runs count them apart (`abort_cause`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from sandbox import (
    CapturedDiff,
    CaptureLimits,
    E2BTemplate,
    ForwardedEndpoint,
    GitWorkspace,
    ImageSource,
    ImageWorkspace,
    OciLayoutImage,
    ReadOnlyBind,
    RegistryImage,
    ResourceLimits,
    RootfsImage,
    Sandbox,
    SandboxSpec,
    capture_diff,
)
from swe_rl.task import Environment, SweTask

ENVIRONMENT = "environment"
"""The first word of every reason an episode is aborted for its environment."""


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
) -> SandboxSpec:
    """A sandbox for `task`: on its image (if any), with its workspace."""
    return SandboxSpec(
        workspace=workspace_source(task, repo),
        image=image_source(task.environment) if task.environment is not None else None,
        env=env,
        network=network,
        read_only_binds=binds,
        limits=limits or ResourceLimits(),
    )


class CaptureUnsupportedError(RuntimeError):
    """The sandbox cannot capture a change made in an image's own directory (yet)."""


def can_capture(task: SweTask, repo: Path | None) -> bool:
    """Whether a change in a sandbox for `task` can be captured (see capture_change)."""
    return repo is not None and task.base_commit is not None


async def capture_change(
    box: Sandbox, task: SweTask, repo: Path | None, limits: CaptureLimits
) -> CapturedDiff:
    """The change made in `box`'s workspace, against the prepared repository at the base
    commit. ChangeTooLargeError and SandboxError as `capture_diff` raises them."""
    if not can_capture(task, repo) or repo is None or task.base_commit is None:
        # The sandbox package's capture lists against a host repository mounted read-only
        # inside; an image's own directory has none.
        raise CaptureUnsupportedError(
            "the sandbox cannot capture a change made in an image's own directory"
        )
    return await capture_diff(box, repo, task.base_commit, limits=limits)


def environment_reason(task: SweTask, what: str, error: BaseException | str) -> str:
    """An abort reason for an environment failure, naming the environment."""
    where = task.environment.label if task.environment is not None else "the host's /usr"
    return f"{ENVIRONMENT}: {what} ({where}): {error}"


def abort_cause(reason: str) -> str:
    """The cause an aborted episode's reason names, for counting aborts by cause: the reason's
    first word or phrase before a colon (`environment`, `sandbox`, `grading`, ...)."""
    head = reason.split(":", 1)[0].strip()
    return head if head and len(head) <= 40 else "other"
