"""Grading a policy cannot game (see grader.py and the app's docs/grading.md)."""

from swe_rl.grading.grader import (
    EnvironmentFailure,
    GradingError,
    GradingLimits,
    GradingLog,
    grade,
)
from swe_rl.grading.rules import ChangeRules
from swe_rl.grading.verdict import GradeResult, Verdict

__all__ = [
    "ChangeRules",
    "EnvironmentFailure",
    "GradeResult",
    "GradingError",
    "GradingLimits",
    "GradingLog",
    "Verdict",
    "grade",
]
