"""Test outcomes from a JUnit XML report (what pytest's --junitxml and our unittest runner write).

Only the report decides: never a test runner's printed output, which the code under test can
print too. A report is untrusted input (its names and messages come from the code under test),
so it is size-bounded and parsed without DTDs or entities.
"""

from __future__ import annotations

from dataclasses import dataclass
from xml.etree import ElementTree

MAX_REPORT_BYTES = 64 << 20


class ReportError(ValueError):
    """The report is missing, too large, or not JUnit XML."""


@dataclass(frozen=True, slots=True)
class TestCase:
    classname: str
    name: str
    file: str | None
    status: str
    """passed, failed, error or skipped."""

    def ids(self) -> set[str]:
        """Every spelling a task may use for this test: pytest node ids, unittest ids and
        Django's `name (module.Class)`."""
        ids = {self.name, f"{self.classname}.{self.name}", f"{self.name} ({self.classname})"}
        parts = self.classname.split(".") if self.classname else []
        for split in range(1, len(parts) + 1):
            module, classes = parts[:split], parts[split:]
            ids.add("::".join(["/".join(module) + ".py", *classes, self.name]))
        if self.file:
            classes = [p for p in parts if p and p[0].isupper()]
            ids.add("::".join([self.file, *classes, self.name]))
        return ids


def parse_report(report: bytes) -> list[TestCase]:
    if len(report) > MAX_REPORT_BYTES:
        raise ReportError(f"report is larger than {MAX_REPORT_BYTES} bytes")
    head = report[:4096].lower()
    if b"<!doctype" in head or b"<!entity" in report.lower():
        raise ReportError("report declares a DTD or entities")
    try:
        root = ElementTree.fromstring(report)
    except ElementTree.ParseError as error:
        raise ReportError(f"report is not XML: {error}") from None
    if root.tag not in ("testsuites", "testsuite"):
        raise ReportError(f"report root is <{root.tag}>, not a JUnit testsuite")
    return [_case(element) for element in root.iter("testcase")]


def _case(element: ElementTree.Element) -> TestCase:
    tags = {child.tag for child in element}
    status = "passed"
    for tag in ("error", "failure", "skipped"):
        if tag in tags:
            status = {"failure": "failed"}.get(tag, tag)
            break
    return TestCase(
        classname=element.get("classname", ""),
        name=element.get("name", ""),
        file=element.get("file"),
        status=status,
    )


def outcomes(cases: list[TestCase], wanted: tuple[str, ...]) -> dict[str, str]:
    """Status of each wanted test; a test reported several times counts by its worst run,
    and a test the report does not mention is "missing"."""
    rank = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}
    by_id: dict[str, str] = {}
    for case in cases:
        for test_id in case.ids():
            current = by_id.get(test_id)
            if current is None or rank[case.status] > rank[current]:
                by_id[test_id] = case.status
    return {test_id: by_id.get(test_id, "missing") for test_id in wanted}
