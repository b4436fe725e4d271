"""Run standard-library unittest tests and write a JUnit XML report.

Usage: python3 unittest_junit.py REPORT [TEST_ID ...]   (no ids: discover tests from ".")

For tasks whose tests need nothing beyond the standard library (the demo's): the grader copies
this file into the grading sandbox, outside the repository, and offers its path as
$GRADING_TOOLS/unittest_junit.py. Standard library only; it runs inside the sandbox.
"""

import sys
import traceback
import unittest
from types import TracebackType
from xml.etree import ElementTree

_ExcInfo = tuple[type[BaseException], BaseException, TracebackType] | tuple[None, None, None]


class _Recorder(unittest.TestResult):
    def __init__(self) -> None:
        super().__init__()
        self.cases: list[tuple[str, str, str, str]] = []

    def _record(self, test: unittest.TestCase, status: str, detail: str = "") -> None:
        module_class, _, method = test.id().rpartition(".")
        self.cases.append((module_class, method, status, detail))

    def addSuccess(self, test: unittest.TestCase) -> None:
        self._record(test, "passed")

    def addFailure(self, test: unittest.TestCase, err: _ExcInfo) -> None:
        self._record(test, "failure", _describe(err))

    def addError(self, test: unittest.TestCase, err: _ExcInfo) -> None:
        self._record(test, "error", _describe(err))

    def addSkip(self, test: unittest.TestCase, reason: str) -> None:
        self._record(test, "skipped", reason)

    def addExpectedFailure(self, test: unittest.TestCase, err: object) -> None:
        self._record(test, "passed")

    def addUnexpectedSuccess(self, test: unittest.TestCase) -> None:
        self._record(test, "failure", "unexpected success")


def _describe(err: _ExcInfo) -> str:
    return "".join(traceback.format_exception(err[1])) if err[1] is not None else ""


def main() -> int:
    report, names = sys.argv[1], sys.argv[2:]
    sys.path.insert(0, ".")
    loader = unittest.defaultTestLoader
    suite = loader.loadTestsFromNames(names) if names else loader.discover(".")
    recorder = _Recorder()
    suite.run(recorder)
    root = ElementTree.Element("testsuite", name="unittest", tests=str(len(recorder.cases)))
    for classname, name, status, detail in recorder.cases:
        case = ElementTree.SubElement(root, "testcase", classname=classname, name=name)
        if status != "passed":
            ElementTree.SubElement(case, status).text = detail[-4000:]
    ElementTree.ElementTree(root).write(report, encoding="utf-8", xml_declaration=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
