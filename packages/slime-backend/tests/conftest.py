"""Makes this directory's test-support modules (``episode_kit``) importable by plain name.

The workspace runs pytest with ``--import-mode=importlib``, which puts no test directory on
``sys.path``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "slime_checkout: compares pinned facts with a real slime checkout "
        "(set AGENT_RL_SLIME_CHECKOUT to a work tree or bare git dir; skipped otherwise)",
    )
