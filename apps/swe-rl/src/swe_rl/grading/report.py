"""Test outcomes from a report: ours (one JSON line on the runner's stdout, tools/) or a task
command's JUnit XML.

Only the report decides, never a runner's printed output, which the code under test can
print too. A report is untrusted input (names and messages come from the code under test),
so it is size-bounded, JUnit is parsed without DTDs or entities, and every wanted test is
matched by one exact id: a pytest node id (file and test, `tests/test_x.py::TestC::test_y`)
or a unittest id (`module.Class.method`). A test that appears under another spelling, in
another file, does not count.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from xml.etree import ElementTree

MAX_REPORT_BYTES = 64 << 20
REPORT_MARKER = b"agent-rl-test-report "
_RANK = {"passed": 0, "xpassed": 0, "xfailed": 0, "skipped": 1, "failed": 2, "error": 3}


class ReportError(ValueError):
    """The report is too large or not in the expected format."""


@dataclass(frozen=True, slots=True)
class TestReport:
    tests: Mapping[str, str]
    """Status of every reported test, by exact id (worst of its runs)."""
    files: Mapping[str, str] = field(default_factory=dict)
    """The file each test lives in, where the runner said."""
    collection_errors: Mapping[str, str] = field(default_factory=dict)

    def outcomes(self, wanted: tuple[str, ...]) -> dict[str, str]:
        """Status of each wanted test; "missing" when the report does not name it exactly."""
        return {test_id: self.tests.get(test_id, "missing") for test_id in wanted}


def parse_json_report(data: bytes) -> TestReport:
    """The stdout of tools/pytest_runner.py or tools/unittest_runner.py: exactly one report
    line. Anything else there (a second report, say, written by a process the tests forked)
    makes the report unusable."""
    _check_size(data)
    if not data.startswith(REPORT_MARKER) or data.count(b"\n") != 1 or data[-1:] != b"\n":
        raise ReportError("the runner's output is not exactly one report line")
    try:
        document = json.loads(data[len(REPORT_MARKER) :])
    except ValueError as error:
        raise ReportError(f"report is not JSON: {error}") from None
    if not isinstance(document, dict):
        raise ReportError("report is not a JSON object")
    tests, files = {}, {}
    raw_tests = document.get("tests")
    if not isinstance(raw_tests, dict):
        raise ReportError("report has no tests object")
    for test_id, entry in raw_tests.items():
        status = entry.get("status") if isinstance(entry, dict) else None
        if status not in _RANK:
            raise ReportError(f"report gives {test_id!r} an unknown status {status!r}")
        tests[test_id] = status
        if isinstance(entry.get("file"), str):
            files[test_id] = entry["file"]
    errors = document.get("collection_errors", {})
    if not isinstance(errors, dict) or not all(isinstance(v, str) for v in errors.values()):
        raise ReportError("report's collection_errors is not an object of texts")
    return TestReport(tests, files, errors)


@dataclass(frozen=True, slots=True)
class LogReport:
    """What tools/log_runner.py kept of a runner's output: its reporter's per-test writes."""

    log: str
    exit_code: int


def parse_log_report(data: bytes) -> LogReport:
    """The stdout of tools/log_runner.py: exactly one report line holding the reporter's log."""
    _check_size(data)
    if not data.startswith(REPORT_MARKER) or data.count(b"\n") != 1 or data[-1:] != b"\n":
        raise ReportError("the runner's output is not exactly one report line")
    try:
        document = json.loads(data[len(REPORT_MARKER) :])
    except ValueError as error:
        raise ReportError(f"report is not JSON: {error}") from None
    if not isinstance(document, dict) or document.get("runner") != "log":
        raise ReportError("report is not a log runner's")
    log, code = document.get("log"), document.get("exit_code")
    if not isinstance(log, str) or not isinstance(code, int) or isinstance(code, bool):
        raise ReportError("report has no log text and exit code")
    return LogReport(log, code)


def parse_junit_report(data: bytes) -> TestReport:
    """A JUnit XML report (a task's own command). A case's id is its pytest node id when the
    report names its file (`file` attribute), else `classname.name`."""
    _check_size(data)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ReportError("report is not UTF-8") from None
    folded = text.lower()
    if "<!doctype" in folded or "<!entity" in folded:
        raise ReportError("report declares a DTD or entities")
    try:
        root = ElementTree.fromstring(data)
    except ElementTree.ParseError as error:
        raise ReportError(f"report is not XML: {error}") from None
    if root.tag not in ("testsuites", "testsuite"):
        raise ReportError(f"report root is <{root.tag}>, not a JUnit testsuite")
    tests: dict[str, str] = {}
    files: dict[str, str] = {}
    for element in root.iter("testcase"):
        test_id, file = _junit_id(element)
        status = _junit_status(element)
        if test_id not in tests or _RANK[status] > _RANK[tests[test_id]]:
            tests[test_id] = status
        if file:
            files[test_id] = file
    return TestReport(tests, files)


def _junit_id(element: ElementTree.Element) -> tuple[str, str | None]:
    classname, name = element.get("classname", ""), element.get("name", "")
    file = element.get("file")
    if file and file.endswith(".py"):
        module = file[: -len(".py")].replace("/", ".")
        if classname == module or classname.startswith(module + "."):
            classes = [part for part in classname[len(module) :].split(".") if part]
            return "::".join([file, *classes, name]), file
    return (f"{classname}.{name}" if classname else name), file


def _junit_status(element: ElementTree.Element) -> str:
    tags = {child.tag for child in element}
    for tag, status in (("error", "error"), ("failure", "failed"), ("skipped", "skipped")):
        if tag in tags:
            return status
    return "passed"


def _check_size(data: bytes) -> None:
    if len(data) > MAX_REPORT_BYTES:
        raise ReportError(f"report is larger than {MAX_REPORT_BYTES} bytes")
