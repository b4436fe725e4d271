"""Makes this directory's test-support modules (``session_kit``, ``invariants``) importable.

The workspace runs pytest with ``--import-mode=importlib``, which puts no test directory on
``sys.path``; test modules import their helpers by plain name instead.
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
