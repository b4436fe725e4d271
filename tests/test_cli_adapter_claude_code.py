"""The real Claude Code CLI, as a host process, through the real adapter.

Claude Code sends what no hand-written client does (``thinking``, ``context_management``,
``output_config``, ``role: "system"`` messages mid-history, tool inputs re-serialized, parallel
results in completion order); the session must still come out as one bridged chain whose
trained tokens are exactly the engine's.
"""

from __future__ import annotations

from pathlib import Path

from harness import ClaudeCode, InstalledCli
from protocol_adapters import Vocabulary

from .cli_session import assert_shell_session_recorded, explained, run_cli_session
from .scripted_agent import FIRST_REASONING, ShellSessionAgent


async def test_claude_code_tool_session_trains_exactly_engine_tokens(
    tmp_path: Path, claude_code_cli: InstalledCli, qwen_vocabulary: Vocabulary
) -> None:
    agent = ShellSessionAgent(qwen_vocabulary)
    done = await run_cli_session(ClaudeCode(), claude_code_cli, agent, tmp_path)
    with explained(done):
        assert_shell_session_recorded(done)
        assert [tool.name for tool in done.agent.shell_tools] == ["Bash", "Bash"]
        turns = done.tree.turns
        assert {t.meta.extra["dialect"] for t in turns} == {"anthropic"}
        # Claude Code echoes the first reply's thinking; the single chain above proves it matched.
        assert [r.text for r in turns[0].reply.reasoning] == [FIRST_REASONING]
        # Its environment listing arrives as a role "system" message inside the history.
        first_request = done.tree.request_messages(turns[0])
        assert [m.role for m in first_request].count("system") >= 2
        assert done.events.main_agent_turns == len(turns)
