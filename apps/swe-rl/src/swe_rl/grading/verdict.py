"""What grading concluded about one change, and why, as data that travels with the samples."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from slime_backend import JsonValue

MAX_TESTS_IN_SUMMARY = 200
PASSING_STATUSES = frozenset({"passed", "xpassed", "xfailed"})


class Verdict(StrEnum):
    """Why a change earned what it earned; only RESOLVED earns the reward."""

    RESOLVED = "resolved"
    """Every wanted test ran and passed."""
    UNRESOLVED = "unresolved"
    """The tests ran; at least one wanted test did not pass (or did not run)."""
    CHANGE_REFUSED = "change_refused"
    """The change as a whole was not applied: too large, unreadable as a patch, not what git
    would apply, or not applicable to the base."""
    TESTS_TIMED_OUT = "tests_timed_out"
    """The test run passed its time limit."""
    COLLECTION_ERROR = "collection_error"
    """The runner could not collect the tests (an import error, say)."""
    NO_REPORT = "no_report"
    """The run left no usable report (the code under test ended it, or wrote over it)."""


@dataclass(frozen=True, slots=True)
class GradeResult:
    verdict: Verdict
    reason: str
    """Why the verdict is what it is, in one line."""
    tests: Mapping[str, str]
    """Each FAIL_TO_PASS and PASS_TO_PASS test: passed, failed, error, skipped, xfailed,
    xpassed, or missing (not reported under its exact id)."""
    refused_paths: Mapping[str, str] = field(default_factory=dict)
    """Files of the change grading did not apply, and why (paths as text, `\\xNN` where a
    name is not UTF-8)."""
    timed_out: bool = False
    patch_applied: bool = False
    collection_errors: Mapping[str, str] = field(default_factory=dict)
    score: float | None = None
    """A verifier's own reward in [0, 1] (a Harbor task's reward file), when it gave one."""

    @property
    def reward(self) -> float:
        if self.verdict is Verdict.RESOLVED:
            return 1.0
        if self.verdict is Verdict.UNRESOLVED and self.score is not None:
            return self.score
        return 0.0

    @property
    def resolved(self) -> bool:
        return self.verdict is Verdict.RESOLVED

    def summary(self, max_tests: int = MAX_TESTS_IN_SUMMARY) -> dict[str, JsonValue]:
        """Plain JSON data (every sample's metadata, run.json, the viewer). Past `max_tests`
        wanted tests (a SWE-bench task can list thousands), only those that did not pass are
        listed one by one, and `tests_passing` counts the rest."""
        tests = dict(self.tests)
        passing = 0
        if len(tests) > max_tests:
            failing = {k: v for k, v in tests.items() if v not in PASSING_STATUSES}
            passing, tests = len(tests) - len(failing), failing
        return {
            "verdict": str(self.verdict),
            "reason": self.reason,
            "reward": self.reward,
            "resolved": self.resolved,
            "timed_out": self.timed_out,
            "patch_applied": self.patch_applied,
            "refused_paths": dict(self.refused_paths),
            "tests": tests,
            "tests_passing": passing,
            "collection_errors": {k: v[-1000:] for k, v in self.collection_errors.items()},
            "score": self.score,
        }
