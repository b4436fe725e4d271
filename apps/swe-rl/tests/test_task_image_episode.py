"""The real Claude Code in the SWE-bench fixture's image, end to end: through the real adapter
(a scripted policy as the engine double's model), started by the harness through the host's
loader on the image's root, fixing /testbed/calc.py with its Bash tool; the change is captured
against the image's repository and graded in a fresh sandbox from the image, earning 1."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from harness import ClaudeCode, InstallConfig
from protocol_adapters import AdapterConfig, SessionLimits, Vocabulary
from protocol_adapters.testing import ScriptedReply
from protocol_adapters.testing.prompt_tools import (
    find_shell_tool,
    offered_tools,
    replies_so_far,
)
from protocol_adapters.testing.stack import local_stack
from sandbox import LocalBackend, LocalConfig
from slime_backend import AdapterSession, Budgets, EpisodeStatus
from swe_rl.environment import image_cache_config
from swe_rl.episode import EpisodeConfig, SweEpisode
from swe_rl.swebench import ConversionOptions, convert_row

from .images import images_dir, swebench_image, swebench_row
from .test_task_images import FIXTURE_OPTIONS, vars_of

CONTEXT = 32768
FIX = (
    "python3 - <<'EOF'\n"
    "import pathlib\n"
    "p = pathlib.Path('calc.py')\n"
    "p.write_text(p.read_text().replace('return a - b', 'return a + b', 1))\n"
    "EOF\n"
    "git diff --stat"
)


class FixPolicy:
    """Reads calc.py, fixes add() with one shell command, and reports."""

    def __init__(self, vocabulary: Vocabulary) -> None:
        self.vocabulary = vocabulary

    def __call__(self, input_ids: Sequence[int]) -> ScriptedReply:
        prompt = self.vocabulary.decode(list(input_ids))
        tool = find_shell_tool(offered_tools(prompt))
        if tool is None:
            return ScriptedReply(text="No shell tool offered.")
        step = replies_so_far(prompt)
        if step == 0:
            return ScriptedReply(text="Reading calc.py.", tool_calls=[tool.call("cat calc.py")])
        if step == 1:
            return ScriptedReply(text="add() subtracts.", tool_calls=[tool.call(FIX)])
        return ScriptedReply(text="Fixed: add() adds.")


@pytest.mark.slow
async def test_claude_code_in_the_swebench_image_fixes_the_task_and_earns_1(
    qwen_vocabulary: Vocabulary, install_config: InstallConfig, tmp_path: Path
) -> None:
    swebench_image()
    options = ConversionOptions(**{**vars_of(FIXTURE_OPTIONS), "images_dir": images_dir()})
    metadata = convert_row(swebench_row(), options)["metadata"]
    (tmp_path / "state").mkdir()
    episode = SweEpisode(
        EpisodeConfig(
            artifacts_root=tmp_path / "artifacts",
            install=install_config,
            sources_cache=tmp_path / "sources",
        ),
        ClaudeCode(),
        LocalBackend(
            LocalConfig(state_root=tmp_path / "state", images=image_cache_config(tmp_path))
        ),
    )
    budgets = Budgets(wall_clock_s=180, max_turns=20, context_tokens=CONTEXT, max_new_tokens=2048)
    config = AdapterConfig(limits=SessionLimits(context_tokens=CONTEXT))
    async with local_stack(
        FixPolicy(qwen_vocabulary),
        tokenizer_cache=tmp_path,
        vocabulary=qwen_vocabulary,
        config=config,
    ) as stack:
        session = stack.server.sessions.open("calc-in-image")
        outcome = await episode(
            metadata,
            AdapterSession(stack.server.url, session.token, session.tree.session_id),
            budgets,
            evaluation=False,
        )
        await stack.server.close_session(session.token)
    assert outcome.status is EpisodeStatus.COMPLETED, outcome.reason
    assert outcome.artifacts["verdict"] == "resolved", outcome.reason
    assert outcome.reward == 1.0
    directory = Path(str(outcome.artifacts["dir"]))
    assert json.loads((directory / "summary.json").read_text())["changed_paths"] == ["calc.py"]
    assert b"+    return a + b" in (directory / "diff.patch").read_bytes()
