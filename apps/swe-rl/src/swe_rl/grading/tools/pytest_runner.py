"""Run pytest for the grader and report the exact node id and outcome of every test.

Usage, inside the grading sandbox with the task's interpreter (Python 3.7 or newer):

    python3 pytest_runner.py PYTEST_ARGS...

The grader builds PYTEST_ARGS (runners.py): an explicit configuration file (`-c`), the rootdir,
plugin autoloading off and the task's plugins named. Started as a script, Python puts this
file's directory first on the import path, not the repository (`python -m pytest` puts the
working directory first on every Python that ignores PYTHONSAFEPATH, and a repository file
named `pytest.py` would then be pytest); the working directory is taken off the path as well.
The recorder is handed to pytest as a plugin object, so nothing is imported by name.

The report goes to the process's original stdout, and only the report: that descriptor is
kept aside (not inherited by any program the tests start), and stdout becomes stderr for
pytest and the code under test. No file holds the report, so no process the tests leave
behind can rewrite or replace it; the grader kills them all before reading it anyway. At the
end of the session one line is written:

    agent-rl-test-report {"runner": "pytest", "tests": {NODE_ID: {"status": S, "file": F}},
                          "collection_errors": {NODE_ID: TEXT}, "exit_code": N}

S is passed, failed, error (setup or teardown failed), skipped, xfailed or xpassed; F is the
file the test function lives in, relative to the rootdir. Nothing is written if the process
dies first: the grader then has no report, which earns nothing.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

MARKER = "agent-rl-test-report "
NO_PYTEST = 70
_RANK = {"passed": 0, "xpassed": 0, "xfailed": 0, "skipped": 1, "failed": 2, "error": 3}


class Recorder:
    """A pytest plugin collecting every test's worst outcome and every collection error."""

    def __init__(self, report: Any) -> None:
        self.report = report
        self.tests: dict[str, dict[str, str]] = {}
        self.collection_errors: dict[str, str] = {}
        self.exit_code: int | None = None

    def pytest_collectreport(self, report: Any) -> None:
        if report.failed:
            self.collection_errors[report.nodeid or "<session>"] = str(report.longrepr)[-4000:]

    def pytest_runtest_logreport(self, report: Any) -> None:
        status = _status(report)
        if status is None:
            return
        current = self.tests.get(report.nodeid)
        if current is None or _RANK[status] > _RANK[current["status"]]:
            self.tests[report.nodeid] = {"status": status, "file": str(report.location[0])}

    def pytest_sessionfinish(self, session: Any, exitstatus: Any) -> None:
        self.exit_code = int(exitstatus)

    def write(self) -> None:
        document = {
            "runner": "pytest",
            "tests": self.tests,
            "collection_errors": self.collection_errors,
            "exit_code": self.exit_code,
        }
        self.report.write((MARKER + json.dumps(document) + "\n").encode("ascii"))
        self.report.flush()


def _status(report: Any) -> str | None:
    """The outcome one phase's report says, or None for a setup or teardown that passed."""
    xfail = hasattr(report, "wasxfail")
    if report.when == "call":
        if report.skipped:
            return "xfailed" if xfail else "skipped"
        if report.passed:
            return "xpassed" if xfail else "passed"
        return "failed"
    if report.failed:
        return "error"
    if report.skipped:
        return "xfailed" if xfail else "skipped"
    return None


def main() -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    cwd = os.getcwd()
    sys.path[:] = [here] + [
        entry for entry in sys.path if entry and os.path.abspath(entry) not in (cwd, here)
    ]
    report = os.fdopen(os.dup(1), "wb")  # os.dup: not inherited by programs the tests run
    os.dup2(2, 1)
    try:
        import pytest  # the task environment's, never ours
    except ImportError:
        sys.stderr.write(f"pytest is not installed for {sys.executable}\n")
        return NO_PYTEST

    recorder = Recorder(report)
    code = int(pytest.main(sys.argv[1:], plugins=[recorder]))
    recorder.exit_code = code
    recorder.write()
    return code


if __name__ == "__main__":
    sys.exit(main())
