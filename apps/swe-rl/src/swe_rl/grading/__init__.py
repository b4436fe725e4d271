"""Tamper-proof grading of an agent's change (see grader.py and the app's docs/grading.md)."""

from swe_rl.grading.grader import GradeResult, GradingError, GradingLog, grade
from swe_rl.grading.protected import ProtectedPaths

__all__ = ["GradeResult", "GradingError", "GradingLog", "ProtectedPaths", "grade"]
