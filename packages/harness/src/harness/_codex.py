"""Codex (`@openai/codex`) configured to talk only to the adapter.

Codex reads its provider from `$CODEX_HOME/config.toml`. The built-in openai provider is
never used: it ignores base-URL overrides and retries the public API forever. A custom
provider speaks `wire_api = "responses"` (the only one left) and sends the session token,
taken from the variable named by `env_key`, as a Bearer token. The model name must be one
Codex does not know; a catalog name would switch it to a tool-less "code mode".

Compaction. Codex compacts (locally, through the same endpoint) when the usage reported for
its previous reply reaches `model_auto_compact_token_limit`; a refusal for length does not
make it compact, the turn fails. It checks nothing else: the tool outputs of the reply that
stayed under the limit are added before the next check, and the compaction request carries
the outputs of the reply that crossed it. So the room above the limit must hold two tool
outputs and the summary. Codex caps each tool output in history at `tool_output_token_limit`
of its own tokens, which it counts as 4 bytes each; the engine's tokenizer needs at most one
token per byte (digits are one token each in Qwen's). The defaults give one tool output at
most 1/8 of the window and compact at 5/8 of it. Measured facts: docs/clients.md.
"""

from __future__ import annotations

import platform
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, ClassVar

from harness._base import NpmHarness
from harness._config import AgentEndpoint, NpmCli
from harness._events import EventTally, as_dict, as_str
from harness._launch import Launch

#: Codex's command (bin/codex.js) is a node launcher that executes the static (musl,
#: static-pie) binary of the host's platform package; starting that binary directly needs no
#: node, libc or loader wherever it runs (measured: the same requests as through the launcher).
_PLATFORM_BINARIES = {
    "x86_64": "node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex",
    "aarch64": (
        "node_modules/@openai/codex-linux-arm64/vendor/aarch64-unknown-linux-musl/bin/codex"
    ),
}

CODEX_CLI = NpmCli(
    "@openai/codex", "0.169.0", bin="codex", program=_PLATFORM_BINARIES.get(platform.machine())
)

#: Host variables that would authenticate or route Codex elsewhere.
_UNSET = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "CODEX_API_KEY")

#: Codex counts a tool output's tokens as its length in bytes divided by this.
CODEX_BYTES_PER_TOKEN = 4

#: `[features]` keys Codex 0.169.0 deprecates: each prints a notice on every run.
_DEPRECATED_FEATURES = {"multi_agent": "set subagents instead (`[agents] enabled`)"}

#: Item types of `codex exec --json` that are messages or notices, not tool invocations.
_NON_TOOL_ITEMS = frozenset({"agent_message", "reasoning", "error", "user_message"})


def _toml_string(value: str) -> str:
    """A TOML basic string: quote and backslash escaped, control characters as \\uXXXX,
    everything else literal (the file is UTF-8)."""
    value.encode("utf-8")  # a lone surrogate cannot be written: fail here, clearly
    escaped = []
    for char in value:
        if char in {'"', "\\"}:
            escaped.append("\\" + char)
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            escaped.append(f"\\u{ord(char):04X}")
        else:
            escaped.append(char)
    return '"' + "".join(escaped) + '"'


def _toml_bool(value: bool) -> str:
    return "true" if value else "false"


def _toml_key(value: str) -> str:
    if not value or not all(c.isascii() and (c.isalnum() or c in "_-") for c in value):
        raise ValueError(f"not a bare TOML key: {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class Codex(NpmHarness):
    """`codex exec` with JSON events, approvals and its own sandbox bypassed (ours is the
    isolation; Codex's own sandboxed modes fail inside it).

    auto_compact_ratio: compaction triggers once a reply's reported usage reaches this
    fraction of the context window. tool_output_ratio: the most one tool output may take of
    the window, counted at one engine token per byte (the worst case); the room above the
    compaction threshold must hold three of them (module docstring). subagents: Codex's
    sub-agent tools (`[agents] enabled`), off by default. features: `[features]` switches;
    `plugins = false` is always set (plugin sync is network traffic), the default also drops
    the goal tools.
    """

    name: ClassVar[str] = "codex"
    cli: NpmCli = CODEX_CLI
    provider: str = "agent_rl"
    token_variable: str = "AGENT_RL_SESSION_TOKEN"
    auto_compact_ratio: float = 0.625
    tool_output_ratio: float = 0.125
    subagents: bool = False
    features: Mapping[str, bool] = field(default_factory=lambda: {"goals": False})

    def __post_init__(self) -> None:
        _toml_key(self.provider)
        if self.provider == "openai":
            raise ValueError("the built-in openai provider must never be used")
        if not 0 < self.auto_compact_ratio < 1 or not 0 < self.tool_output_ratio < 1:
            raise ValueError(
                "auto_compact_ratio and tool_output_ratio must be in (0, 1), got "
                f"{self.auto_compact_ratio} and {self.tool_output_ratio}"
            )
        if self.auto_compact_ratio + 3 * self.tool_output_ratio > 1:
            raise ValueError(
                f"above a compaction threshold of {self.auto_compact_ratio} of the window there "
                f"is no room for two tool outputs of {self.tool_output_ratio} and the summary: "
                "auto_compact_ratio + 3 * tool_output_ratio must be at most 1"
            )
        if not self.token_variable.isidentifier():
            raise ValueError(f"not an environment variable name: {self.token_variable!r}")
        for key in self.features:
            _toml_key(key)
            if key in _DEPRECATED_FEATURES:
                raise ValueError(
                    f"[features] {key} is deprecated in Codex {self.cli.version}: "
                    f"{_DEPRECATED_FEATURES[key]}"
                )
        if self.features.get("plugins", False):
            raise ValueError("plugins must stay disabled (they fetch from the network)")

    def compaction_limits(self, context_window: int) -> tuple[int, int]:
        """(model_auto_compact_token_limit, tool_output_token_limit) for an engine context:
        the first in engine tokens, the second in Codex's own 4-byte tokens."""
        compact_at = max(1, int(context_window * self.auto_compact_ratio))
        tool_output_bytes = int(context_window * self.tool_output_ratio)
        return compact_at, max(1, tool_output_bytes // CODEX_BYTES_PER_TOKEN)

    def config_toml(self, endpoint: AgentEndpoint) -> str:
        window = endpoint.context_window
        compact_at, tool_output_limit = self.compaction_limits(window)
        features = {"plugins": False, **self.features}
        lines = [
            f"model = {_toml_string(endpoint.model)}",
            f"model_provider = {_toml_string(self.provider)}",
            f"model_context_window = {window}",
            f"model_auto_compact_token_limit = {compact_at}",
            f"tool_output_token_limit = {tool_output_limit}",
            'web_search = "disabled"',
            "",
            f"[model_providers.{self.provider}]",
            'name = "agent-rl adapter"',
            f"base_url = {_toml_string(endpoint.root + '/v1')}",
            f"env_key = {_toml_string(self.token_variable)}",
            'wire_api = "responses"',
            "",
            "[analytics]",
            "enabled = false",
            "",
            "[agents]",
            f"enabled = {_toml_bool(self.subagents)}",
            "",
            "[features]",
            *(f"{key} = {_toml_bool(on)}" for key, on in features.items()),
        ]
        return "\n".join(lines) + "\n"

    def environment(
        self, endpoint: AgentEndpoint, home: PurePosixPath, codex_home: PurePosixPath
    ) -> dict[str, str]:
        return {
            "HOME": str(home),
            "CODEX_HOME": str(codex_home),
            self.token_variable: endpoint.token,
        }

    def argv(self, bin_path: PurePosixPath, task: str) -> list[str]:
        return [
            str(bin_path),
            "exec",
            # Fail closed: should config.toml ever go unread (a wrong CODEX_HOME), Codex
            # exits with "provider not found" instead of falling back to the public API.
            "--config",
            f"model_provider={_toml_string(self.provider)}",
            "--skip-git-repo-check",
            "--json",
            "--dangerously-bypass-approvals-and-sandbox",
            # After `--` a task that begins with "-" is still the prompt, never an option.
            "--",
            task,
        ]

    def launch(
        self,
        *,
        bin_path: PurePosixPath,
        endpoint: AgentEndpoint,
        task: str,
        state_dir: PurePosixPath,
    ) -> Launch:
        home = state_dir / "home"
        codex_home = state_dir / "codex-home"
        return Launch(
            argv=tuple(self.argv(bin_path, task)),
            env=self.environment(endpoint, home, codex_home),
            unset_env=_UNSET,
            dirs=(str(home), str(codex_home)),
            files={str(codex_home / "config.toml"): self.config_toml(endpoint)},
        )

    def new_tally(self) -> EventTally:
        return CodexTally()


class CodexTally(EventTally):
    """Reads `codex exec --json` events.

    Model requests are not visible one by one, so `main_agent_turns` counts `turn.started`.
    Every item that is not a message, reasoning or a notice is a tool invocation
    (command_execution, file_change, mcp_tool_call, ...), counted once by item id. The
    last `agent_message` is the answer; `turn.failed` or a top-level `error` not followed by
    a completed turn is the failure.
    """

    def __init__(self) -> None:
        super().__init__()
        self._tool_ids: set[str] = set()

    def observe(self, event: Mapping[str, Any]) -> None:
        kind = as_str(event.get("type"))
        if kind == "turn.started":
            self.main_agent_turns += 1
        elif kind in {"item.started", "item.updated", "item.completed"}:
            self._observe_item(as_dict(event.get("item")), completed=kind == "item.completed")
        elif kind == "turn.completed":
            # Codex reports transient trouble ("Reconnecting...") as `error` events; a turn
            # that completes afterwards recovered from it.
            self.error = None
        elif kind == "turn.failed":
            self.error = as_str(as_dict(event.get("error")).get("message")) or "turn failed"
        elif kind == "error":
            self.error = as_str(event.get("message")) or "error"

    def _observe_item(self, item: Mapping[str, Any], *, completed: bool) -> None:
        item_type = as_str(item.get("type"))
        item_id = as_str(item.get("id"))
        if item_type is None:
            return
        if item_type not in _NON_TOOL_ITEMS and item_id is not None:
            self._tool_ids.add(item_id)
            self.tool_calls = len(self._tool_ids)
        elif item_type == "agent_message" and completed:
            self.result_text = as_str(item.get("text"))
