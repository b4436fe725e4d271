"""Opt-in: regenerate the pinned facts from a real slime checkout and compare.

    AGENT_RL_SLIME_CHECKOUT=/path/to/slime uv run pytest packages/slime-backend -m slime_checkout

The path is a work tree or a bare git directory. Skipped without it: slime is not on PyPI and
this machine has no copy. Run it whenever the pinned commit moves.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

PACKAGE = Path(__file__).resolve().parent.parent
TOOL = PACKAGE / "tools" / "slime_contract.py"
DATA = PACKAGE / "tests" / "data" / "slime_contract.json"
CHECKOUT = os.environ.get("AGENT_RL_SLIME_CHECKOUT")

pytestmark = [
    pytest.mark.slime_checkout,
    pytest.mark.skipif(not CHECKOUT, reason="set AGENT_RL_SLIME_CHECKOUT to a slime checkout"),
]


def tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("slime_contract_tool", TOOL)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_checked_in_facts_are_the_checkouts() -> None:
    assert CHECKOUT
    pinned = json.loads(DATA.read_text())
    checkout = tool().Checkout(Path(CHECKOUT))
    fresh = tool().extract(
        checkout, pinned["mounted"], list(pinned["flag_defaults"]), list(pinned["rollout_sources"])
    )
    assert fresh == pinned


def test_the_tool_reports_no_drift() -> None:
    assert CHECKOUT
    result = subprocess.run(
        [sys.executable, str(TOOL), CHECKOUT, "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(DATA.read_text())["slime_commit"] in result.stdout
