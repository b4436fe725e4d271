"""Record the session bundled with ``trajectory-tree demo``: the real Claude Code CLI, on this
host, through the real adapter, against the SGLang-wire engine double (scripted replies: a shell
tool call, a parallel pair, a final answer), saved as a trajectory tree.

    uv run tools/record_demo_session.py   # rewrites packages/trajectory-tree/.../demo_session.json

It reuses the cross-package test session (tests/cli_session.py), so what the demo shows is what
CI checks. Needs npm (the CLI installs into ~/.cache/agent-rl/npm on first use).
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "packages/trajectory-tree/src/trajectory_tree/demo_session.json"
sys.path.insert(0, str(ROOT))

from harness import CLAUDE_CODE_CLI, ClaudeCode, InstallConfig, install_cli  # noqa: E402
from protocol_adapters import QwenTokenizerConfig, load_qwen3_vocabulary  # noqa: E402
from tests.cli_session import assert_shell_session_recorded, run_cli_session  # noqa: E402
from trajectory_tree import dumps, linearize, render_tree  # noqa: E402


async def record() -> None:
    cache = Path.home() / ".cache" / "agent-rl"
    installed = await install_cli(CLAUDE_CODE_CLI, InstallConfig(cache / "npm"))
    vocabulary = load_qwen3_vocabulary(QwenTokenizerConfig(cache / "qwen3-tokenizer"))
    with tempfile.TemporaryDirectory() as tmp:
        done = await run_cli_session(ClaudeCode(), installed, vocabulary, Path(tmp))
        assert_shell_session_recorded(done)
    tree = done.tree
    tree.session_id = "claude-code-demo"
    OUT.write_text(dumps(tree))
    print(render_tree(tree))
    print(
        f"{len(linearize(tree).samples)} sample(s); wrote {OUT.relative_to(ROOT)} "
        f"({OUT.stat().st_size // 1024} KiB)"
    )


if __name__ == "__main__":
    asyncio.run(record())
