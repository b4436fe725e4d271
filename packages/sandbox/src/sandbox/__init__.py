"""Async sandboxes for agent episodes: local bubblewrap by default, E2B for scale.

The public API is what this module exports; every module behind it is internal (its name starts
with ``_``) and may change in any release.
"""

from typing import TYPE_CHECKING

from sandbox._capture import CapturedDiff, CaptureLimits, ChangeTooLargeError, capture_diff
from sandbox._e2b_backend import E2BBackend, E2BConfig, E2BSandbox
from sandbox._errors import (
    SandboxBootError,
    SandboxClosedError,
    SandboxCommandError,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxUnavailableError,
    UnsupportedSpecError,
)
from sandbox._git_diff import UnsafePatchError, apply_diff
from sandbox._images import (
    ImageCache,
    ImageCacheConfig,
    ImageConfig,
    ImageLease,
    ImagePullError,
    Platform,
    RegistryCredentials,
)
from sandbox._local import (
    Enforcement,
    InitGoneError,
    LocalBackend,
    LocalConfig,
    LocalSandbox,
    UidRange,
)
from sandbox._protocol import Process, Sandbox, SandboxBackend
from sandbox._result import KILLED_EXIT_CODE, ExecResult, ScriptResult
from sandbox._retry import RetryPolicy
from sandbox._spec import (
    DirectoryWorkspace,
    E2BTemplate,
    EmptyWorkspace,
    ForwardedEndpoint,
    GitWorkspace,
    ImageSource,
    ImageWorkspace,
    OciLayoutImage,
    ReadOnlyBind,
    RegistryImage,
    ResourceLimits,
    RootfsImage,
    SandboxSpec,
    validate_env,
)
from sandbox._workspace import CheckoutError, SetupFailedError, checkout_repo, run_setup

__all__ = [
    "KILLED_EXIT_CODE",
    "CaptureLimits",
    "CapturedDiff",
    "ChangeTooLargeError",
    "CheckoutError",
    "DirectoryWorkspace",
    "E2BBackend",
    "E2BConfig",
    "E2BSandbox",
    "E2BTemplate",
    "EmptyWorkspace",
    "Enforcement",
    "ExecResult",
    "ForwardedEndpoint",
    "GitWorkspace",
    "ImageCache",
    "ImageCacheConfig",
    "ImageConfig",
    "ImageLease",
    "ImagePullError",
    "ImageSource",
    "ImageWorkspace",
    "InitGoneError",
    "LocalBackend",
    "LocalConfig",
    "LocalSandbox",
    "OciLayoutImage",
    "Platform",
    "Process",
    "ReadOnlyBind",
    "RegistryCredentials",
    "RegistryImage",
    "ResourceLimits",
    "RetryPolicy",
    "RootfsImage",
    "Sandbox",
    "SandboxBackend",
    "SandboxBootError",
    "SandboxClosedError",
    "SandboxCommandError",
    "SandboxError",
    "SandboxFileNotFoundError",
    "SandboxSpec",
    "SandboxUnavailableError",
    "ScriptResult",
    "SetupFailedError",
    "UidRange",
    "UnsafePatchError",
    "UnsupportedSpecError",
    "apply_diff",
    "capture_diff",
    "checkout_repo",
    "run_setup",
    "validate_env",
]


if TYPE_CHECKING:
    __version__: str
else:

    def __getattr__(name: str) -> str:
        # The version comes from the installed metadata (pyproject.toml is its one source), read
        # on first use: importing importlib.metadata costs more than importing this package.
        if name == "__version__":
            from importlib.metadata import version

            return version("agent-rl-sandbox")
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
