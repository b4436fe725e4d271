"""The README's dependency diagram is the one the members' pyprojects declare.

A diagram drawn by hand drifts (it once showed slime-backend importing harness, which it never
did); this reads both and compares them edge for edge.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PREFIX = "agent-rl-"


def declared() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for pyproject in [*ROOT.glob("packages/*/pyproject.toml"), *ROOT.glob("apps/*/pyproject.toml")]:
        project = tomllib.loads(pyproject.read_text())["project"]
        name = project["name"].removeprefix(PREFIX)
        requirements = project.get("dependencies", [])
        edges[name] = {
            re.split(r"[<>=!~ \[;]", r, maxsplit=1)[0].removeprefix(PREFIX)
            for r in requirements
            if r.startswith(PREFIX)
        }
    return edges


def drawn() -> dict[str, set[str]]:
    readme = (ROOT / "README.md").read_text()
    block = readme.split("```\nswe-rl (app)", 1)[1].split("```", 1)[0]
    edges: dict[str, set[str]] = {}
    for line in ("swe-rl (app)" + block).splitlines():
        name, _, targets = line.partition("──►")
        member = name.split()[0]
        edges[member] = {t.strip() for t in targets.split(",") if t.strip()}
    return edges


def test_the_readme_draws_the_declared_dependencies() -> None:
    assert drawn() == declared()
