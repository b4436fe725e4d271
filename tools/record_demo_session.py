"""Record the session bundled with ``trajectory-tree demo``: the real Claude Code CLI, on this
host, through the real adapter, against the SGLang-wire engine double (scripted replies: a shell
tool call, a parallel pair, a final answer), saved as a trajectory tree.

    uv run tools/record_demo_session.py               # rewrites the bundled demo_session.json
    uv run tools/record_demo_session.py --out x.json  # writes it elsewhere

It reuses the cross-package test session (tests/cli_session.py), so what the demo shows is what
CI checks. Needs npm (the CLI installs into ~/.cache/agent-rl/npm on first use).
"""

from __future__ import annotations

import argparse
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
from tests.scripted_agent import ShellSessionAgent  # noqa: E402
from trajectory_tree import dumps, linearize, render_tree  # noqa: E402


async def record(out: Path) -> None:
    cache = Path.home() / ".cache" / "agent-rl"
    installed = await install_cli(CLAUDE_CODE_CLI, InstallConfig(cache / "npm"))
    vocabulary = load_qwen3_vocabulary(QwenTokenizerConfig(cache / "qwen3-tokenizer"))
    agent = ShellSessionAgent(vocabulary)
    with tempfile.TemporaryDirectory() as tmp:
        done = await run_cli_session(ClaudeCode(), installed, agent, Path(tmp))
        assert_shell_session_recorded(done)
    tree = done.tree
    tree.session_id = "claude-code-demo"
    out.write_text(dumps(tree))
    print(render_tree(tree))
    shown = out.relative_to(ROOT) if out.is_relative_to(ROOT) else out
    print(
        f"{len(linearize(tree).samples)} sample(s); wrote {shown} "
        f"({out.stat().st_size // 1024} KiB)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=OUT,
        metavar="FILE",
        help=f"where the tree goes (default: {OUT.relative_to(ROOT)})",
    )
    args = parser.parse_args(argv)
    asyncio.run(record(args.out.resolve()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
