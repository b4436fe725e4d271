"""Run standard-library unittest tests for the grader and report each one's exact id.

Usage, inside the grading sandbox with the task's interpreter (Python 3.7 or newer), from the
repository root:

    python3 unittest_runner.py IDS_FILE

IDS_FILE holds the wanted test ids (`module.Class.method`), one per line. Started as a script,
Python puts this file's directory first on the import path; the repository is added *last*,
so a repository file named like a module of the standard library never replaces it.

The report goes to the original stdout as one line, as pytest_runner.py writes it (see there
why): each test's status (passed, failed, error, skipped, xfailed, xpassed) and file, and as
collection errors the names that could not be loaded. Standard library only.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
import unittest
from typing import Any

MARKER = "agent-rl-test-report "
_RANK = {"passed": 0, "xpassed": 0, "xfailed": 0, "skipped": 1, "failed": 2, "error": 3}


class Recorder(unittest.TestResult):
    def __init__(self, root: str) -> None:
        super().__init__()
        self.root = root
        self.tests: dict[str, dict[str, str]] = {}
        self.collection_errors: dict[str, str] = {}

    def _record(self, test: unittest.TestCase, status: str, detail: str = "") -> None:
        test_id = test.id()
        if type(test).__name__ == "_FailedTest":  # the loader could not import the name
            self.collection_errors[test_id.rpartition(".")[2]] = detail[-4000:]
            return
        current = self.tests.get(test_id)
        if current is None or _RANK[status] > _RANK[current["status"]]:
            self.tests[test_id] = {"status": status, "file": self._file(test)}

    def _file(self, test: unittest.TestCase) -> str:
        module = sys.modules.get(type(test).__module__)
        path = getattr(module, "__file__", None) or ""
        return os.path.relpath(os.path.abspath(path), self.root) if path else ""

    def addSuccess(self, test: unittest.TestCase) -> None:
        self._record(test, "passed")

    def addFailure(self, test: unittest.TestCase, err: Any) -> None:
        self._record(test, "failed", _describe(err))

    def addError(self, test: unittest.TestCase, err: Any) -> None:
        self._record(test, "error", _describe(err))

    def addSkip(self, test: unittest.TestCase, reason: str) -> None:
        self._record(test, "skipped", reason)

    def addExpectedFailure(self, test: unittest.TestCase, err: Any) -> None:
        self._record(test, "xfailed")

    def addUnexpectedSuccess(self, test: unittest.TestCase) -> None:
        self._record(test, "xpassed")


def _describe(err: Any) -> str:
    return "".join(traceback.format_exception(*err)) if err and err[1] is not None else ""


def main() -> int:
    ids_file = sys.argv[1]
    report = os.fdopen(os.dup(1), "wb")  # os.dup: not inherited by programs the tests run
    os.dup2(2, 1)
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.getcwd()
    sys.path[:] = [here] + [
        entry for entry in sys.path if entry and os.path.abspath(entry) not in (root, here)
    ]
    sys.path.append(root)
    with open(ids_file, encoding="utf-8") as lines:
        names = [line.strip() for line in lines if line.strip()]
    recorder = Recorder(root)
    suite = unittest.TestSuite()
    for name in names:
        try:
            suite.addTest(unittest.defaultTestLoader.loadTestsFromName(name))
        except Exception:  # a module that does not even import (a SyntaxError, say)
            recorder.collection_errors[name] = traceback.format_exc()[-4000:]
    suite.run(recorder)
    document = {
        "runner": "unittest",
        "tests": recorder.tests,
        "collection_errors": recorder.collection_errors,
        "exit_code": 0,
    }
    report.write((MARKER + json.dumps(document) + "\n").encode("ascii"))
    report.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
