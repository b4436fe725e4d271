"""The real Codex CLI, as a host process, through the real adapter (OpenAI Responses).

Codex sends its system prompt as developer messages, echoes reasoning items (with encrypted
content) and our item ids, and names its shell tool itself: the scripted model reads the tool
from the request instead of assuming it.
"""

from __future__ import annotations

from pathlib import Path

from harness import Codex, InstalledCli
from protocol_adapters import Vocabulary

from .cli_session import (
    POLICY_MODEL,
    assert_shell_session_recorded,
    codex_notices,
    explained,
    run_cli_session,
)
from .scripted_agent import FIRST_REASONING, ShellSessionAgent

UNKNOWN_MODEL_NOTICE = (
    "Model metadata for `{}` not found. Defaulting to fallback metadata; "
    "this can degrade performance and cause issues."
)


async def test_codex_tool_session_trains_exactly_engine_tokens(
    tmp_path: Path, codex_cli: InstalledCli, qwen_vocabulary: Vocabulary
) -> None:
    agent = ShellSessionAgent(qwen_vocabulary)
    done = await run_cli_session(Codex(), codex_cli, agent, tmp_path)
    with explained(done):
        assert_shell_session_recorded(done)
        turns = done.tree.turns
        assert {t.meta.extra["dialect"] for t in turns} == {"openai_responses"}
        # Codex echoes the reasoning item; the single chain above proves it matched.
        assert [r.text for r in turns[0].reply.reasoning] == [FIRST_REASONING]
        # Developer messages (Codex's system prompt) arrive as system messages.
        assert done.tree.request_messages(turns[0])[0].role == "system"
        assert done.events.main_agent_turns == 1  # one `codex exec` turn, three model calls
        # Nothing in the harness's config.toml is deprecated: Codex reports that as `error`
        # items in the event stream, where only the unknown model's notice may appear.
        assert codex_notices(done.run.stdout) == [UNKNOWN_MODEL_NOTICE.format(POLICY_MODEL)]
        assert b"deprecated" not in done.run.stderr.lower()
