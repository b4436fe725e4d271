"""``trajectory-tree``: look at a saved session tree, its samples and its token accounting.

trajectory-tree show SESSION.json [--max-tokens N] [--policy full|split|final_branch]
trajectory-tree demo              # the bundled recorded agent session
"""

from __future__ import annotations

import argparse
import sys
from importlib import resources
from pathlib import Path

from ._errors import FormatError
from ._linearize import LengthLimit, LengthMode, Linearization, linearize
from ._rewards import RewardPolicy, assign_reward
from ._serialize import loads
from ._summary import summarize
from ._tree import SessionTree

DEMO = "demo_session.json"


def _sample_lines(lin: Linearization) -> list[str]:
    plural = "" if len(lin.samples) == 1 else "s"
    lines = [f"{len(lin.samples)} sample{plural}"]
    for s in lin.samples:
        spans = ", ".join(f"{sp.reason}:{len(sp)}" for sp in s.spans[:8])
        more = f", … {len(s.spans) - 8} more spans" if len(s.spans) > 8 else ""
        lines.append(
            f"  sample {s.index}: {len(s.tokens)} tokens, prompt {s.prompt_length}, "
            f"trained {s.trained_tokens} (turns {', '.join(map(str, s.trained_turns))}), "
            f"leaf turn {s.leaf_turn}, reward {s.reward}{' TRUNCATED' if s.truncated else ''}"
        )
        lines.append(f"    spans: {spans}{more}")
    lines += (f"  excluded: turn {e.turn}, {e.tokens} tokens, {e.reason}" for e in lin.exclusions)
    return lines


def report(tree: SessionTree, *, limit: LengthLimit | None, policy: RewardPolicy) -> str:
    """The tree, its samples (with a placeholder reward of 1.0) and the session summary."""
    from ._render import render_tree

    lin = assign_reward(
        linearize(tree, limit=limit), 1.0, rollout_id=tree.session_id or "demo", policy=policy
    )
    summary = summarize(tree, lin).as_dict()
    body = [render_tree(tree), "", *_sample_lines(lin), "", "summary:"]
    body += [f"  {key}: {value}" for key, value in summary.items()]
    return "\n".join(body)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trajectory-tree", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    show = sub.add_parser("show", help="print a saved tree (trajectory_tree.dumps output)")
    show.add_argument("path", type=Path)
    demo = sub.add_parser("demo", help="print the bundled recorded agent session")
    for p in (show, demo):
        p.add_argument("--max-tokens", type=int, default=None, help="sample length limit")
        p.add_argument("--drop", action="store_true", help="drop over-length samples, not truncate")
        p.add_argument("--policy", choices=[str(p) for p in RewardPolicy], default="full")
    args = parser.parse_args(argv)

    if args.command == "demo":
        text = resources.files("trajectory_tree").joinpath(DEMO).read_text(encoding="utf-8")
    else:
        try:
            text = args.path.read_text(encoding="utf-8")
        except OSError as exc:
            parser.error(f"cannot read {args.path}: {exc.strerror}")
    try:
        tree = loads(text)
    except FormatError as exc:
        print(f"trajectory-tree: {exc}", file=sys.stderr)
        return 2
    limit = None
    if args.max_tokens is not None:
        mode = LengthMode.DROP if args.drop else LengthMode.TRUNCATE
        limit = LengthLimit(args.max_tokens, mode)
    print(report(tree, limit=limit, policy=RewardPolicy(args.policy)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
