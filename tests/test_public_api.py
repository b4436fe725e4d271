"""Each library's public names, pinned: changing them is a deliberate edit of this file.

For each package: ``__all__`` is exactly the list below, every name in it resolves, nothing else
public is visible on the package, and its only modules without a leading underscore are the
public ones listed (an internal module is named ``_like_this``). protocol-adapters loads its
names on first use; its type-checking imports must name exactly the same list.
"""

from __future__ import annotations

import ast
import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest


@dataclass(frozen=True)
class Pinned:
    exports: tuple[str, ...]
    public_modules: tuple[str, ...] = ()


PINNED = {
    "trajectory_tree": Pinned(
        (
            "Block", "BridgedPrompt", "Completion", "Exclusion", "FinishReason", "ForeignRoute",
            "FormatError", "FullPrompt", "InvalidTurn", "LengthLimit", "LengthMode",
            "Linearization", "LossReason", "Media", "Message", "Node", "Prompt", "Reasoning",
            "RewardPolicy", "Role", "Route", "RoutedExperts", "Sample", "SampleRouting",
            "Segment", "SessionSummary", "SessionTree", "Span", "Text", "ToolCall", "ToolSpec",
            "TrajectoryError", "Turn", "TurnMeta", "VersionRun", "assign_reward",
            "canonical_json", "dump_routing", "dumps", "linearize", "loads", "message_to_dict",
            "render_tree", "same_message", "summarize", "tree_from_dict", "tree_to_dict",
            "turn_exclusions",
        ),
    ),
    "protocol_adapters": Pinned(
        (
            "AdapterConfig", "AdapterError", "AdapterServer", "AdminConfig", "ChatTemplate",
            "Checkpoint", "CheckpointError", "ContextTooLarge", "Engine", "ErrorKind",
            "GenerateChunk", "GenerateRequest", "GenerateResult", "ParserConfig",
            "QwenTokenizerConfig", "Renderer", "RendererConfig", "RolloutSampling",
            "RoutingCapture", "SGLangConfig", "SGLangEngine", "SamplingParams", "Session",
            "SessionLimits", "SideRequestRule", "TemplateMode", "TemplateRefused",
            "ToolCallFormat", "TurnTiming", "TurnTimings", "Vocabulary", "load_checkpoint",
            "load_qwen3_vocabulary", "qwen3_template", "reply_parsers", "serve",
        ),
        ("testing",),
    ),
    "sandbox": Pinned(
        (
            "CaptureLimits", "CapturedDiff", "ChangeTooLargeError", "CheckoutError",
            "DirectoryWorkspace", "E2BBackend", "E2BConfig", "E2BSandbox", "E2BTemplate",
            "EmptyWorkspace", "Enforcement", "ExecResult", "ForwardedEndpoint", "GitWorkspace",
            "ImageCache", "ImageCacheConfig", "ImageConfig", "ImageLease", "ImagePullError",
            "ImageSource", "ImageWorkspace", "InitGoneError", "KILLED_EXIT_CODE", "LocalBackend",
            "LocalConfig", "LocalSandbox", "OciLayoutImage", "Platform", "Process",
            "ReadOnlyBind", "RegistryCredentials", "RegistryImage", "ResourceLimits",
            "RetryPolicy", "RootfsImage", "Sandbox", "SandboxBackend", "SandboxBootError",
            "SandboxClosedError", "SandboxCommandError", "SandboxError",
            "SandboxFileNotFoundError", "SandboxSpec", "SandboxUnavailableError", "ScriptResult",
            "SetupFailedError", "UidRange", "UnsafePatchError", "UnsupportedSpecError",
            "apply_diff", "capture_diff", "checkout_repo", "run_setup", "validate_env",
        ),
        ("testing",),
    ),
    "harness": Pinned(
        (
            "AgentEndpoint", "AgentRun", "CLAUDE_CODE_CLI", "CODEX_CLI", "ClaudeCode",
            "ClaudeCodeTally", "CliMount", "Codex", "CodexTally", "DEFAULT_MOUNT_ROOT",
            "DEFAULT_STATE_ROOT", "EventStats", "EventTally", "Harness", "HarnessError",
            "InstallConfig", "InstallError", "InstallLockTimeoutError", "InstalledCli", "Launch",
            "LaunchError", "NpmCli", "NpmHarness", "install_cli", "install_once", "run_checked",
            "summarize_lines",
        ),
        ("testing",),
    ),
    "slime_backend": Pinned(
        (
            "AdapterSession", "AdapterSettings", "AgentSettings", "BackendSettings", "Budgets",
            "ConfigError", "ConversionError", "ConversionOptions", "Episode", "EpisodeHealth",
            "EpisodeOutcome", "EpisodeReward", "EpisodeSettings", "EpisodeStatus", "FieldError",
            "GateConfig", "GateReport", "JsonValue", "NAMESPACE", "Normalization",
            "SandboxSettings", "SilentFailureAlarm", "SlimeNotInstalled", "SlimeSample",
            "StaleAction", "StalenessPolicy", "WorkerSettings", "episode_samples",
            "evaluate_gates", "from_mapping", "normalized_rewards", "sample_class", "to_mapping",
        ),
        # Loaded by path: slime's four hooks, the launcher, the test kit.
        ("dynamic_filter", "gate_hook", "generate", "launcher", "reward_hook", "testing"),
    ),
    "slime_backend.launcher": Pinned(
        (
            "GATE_HOOK", "REFUSED_FLAGS", "REWARD_HOOK", "ROUTER_POLICY", "AdvantageEstimator",
            "ClusterShape", "DataConfig", "LaunchPlan", "ModelPaths", "RayJob", "RolloutConfig",
            "RunPaths", "RunnerConfig", "SlimeInstall", "SlimeRunner", "TrainConfig",
            "ray_submit_command", "survives_ray_entrypoint", "train_args", "train_command",
        ),
    ),
}  # fmt: skip


def package(name: str) -> ModuleType:
    return importlib.import_module(name)


@pytest.mark.parametrize("name", list(PINNED))
def test_exports_are_the_pinned_ones_and_resolve(name: str) -> None:
    module = package(name)
    assert sorted(module.__all__) == sorted(PINNED[name].exports)
    assert len(set(module.__all__)) == len(module.__all__)
    for export in module.__all__:
        assert getattr(module, export) is not None, export


@pytest.mark.parametrize("name", list(PINNED))
def test_nothing_else_public_is_visible(name: str) -> None:
    module = package(name)
    for export in module.__all__:
        getattr(module, export)  # a lazily loaded name lands in the namespace
    visible = {
        attribute
        for attribute, value in vars(module).items()
        if not attribute.startswith("_") and not isinstance(value, ModuleType)
    }
    plumbing = {"annotations", "TYPE_CHECKING"}  # from __future__ and typing imports
    assert visible - plumbing == set(module.__all__)


@pytest.mark.parametrize("name", list(PINNED))
def test_only_the_pinned_modules_have_public_names(name: str) -> None:
    module = package(name)
    (folder,) = (Path(p) for p in module.__path__)
    children = {
        child.stem
        for child in folder.iterdir()
        if child.suffix == ".py" or (child.is_dir() and any(child.glob("*.py")))
    }
    assert sorted(c for c in children if not c.startswith("_")) == sorted(
        PINNED[name].public_modules
    )


def test_protocol_adapters_tells_type_checkers_the_names_it_loads() -> None:
    """Its names load on first use; the TYPE_CHECKING imports are what mypy sees instead."""
    module = package("protocol_adapters")
    assert module.__file__ is not None
    tree = ast.parse(Path(module.__file__).read_text())
    checked = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    )
    imported = {
        alias.asname or alias.name
        for node in checked.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert imported == set(module.__all__)
