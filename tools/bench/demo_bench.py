"""The demo's throughput, and what an episode costs beyond the agent CLI's own run.

    uv run tools/bench/demo_bench.py [--concurrency 1,4,8] [--episodes-per-task 4]

Runs the real demo (apps/swe-rl: real Claude Code in local sandboxes, the real adapter, slime's
generate function over the scripted engine double, grading in fresh sandboxes) at each
concurrency and prints, side by side in one run:

- episodes per hour;
- per episode (median): the CLI's own run (the agent phase: launch to exit), the whole generate
  call, and the overhead beyond the CLI split into its parts: preparing the repository and the
  CLI mount, the sandbox (create and close), the task's setup, capturing the diff, grading in a
  fresh sandbox, the adapter session around the episode, and converting the tree into samples.

Target: overhead under 1 s per episode at 1 concurrent.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from swe_rl.demo.run import DemoOptions, demo

PARTS = ("repository", "sandbox", "setup", "diff", "grading", "session", "conversion")


def episode_costs(run_dir: Path) -> list[dict[str, float]]:
    """Per episode: the CLI's run, the generate call, and each part of the overhead (s)."""
    costs: list[dict[str, float]] = []
    for line in (run_dir / "samples.jsonl").read_text().splitlines():
        sample = json.loads(line)
        facts = sample["metadata"]["agent_rl"]["episode"]
        if facts["status"] != "completed" or sample["index"] in {c["index"] for c in costs}:
            continue
        phases = facts["artifacts"]["phases_s"]
        rollout = facts["rollout"]
        generate = rollout["run_s"] + rollout.get("convert_s", 0.0)
        cost: dict[str, Any] = {"index": sample["index"], "cli": phases["agent"]}
        cost.update({part: phases.get(part, 0.0) for part in PARTS[:5]})
        cost["session"] = rollout["run_s"] - rollout["app_s"]
        cost["conversion"] = rollout.get("convert_s", 0.0)
        cost["generate"] = generate
        cost["overhead"] = generate - phases["agent"]
        costs.append(cost)
    return costs


async def measure(
    concurrency: int, per_task: int, root: Path
) -> tuple[float, list[dict[str, float]]]:
    out = root / f"c{concurrency}"
    result, _ = await demo(
        DemoOptions(out, episodes_per_task=per_task, concurrency=concurrency),
        Console(quiet=True),
    )
    completed = sum(record.status == "completed" for record in result.records)
    return completed / result.duration_s * 3600, episode_costs(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,4,8")
    parser.add_argument("--episodes-per-task", type=int, default=4)
    args = parser.parse_args()
    levels = [int(level) for level in args.concurrency.split(",")]
    table = Table(title=f"demo episodes (load average {os.getloadavg()[0]:.1f} at start)")
    for column in (
        "concurrent",
        "episodes/h",
        "CLI run",
        "generate call",
        "overhead",
        *(f"- {part}" for part in PARTS),
    ):
        table.add_column(column, justify="right")
    with tempfile.TemporaryDirectory(prefix="demo-bench-") as tmp:
        for level in levels:
            per_hour, costs = asyncio.run(measure(level, args.episodes_per_task, Path(tmp)))
            median = {key: statistics.median(c[key] for c in costs) for key in costs[0]}
            table.add_row(
                str(level),
                f"{per_hour:,.0f}",
                f"{median['cli']:.2f} s",
                f"{median['generate']:.2f} s",
                f"{median['overhead']:.2f} s",
                *(f"{median[part]:.3f}" for part in PARTS),
            )
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
