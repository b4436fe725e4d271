"""``trajectory-tree``: look at a saved session tree, its samples and its token accounting.

trajectory-tree show SESSION.json [--max-tokens N] [--policy full|split|final_branch] [--reward R]
trajectory-tree demo              # the bundled recorded agent session

A saved tree holds no grade: the samples are shown ungraded unless ``--reward`` gives the
episode's reward (an application keeps it beside the tree, e.g. swe-rl's run.json).
"""

from __future__ import annotations

import argparse
import math
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


def _sample_lines(lin: Linearization, graded: bool) -> list[str]:
    plural = "" if len(lin.samples) == 1 else "s"
    lines = [f"{len(lin.samples)} sample{plural}"]
    if not graded:
        lines[0] += " (ungraded: a saved tree holds no reward; --reward R assigns one)"
    for s in lin.samples:
        spans = ", ".join(f"{sp.reason}:{len(sp)}" for sp in s.spans[:8])
        more = f", … {len(s.spans) - 8} more spans" if len(s.spans) > 8 else ""
        reward = f", reward {s.reward}" if graded else ""
        lines.append(
            f"  sample {s.index}: {len(s.tokens)} tokens, prompt {s.prompt_length}, "
            f"trained {s.trained_tokens} (turns {', '.join(map(str, s.trained_turns))}), "
            f"leaf turn {s.leaf_turn}{reward}{' TRUNCATED' if s.truncated else ''}"
        )
        lines.append(f"    spans: {spans}{more}")
    lines += (f"  excluded: turn {e.turn}, {e.tokens} tokens, {e.reason}" for e in lin.exclusions)
    return lines


def report(
    tree: SessionTree,
    *,
    limit: LengthLimit | None,
    policy: RewardPolicy,
    reward: float | None = None,
) -> str:
    """The tree, its samples as ``policy`` keeps them (with ``reward`` assigned when one is
    given; a tree holds none) and the session summary."""
    from ._render import render_tree

    lin = assign_reward(
        linearize(tree, limit=limit),
        0.0 if reward is None else reward,
        rollout_id=tree.session_id or "demo",
        policy=policy,
    )
    summary = summarize(tree, lin).as_dict()
    body = [render_tree(tree), "", *_sample_lines(lin, reward is not None), "", "summary:"]
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
        p.add_argument(
            "--reward",
            type=_finite_float,
            default=None,
            metavar="R",
            help="the episode's reward, assigned to the samples by --policy (a saved tree "
            "holds none: without it the samples are shown ungraded)",
        )
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
    print(report(tree, limit=limit, policy=RewardPolicy(args.policy), reward=args.reward))
    return 0


def _finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


if __name__ == "__main__":
    sys.exit(main())
