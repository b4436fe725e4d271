"""Async sandboxes for agent episodes: local bubblewrap by default, E2B for scale."""

from importlib.metadata import version as _distribution_version

from sandbox._uids import UidRange
from sandbox.e2b_backend import E2BBackend, E2BConfig
from sandbox.errors import (
    SandboxBootError,
    SandboxClosedError,
    SandboxCommandError,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxUnavailableError,
    UnsupportedSpecError,
)
from sandbox.git_diff import CapturedDiff, UnsafePatchError, apply_diff, capture_diff
from sandbox.local import Enforcement, LocalBackend, LocalConfig, LocalSandbox
from sandbox.protocol import Process, Sandbox, SandboxBackend
from sandbox.result import ExecResult
from sandbox.retry import RetryPolicy
from sandbox.spec import (
    DirectoryWorkspace,
    EmptyWorkspace,
    ForwardedEndpoint,
    GitWorkspace,
    ReadOnlyBind,
    ResourceLimits,
    SandboxSpec,
)
from sandbox.workspace import CheckoutError, SetupFailedError, checkout_repo, run_setup

__version__ = _distribution_version("agent-rl-sandbox")  # pyproject.toml is the one source

__all__ = [
    "CapturedDiff",
    "CheckoutError",
    "DirectoryWorkspace",
    "E2BBackend",
    "E2BConfig",
    "EmptyWorkspace",
    "Enforcement",
    "ExecResult",
    "ForwardedEndpoint",
    "GitWorkspace",
    "LocalBackend",
    "LocalConfig",
    "LocalSandbox",
    "Process",
    "ReadOnlyBind",
    "ResourceLimits",
    "RetryPolicy",
    "Sandbox",
    "SandboxBackend",
    "SandboxBootError",
    "SandboxClosedError",
    "SandboxCommandError",
    "SandboxError",
    "SandboxFileNotFoundError",
    "SandboxSpec",
    "SandboxUnavailableError",
    "SetupFailedError",
    "UidRange",
    "UnsafePatchError",
    "UnsupportedSpecError",
    "apply_diff",
    "capture_diff",
    "checkout_repo",
    "run_setup",
]
