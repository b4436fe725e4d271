"""Claude Code (`@anthropic-ai/claude-code`) configured to talk only to the adapter.

Every setting below is a measured fact about the pinned version (docs/clients.md): the auth
token variable that becomes `Authorization: Bearer`, the variables that silence side traffic
and the per-request attribution header (its hash would change the system prompt every turn),
every model alias pointed at the policy (so a sub-agent asking for "haiku" still reaches it),
and the auto-compact window.

How compaction is triggered depends on the engine's context length. Claude Code compacts
proactively when the usage we report nears its auto-compact window, and reactively when a
request is refused with 400 "prompt is too long". It raises any window below 100,000 tokens
to 100,000 (with a warning), so on a smaller engine the proactive path never fires before
the engine is full: there the adapter's refusal, sent before anything is generated, is what
makes it compact. It then summarizes the older history and keeps the latest tool-use group
verbatim; a summarization request that is itself too long is retried shorter.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import PurePosixPath
from typing import Any, ClassVar

from harness._base import NpmHarness
from harness._config import AgentEndpoint, NpmCli
from harness._errors import LaunchError
from harness._events import EventTally, as_dict, as_list, as_str
from harness._launch import Launch

CLAUDE_CODE_CLI = NpmCli("@anthropic-ai/claude-code", "2.1.330", bin="claude")

#: Host variables that would authenticate or route Claude Code elsewhere.
_UNSET = (
    "ANTHROPIC_API_KEY",
    "CLAUDE_CODE_OAUTH_TOKEN",
    "CLAUDE_CONFIG_DIR",
    "CLAUDE_CODE_USE_BEDROCK",
    "CLAUDE_CODE_USE_VERTEX",
    "ANTHROPIC_CUSTOM_HEADERS",
)

_MODEL_VARIABLES = (
    "ANTHROPIC_MODEL",
    "ANTHROPIC_DEFAULT_HAIKU_MODEL",
    "ANTHROPIC_DEFAULT_SONNET_MODEL",
    "ANTHROPIC_DEFAULT_OPUS_MODEL",
    "ANTHROPIC_SMALL_FAST_MODEL",
    "CLAUDE_CODE_SUBAGENT_MODEL",
)

#: Claude Code's native build defines `grep` and `find` in its Bash tool's shell as its own
#: binary re-executed as ugrep and bfs (through `process.execPath`), and would run ripgrep the
#: same way for its Grep and Glob tools. Started through the host's loader on an image, its
#: `process.execPath` is that loader, which takes ugrep's arguments for its own: `grep` fails
#: (exit 127, measured). Naming Grep and Glob as allowed tools makes it leave `grep` and `find`
#: to the image's own; disallowing them keeps its tools what they are by default (no Grep and
#: Glob). The one difference the model sees: the Bash tool's description adds `find` and
#: `grep` to the commands it should avoid.
LOADER_SEARCH_FLAGS = ("--allowedTools", "Grep,Glob", "--disallowedTools", "Grep,Glob")

#: The smallest auto-compact window Claude Code honours; smaller values are raised to it.
MIN_AUTO_COMPACT_WINDOW = 100_000

#: The model name Claude Code gives its own synthetic (not model-generated) messages.
_SYNTHETIC_MODEL = "<synthetic>"


def auto_compact_window(context_window: int) -> int:
    """The engine's context length, or Claude Code's minimum where the engine is smaller
    (compaction there is triggered by the adapter's "prompt is too long"; module docstring)."""
    return max(context_window, MIN_AUTO_COMPACT_WINDOW)


@dataclass(frozen=True, slots=True)
class ClaudeCode(NpmHarness):
    """Claude Code in print mode (`-p`), streaming its events as JSON lines.

    max_turns: Claude Code's own turn cap (`--max-turns`); None leaves only our budget.
    """

    name: ClassVar[str] = "claude-code"
    cli: NpmCli = CLAUDE_CODE_CLI
    max_turns: int | None = None

    def __post_init__(self) -> None:
        if self.max_turns is not None and self.max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {self.max_turns}")

    def environment(self, endpoint: AgentEndpoint, home: PurePosixPath) -> dict[str, str]:
        env = {
            "ANTHROPIC_BASE_URL": endpoint.root,
            "ANTHROPIC_AUTH_TOKEN": endpoint.token,
            # Skipping permission prompts is refused as root unless the CLI knows it is sandboxed.
            "IS_SANDBOX": "1",
            "HOME": str(home),
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
            "CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL": "1",
            "CLAUDE_CODE_AUTO_COMPACT_WINDOW": str(auto_compact_window(endpoint.context_window)),
        }
        env.update(dict.fromkeys(_MODEL_VARIABLES, endpoint.model))
        return env

    def argv(self, bin_path: PurePosixPath, endpoint: AgentEndpoint, task: str) -> list[str]:
        argv = [
            str(bin_path),
            "-p",
            "--output-format",
            "stream-json",
            "--verbose",
            "--dangerously-skip-permissions",
            "--model",
            endpoint.model,
        ]
        if self.max_turns is not None:
            argv += ["--max-turns", str(self.max_turns)]
        # After `--` a task that begins with "-" is still the prompt, never an option.
        return [*argv, "--", task]

    def launch(
        self,
        *,
        bin_path: PurePosixPath,
        endpoint: AgentEndpoint,
        task: str,
        state_dir: PurePosixPath,
    ) -> Launch:
        home = state_dir / "home"
        return Launch(
            argv=tuple(self.argv(bin_path, endpoint, task)),
            env=self.environment(endpoint, home),
            unset_env=_UNSET,
            dirs=(str(home),),
        )

    def started_by(self, plan: Launch, command: Sequence[str]) -> Launch:
        """Through the host's loader, Claude Code leaves `grep` and `find` to the image's own
        (LOADER_SEARCH_FLAGS), before the `--` that ends its options."""
        started = NpmHarness.started_by(self, plan, command)
        if len(command) == 1:
            return started
        head, task = started.argv[:-2], started.argv[-2:]
        if task[0] != "--":
            raise LaunchError("a Claude Code plan ends with -- and the task")
        return replace(started, argv=(*head, *LOADER_SEARCH_FLAGS, *task))

    def new_tally(self) -> EventTally:
        return ClaudeCodeTally()


class ClaudeCodeTally(EventTally):
    """Reads `--output-format stream-json --verbose` events.

    One model reply arrives as several `assistant` events (one per content block) sharing
    the message id, so replies and tool calls are counted by distinct id. A sub-agent's
    events carry the `parent_tool_use_id` of the call that started it, and the stream shows
    only some of them (a foreground sub-agent's final reply never), so only the main agent's
    replies are counted as its turns. The final `result` event carries the answer, or
    `is_error` with the reason; until then, the last `api_retry` event says why the CLI is
    stuck retrying a model call.
    """

    def __init__(self) -> None:
        super().__init__()
        self._main_replies: set[str] = set()
        self._tool_ids: set[str] = set()

    def observe(self, event: Mapping[str, Any]) -> None:
        kind = as_str(event.get("type"))
        if kind == "assistant":
            from_main_agent = event.get("parent_tool_use_id") is None
            self._observe_reply(as_dict(event.get("message")), from_main_agent=from_main_agent)
        elif kind == "result":
            self._observe_result(event)
        elif kind == "system" and event.get("subtype") == "api_retry":
            # The CLI retrying a failed model call: if the run ends before a result (a budget
            # kill), this is the only account of why it was stuck.
            status = event.get("error_status")
            error = as_str(event.get("error")) or "error"
            attempt, limit = event.get("attempt"), event.get("max_retries")
            self.error = f"model call failed ({error}, HTTP {status}), retry {attempt} of {limit}"

    def _observe_reply(self, message: Mapping[str, Any], *, from_main_agent: bool) -> None:
        message_id = as_str(message.get("id"))
        if message_id is None or message.get("model") == _SYNTHETIC_MODEL:
            return
        if from_main_agent:
            self._main_replies.add(message_id)
            self.main_agent_turns = len(self._main_replies)
        for item in as_list(message.get("content")):
            block = as_dict(item)
            tool_id = as_str(block.get("id"))
            if block.get("type") == "tool_use" and tool_id is not None:
                self._tool_ids.add(tool_id)
        self.tool_calls = len(self._tool_ids)

    def _observe_result(self, event: Mapping[str, Any]) -> None:
        text = as_str(event.get("result"))
        if event.get("is_error") is True:
            reasons = [r for r in as_list(event.get("errors")) if isinstance(r, str)]
            subtype = as_str(event.get("subtype")) or "error"
            self.error = "; ".join(reasons) or text or subtype
            self.result_text = None
        else:
            self.result_text = text
            self.error = None
