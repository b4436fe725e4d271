"""Generated environment, config files and argv, checked setting by setting against the measured
facts in docs/clients.md (no process runs here; the sandbox tests and the cross-package CLI
tests show the CLIs accept them)."""

from __future__ import annotations

import shlex
import tomllib
from pathlib import Path, PurePosixPath

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness import (
    CODEX_CLI,
    DEFAULT_MOUNT_ROOT,
    AgentEndpoint,
    ClaudeCode,
    CliMount,
    Codex,
    InstalledCli,
    Launch,
    LaunchError,
    NpmCli,
)
from harness._claude_code import CLAUDE_CODE_CLI, MIN_AUTO_COMPACT_WINDOW
from harness._launch import MAX_ARGUMENT_BYTES

ENDPOINT = AgentEndpoint(
    base_url="http://127.0.0.1:8123", token="sess-abc123", model="policy-7b", context_window=32768
)
STATE = PurePosixPath("/var/tmp/agent-rl/run-1")
BIN = PurePosixPath("/opt/cli/bin/agent")


def test_claude_code_environment_is_exactly_the_measured_settings() -> None:
    plan = ClaudeCode().launch(bin_path=BIN, endpoint=ENDPOINT, task="fix it", state_dir=STATE)
    assert dict(plan.env) == {
        "ANTHROPIC_BASE_URL": "http://127.0.0.1:8123",
        "ANTHROPIC_AUTH_TOKEN": "sess-abc123",
        "IS_SANDBOX": "1",
        "HOME": "/var/tmp/agent-rl/run-1/home",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
        "CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL": "1",
        "CLAUDE_CODE_AUTO_COMPACT_WINDOW": "100000",
        "ANTHROPIC_MODEL": "policy-7b",
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": "policy-7b",
        "ANTHROPIC_DEFAULT_SONNET_MODEL": "policy-7b",
        "ANTHROPIC_DEFAULT_OPUS_MODEL": "policy-7b",
        "ANTHROPIC_SMALL_FAST_MODEL": "policy-7b",
        "CLAUDE_CODE_SUBAGENT_MODEL": "policy-7b",
    }
    assert "ANTHROPIC_API_KEY" in plan.unset_env
    assert plan.dirs == ("/var/tmp/agent-rl/run-1/home",)
    assert dict(plan.files) == {}


@pytest.mark.parametrize(
    ("context_window", "written"),
    [(32768, 100_000), (99_999, 100_000), (100_000, 100_000), (131072, 131072)],
)
def test_claude_code_never_writes_a_compact_window_it_would_raise(
    context_window: int, written: int
) -> None:
    # Claude Code raises a smaller window to its minimum (with a warning): below it, the
    # adapter's "prompt is too long" triggers compaction, so the minimum is written as is.
    endpoint = AgentEndpoint("http://127.0.0.1:1", "t", "m", context_window)
    env = ClaudeCode().environment(endpoint, STATE)
    assert int(env["CLAUDE_CODE_AUTO_COMPACT_WINDOW"]) == written >= MIN_AUTO_COMPACT_WINDOW


@pytest.mark.parametrize("max_turns", [None, 7])
def test_claude_code_argv(max_turns: int | None) -> None:
    plan = ClaudeCode(max_turns=max_turns).launch(
        bin_path=BIN, endpoint=ENDPOINT, task="-x fix it", state_dir=STATE
    )
    expected = [
        "/opt/cli/bin/agent",
        "-p",
        "--output-format",
        "stream-json",
        "--verbose",
        "--dangerously-skip-permissions",
        "--model",
        "policy-7b",
    ]
    if max_turns is not None:
        expected += ["--max-turns", "7"]
    assert list(plan.argv) == [*expected, "--", "-x fix it"]


def test_claude_code_keeps_a_path_prefix_of_the_base_url() -> None:
    endpoint = AgentEndpoint("http://10.0.0.2:9000/adapter/", "t", "m", 1000)
    assert ClaudeCode().environment(endpoint, STATE)["ANTHROPIC_BASE_URL"] == (
        "http://10.0.0.2:9000/adapter"
    )


def test_codex_config_toml_is_a_custom_responses_provider() -> None:
    plan = Codex().launch(bin_path=BIN, endpoint=ENDPOINT, task="fix it", state_dir=STATE)
    assert list(plan.files) == ["/var/tmp/agent-rl/run-1/codex-home/config.toml"]
    config = tomllib.loads(plan.files["/var/tmp/agent-rl/run-1/codex-home/config.toml"])
    assert config == {
        "model": "policy-7b",
        "model_provider": "agent_rl",
        "model_context_window": 32768,
        "model_auto_compact_token_limit": 20480,
        "tool_output_token_limit": 1024,
        "web_search": "disabled",
        "model_providers": {
            "agent_rl": {
                "name": "agent-rl adapter",
                "base_url": "http://127.0.0.1:8123/v1",
                "env_key": "AGENT_RL_SESSION_TOKEN",
                "wire_api": "responses",
            }
        },
        "analytics": {"enabled": False},
        "agents": {"enabled": False},
        "features": {"plugins": False, "goals": False},
    }
    assert dict(plan.env) == {
        "HOME": "/var/tmp/agent-rl/run-1/home",
        "CODEX_HOME": "/var/tmp/agent-rl/run-1/codex-home",
        "AGENT_RL_SESSION_TOKEN": "sess-abc123",
    }
    assert {"OPENAI_API_KEY", "OPENAI_BASE_URL"} <= set(plan.unset_env)
    assert list(plan.argv) == [
        "/opt/cli/bin/agent",
        "exec",
        "--config",
        'model_provider="agent_rl"',
        "--skip-git-repo-check",
        "--json",
        "--dangerously-bypass-approvals-and-sandbox",
        "--",
        "fix it",
    ]


@settings(deadline=None)
@given(
    model=st.text(st.characters(codec="utf-8"), min_size=1).filter(
        lambda s: s.strip() and "\0" not in s and "\n" not in s
    )
)
def test_codex_config_survives_any_model_name(model: str) -> None:
    endpoint = AgentEndpoint("http://127.0.0.1:1", "t", model, 100)
    assert tomllib.loads(Codex().config_toml(endpoint))["model"] == model


@settings(deadline=None)
@given(window=st.integers(min_value=1024, max_value=2_000_000))
def test_codex_compaction_headroom_holds_two_tool_outputs_and_a_summary(window: int) -> None:
    # Codex checks only the previous reply's usage: the output added before that check and
    # the one its compaction request carries must fit above the threshold, with the summary.
    compact_at, tool_output_limit = Codex().compaction_limits(window)
    worst_case_output = tool_output_limit * 4  # one engine token per byte at most
    assert window // 2 < compact_at
    assert compact_at + 3 * worst_case_output <= window


def test_codex_refuses_settings_it_deprecates_or_cannot_honour() -> None:
    with pytest.raises(ValueError, match=r"multi_agent is deprecated in Codex 0\.169\.0: set sub"):
        Codex(features={"multi_agent": False})
    with pytest.raises(ValueError, match="no room for two tool outputs"):
        Codex(auto_compact_ratio=0.9)
    with pytest.raises(ValueError, match=r"must be in \(0, 1\)"):
        Codex(tool_output_ratio=0)
    config = tomllib.loads(Codex(subagents=True).config_toml(ENDPOINT))
    assert config["agents"] == {"enabled": True}


def test_codex_never_uses_the_builtin_openai_provider() -> None:
    with pytest.raises(ValueError, match="built-in openai provider"):
        Codex(provider="openai")
    with pytest.raises(ValueError, match="plugins"):
        Codex(features={"plugins": True})
    with pytest.raises(ValueError, match="bare TOML key"):
        Codex(provider="a b")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("127.0.0.1:8000", "http"),
        ("ftp://h:1", "http"),
        ("http://h:1/v1", "/v1"),
        ("http://h:1?x=1", "query"),
    ],
)
def test_endpoint_refuses_bad_urls(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AgentEndpoint(url, "t", "m", 10)


def test_endpoint_refuses_bad_token_model_and_window() -> None:
    with pytest.raises(ValueError, match="token"):
        AgentEndpoint("http://h:1", "a b", "m", 10)
    with pytest.raises(ValueError, match="model"):
        AgentEndpoint("http://h:1", "t", " ", 10)
    with pytest.raises(ValueError, match="model"):
        AgentEndpoint("http://h:1", "t", "\ud800", 10)
    with pytest.raises(ValueError, match="context_window"):
        AgentEndpoint("http://h:1", "t", "m", 0)


@settings(deadline=None)
@given(task=st.text(min_size=1, max_size=200).filter(lambda s: "\0" not in s))
def test_shell_command_passes_the_task_through_verbatim(task: str) -> None:
    plan = ClaudeCode().launch(bin_path=BIN, endpoint=ENDPOINT, task=task, state_dir=STATE)
    words = shlex.split(plan.shell_command)
    assert words[:3] == ["mkdir", "-p", "--"]
    assert words[-2:] == [task, "</dev/null"] or words[-1] == "</dev/null"
    argv_start = words.index(str(BIN))
    assert words[argv_start:-1] == list(plan.argv)
    assert words[argv_start - 2 * len(plan.unset_env) : argv_start] == [
        w for name in plan.unset_env for w in ("-u", name)
    ]


def test_launch_refuses_what_the_kernel_cannot_pass() -> None:
    with pytest.raises(LaunchError, match="argv string"):
        Launch(argv=("x", "a" * MAX_ARGUMENT_BYTES), env={})
    with pytest.raises(LaunchError, match="NUL"):
        Launch(argv=("x", "a\0b"), env={})
    with pytest.raises(LaunchError, match="environment variable"):
        Launch(argv=("x",), env={"A=B": "1"})
    with pytest.raises(LaunchError, match="both set and unset"):
        Launch(argv=("x",), env={"CODEX_HOME": "/h"}, unset_env=("CODEX_HOME",))


def test_mount_paths() -> None:
    installed = InstalledCli(
        CODEX_CLI.spec, Path("/cache/openai+codex@0.169.0"), "node_modules/.bin/codex", "codex"
    )
    mount = CliMount.under(installed)
    assert mount.sandbox_prefix == DEFAULT_MOUNT_ROOT / "openai+codex@0.169.0"
    assert mount.bin_path == mount.sandbox_prefix / "node_modules/.bin/codex"
    assert mount.bind.host_path == installed.prefix
    assert mount.bind.sandbox_path == mount.sandbox_prefix
    assert CliMount.at_host_path(installed).bin_path == PurePosixPath(installed.bin_path)
    with pytest.raises(ValueError, match="absolute"):
        CliMount(installed, PurePosixPath("relative"))
    assert CLAUDE_CODE_CLI != CODEX_CLI


def test_a_mount_names_what_runs_as_its_host_program() -> None:
    """Codex's command is a node launcher: what runs (and is named for the sandbox to start on
    any image) is the static binary of the host's platform package it would start."""
    assert CODEX_CLI.program is not None
    assert CODEX_CLI.program.endswith("/bin/codex")
    assert CODEX_CLI.program.startswith("node_modules/@openai/codex-linux-")
    codex = InstalledCli(
        CODEX_CLI.spec, Path("/cache/codex"), "node_modules/.bin/codex", "codex", CODEX_CLI.program
    )
    mount = CliMount.under(codex)
    assert mount.program_path == mount.sandbox_prefix / CODEX_CLI.program
    assert mount.bind.host_programs == (CODEX_CLI.program,)
    claude = InstalledCli(CLAUDE_CODE_CLI.spec, Path("/cache/cc"), "node_modules/.bin/claude", "")
    assert CliMount.under(claude).program_path == CliMount.under(claude).bin_path
    assert CliMount.under(claude).bind.host_programs == ("node_modules/.bin/claude",)


@pytest.mark.parametrize("program", ["", "/abs/codex", "../codex", "a/../codex", "a//codex"])
def test_an_npm_program_is_a_path_inside_the_install(program: str) -> None:
    with pytest.raises(ValueError, match="inside the install"):
        NpmCli("@openai/codex", "0.169.0", bin="codex", program=program)


LOADER = ("/run/sandbox/runtime/ld-linux-x86-64.so.2", "--library-path", "/run/sandbox/runtime")


def test_started_through_the_loader_claude_code_leaves_grep_and_find_to_the_image() -> None:
    """Its own grep and find re-execute its binary, which through the loader is the loader;
    the flags go before the `--` that ends its options."""
    harness = ClaudeCode(max_turns=3)
    plan = harness.launch(bin_path=BIN, endpoint=ENDPOINT, task="-x fix it", state_dir=STATE)
    native = harness.started_by(plan, (str(BIN),))
    assert native == plan
    loaded = harness.started_by(plan, (*LOADER, str(BIN)))
    assert loaded.argv == (
        *LOADER,
        *plan.argv[:-2],
        "--allowedTools",
        "Grep,Glob",
        "--disallowedTools",
        "Grep,Glob",
        "--",
        "-x fix it",
    )
    assert (loaded.env, loaded.unset_env, loaded.dirs) == (plan.env, plan.unset_env, plan.dirs)


def test_a_static_codex_is_started_as_it_is() -> None:
    plan = Codex().launch(bin_path=BIN, endpoint=ENDPOINT, task="fix it", state_dir=STATE)
    assert Codex().started_by(plan, (str(BIN),)) == plan
    assert Codex().started_by(plan, ("/loader", str(BIN))).argv == ("/loader", *plan.argv)
