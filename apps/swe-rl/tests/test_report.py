"""Reading test reports: our runners' one JSON line, and a task command's JUnit XML; every
wanted test matched by its exact id, everything malformed refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from swe_rl.grading import report
from swe_rl.grading.report import (
    REPORT_MARKER,
    ReportError,
    parse_json_report,
    parse_junit_report,
)

X = "tests/test_x.py"
STATUSES = ("passed", "xpassed", "xfailed", "skipped", "failed", "error")


def line(document: object) -> bytes:
    return REPORT_MARKER + json.dumps(document).encode() + b"\n"


GOOD = {
    "runner": "pytest",
    "tests": {
        f"{X}::test_a": {"status": "passed", "file": X},
        f"{X}::TestC::test_b[1-2]": {"status": "failed", "file": X},
        "test_calc.TestAdd.test_add": {"status": "xfailed"},
    },
    "collection_errors": {"tests/test_y.py": "ImportError: no module named y"},
    "exit_code": 1,
}


# -- our runners' report -----------------------------------------------------------------------


def test_one_report_line_is_read() -> None:
    parsed = parse_json_report(line(GOOD))
    assert parsed.tests == {
        f"{X}::test_a": "passed",
        f"{X}::TestC::test_b[1-2]": "failed",
        "test_calc.TestAdd.test_add": "xfailed",
    }
    assert parsed.files == {f"{X}::test_a": X, f"{X}::TestC::test_b[1-2]": X}
    assert parsed.collection_errors == {"tests/test_y.py": "ImportError: no module named y"}


def test_every_status_is_read_and_collection_errors_are_optional() -> None:
    tests = {f"t{i}": {"status": status} for i, status in enumerate(STATUSES)}
    parsed = parse_json_report(line({"tests": tests}))
    assert parsed.tests == {f"t{i}": status for i, status in enumerate(STATUSES)}
    assert parsed.collection_errors == {}


REPORT = line(GOOD)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "not exactly one report line"),
        (b"\n", "not exactly one report line"),
        (REPORT[:-1], "not exactly one report line"),
        (REPORT + REPORT, "not exactly one report line"),
        (REPORT + b"trailing garbage", "not exactly one report line"),
        (REPORT + b"trailing garbage\n", "not exactly one report line"),
        (REPORT[:-1] + b" trailing garbage\n", "report is not JSON"),
        (REPORT[:-1] + b"}\n", "report is not JSON"),
        (b"PASSED 3 tests\n" + REPORT, "not exactly one report line"),
        (REPORT_MARKER + b"\n", "report is not JSON"),
        (REPORT_MARKER + b"{not json}\n", "report is not JSON"),
        (b" " + REPORT, "not exactly one report line"),
        (REPORT.replace(b"agent-rl-test-report", b"agent-rl-test-REPORT"), "not exactly"),
        (line([GOOD]), "not a JSON object"),
        (line({"runner": "pytest"}), "has no tests object"),
        (line({"tests": [f"{X}::test_a"]}), "has no tests object"),
        (line({"tests": {"t": {"status": "PASSED"}}}), "unknown status 'PASSED'"),
        (line({"tests": {"t": {"status": "missing"}}}), "unknown status 'missing'"),
        (line({"tests": {"t": {"status": "ok"}}}), "unknown status 'ok'"),
        (line({"tests": {"t": {}}}), "unknown status None"),
        (line({"tests": {"t": "passed"}}), "unknown status None"),
        (line({"tests": {}, "collection_errors": ["x"]}), "collection_errors"),
        (line({"tests": {}, "collection_errors": {"x": 1}}), "collection_errors"),
    ],
    ids=lambda value: value[:60] if isinstance(value, bytes) else value,
)
def test_anything_but_exactly_one_report_line_is_refused(data: bytes, message: str) -> None:
    with pytest.raises(ReportError, match=message):
        parse_json_report(data)


def test_a_marker_line_followed_by_a_second_report_is_refused() -> None:
    """A process the tests fork could print a report of its own after the runner's."""
    forged = line({"tests": {f"{X}::test_a": {"status": "passed"}}})
    with pytest.raises(ReportError, match="not exactly one report line"):
        parse_json_report(REPORT_MARKER + b"\n" + forged)
    with pytest.raises(ReportError, match="not exactly one report line"):
        parse_json_report(line({"tests": {}}) + forged)


def test_a_report_over_the_size_limit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    data = line({"tests": {"t": {"status": "passed"}}})
    monkeypatch.setattr(report, "MAX_REPORT_BYTES", len(data))
    assert parse_json_report(data).tests == {"t": "passed"}
    monkeypatch.setattr(report, "MAX_REPORT_BYTES", len(data) - 1)
    with pytest.raises(ReportError, match=f"larger than {len(data) - 1} bytes"):
        parse_json_report(data)


def test_the_default_size_limit_is_64_megabytes() -> None:
    assert report.MAX_REPORT_BYTES == 64 << 20


def test_a_test_not_reported_under_its_exact_id_is_missing() -> None:
    parsed = report.TestReport({f"{X}::test_a": "passed", f"{X}::TestC::test_b": "xfailed"})
    wanted = (
        f"{X}::test_a",
        f"{X}::TestC::test_b",
        f"./{X}::test_a",
        "test_x.py::test_a",
        f"{X}::test_a[1]",
        f"{X}::TestC::test_a",
        f"{X}::test_A",
        "tests.test_x.test_a",
    )
    assert parsed.outcomes(wanted) == {
        f"{X}::test_a": "passed",
        f"{X}::TestC::test_b": "xfailed",
        f"./{X}::test_a": "missing",
        "test_x.py::test_a": "missing",
        f"{X}::test_a[1]": "missing",
        f"{X}::TestC::test_a": "missing",
        f"{X}::test_A": "missing",
        "tests.test_x.test_a": "missing",
    }


# -- a task command's JUnit XML ----------------------------------------------------------------

XUNIT1 = f"""<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="1" failures="1" skipped="1" tests="5">
<testcase classname="tests.test_x.TestC" name="test_y" file="{X}" line="3" time="0.001" />
<testcase classname="tests.test_x.TestC.Inner" name="test_n" file="{X}" line="7" />
<testcase classname="tests.test_x" name="test_p[a.b-1::2]" file="{X}" line="9">
  <failure message="assert 1 == 2">AssertionError</failure></testcase>
<testcase classname="tests.test_x" name="test_s" file="{X}" line="12">
  <skipped type="pytest.skip" message="no" /></testcase>
<testcase classname="tests.test_x" name="test_e" file="{X}" line="15">
  <error message="fixture failed" /></testcase>
<testcase classname="tests.test_x" name="test_out" file="{X}" line="18">
  <system-out>FAILED</system-out><system-err>error</system-err></testcase>
</testsuite></testsuites>
""".encode()


def test_a_pytest_xunit1_report_maps_to_node_ids() -> None:
    parsed = parse_junit_report(XUNIT1)
    assert parsed.tests == {
        f"{X}::TestC::test_y": "passed",
        f"{X}::TestC::Inner::test_n": "passed",
        f"{X}::test_p[a.b-1::2]": "failed",
        f"{X}::test_s": "skipped",
        f"{X}::test_e": "error",
        f"{X}::test_out": "passed",
    }
    assert set(parsed.files.values()) == {X}
    assert parsed.collection_errors == {}


def test_without_a_file_the_id_is_classname_dot_name() -> None:
    data = b"""<testsuite>
    <testcase classname="test_calc.TestAdd" name="test_add" />
    <testcase classname="tests.test_x" name="test_y" file="tests/data.txt" />
    <testcase name="bare" />
    </testsuite>"""
    parsed = parse_junit_report(data)
    assert parsed.tests == {
        "test_calc.TestAdd.test_add": "passed",
        "tests.test_x.test_y": "passed",
        "bare": "passed",
    }
    assert parsed.files == {"tests.test_x.test_y": "tests/data.txt"}


def test_a_case_in_another_file_does_not_match_the_wanted_node_id() -> None:
    """Its classname is the wanted test's module, but its file is not the wanted test's."""
    data = b"""<testsuite>
    <testcase classname="tests.test_x" name="test_y" file="other/test_x.py" />
    <testcase classname="tests.test_x.TestC" name="test_z" file="tests/test_xy.py" />
    <testcase classname="tests.test_xy" name="test_w" file="tests/test_x.py" />
    </testsuite>"""
    parsed = parse_junit_report(data)
    wanted = (f"{X}::test_y", f"{X}::TestC::test_z", f"{X}::test_w", "tests/test_xy.py::test_w")
    assert parsed.outcomes(wanted) == dict.fromkeys(wanted, "missing")
    assert parsed.tests == {
        "tests.test_x.test_y": "passed",
        "tests.test_x.TestC.test_z": "passed",
        "tests.test_xy.test_w": "passed",
    }


@pytest.mark.parametrize(
    ("statuses", "worst"),
    [
        (["", "<failure/>"], "failed"),
        (["<failure/>", ""], "failed"),
        (["<skipped/>", ""], "skipped"),
        (["<failure/>", "<error/>", ""], "error"),
        (["<error/>", "<failure/>"], "error"),
        (["<skipped/>", "<failure/>", "<skipped/>"], "failed"),
        (["", ""], "passed"),
    ],
)
def test_a_test_reported_twice_counts_by_its_worst_run(statuses: list[str], worst: str) -> None:
    cases = "".join(
        f'<testcase classname="tests.test_x" name="test_y" file="{X}">{child}</testcase>'
        for child in statuses
    )
    parsed = parse_junit_report(f"<testsuites><testsuite>{cases}</testsuite></testsuites>".encode())
    assert parsed.tests == {f"{X}::test_y": worst}


def test_a_case_with_failure_and_skipped_children_is_failed() -> None:
    data = b'<testsuite><testcase name="t"><skipped/><failure/></testcase></testsuite>'
    assert parse_junit_report(data).tests == {"t": "failed"}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            b'<?xml version="1.0"?><!DOCTYPE testsuite><testsuite><testcase name="t"/></testsuite>',
            "DTD or entities",
        ),
        (
            b'<?xml version="1.0"?>\n<!doctype testsuite SYSTEM "http://example.invalid/x.dtd">'
            b"<testsuite/>",
            "DTD or entities",
        ),
        (
            b'<!DOCTYPE t [<!ENTITY a "&#38;#38;">]><testsuite><testcase name="&a;"/></testsuite>',
            "DTD or entities",
        ),
        (b"<testsuite><!ENTITY x></testsuite>", "DTD or entities"),
        (b"<html><testcase name='t'/></html>", "report root is <html>"),
        (b"<testcase name='t'/>", "report root is <testcase>"),
        (b"", "report is not XML"),
        (b"agent-rl-test-report {}\n", "report is not XML"),
        (b"<testsuite><testcase></testsuite>", "report is not XML"),
    ],
)
def test_a_junit_report_that_is_not_plain_junit_is_refused(data: bytes, message: str) -> None:
    with pytest.raises(ReportError, match=message):
        parse_junit_report(data)


def test_a_junit_report_over_the_size_limit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    data = b'<testsuite><testcase name="t"/></testsuite>'
    monkeypatch.setattr(report, "MAX_REPORT_BYTES", len(data))
    assert parse_junit_report(data).tests == {"t": "passed"}
    monkeypatch.setattr(report, "MAX_REPORT_BYTES", len(data) - 1)
    with pytest.raises(ReportError, match="larger than"):
        parse_junit_report(data)


def test_real_pytest_xunit1_junit_maps_to_its_node_ids(tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "__init__.py").write_text("")
    (tests / "test_x.py").write_text(
        "import pytest\n\n"
        "class TestC:\n    def test_y(self):\n        pass\n\n"
        "    class TestInner:\n        def test_n(self):\n            assert False\n\n"
        "@pytest.mark.parametrize('v', ['a.b', 'c::d'])\ndef test_p(v):\n    pass\n\n"
        "@pytest.mark.skip\ndef test_s():\n    pass\n"
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\njunit_family = xunit1\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--junitxml=out.xml", "tests"],
        cwd=tmp_path,
        env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTEST_ADDOPTS": ""},
        capture_output=True,
        check=False,
    )
    assert done.returncode == 1, done.stdout.decode()
    assert parse_junit_report((tmp_path / "out.xml").read_bytes()).tests == {
        f"{X}::TestC::test_y": "passed",
        f"{X}::TestC::TestInner::test_n": "failed",
        f"{X}::test_p[a.b]": "passed",
        f"{X}::test_p[c::d]": "passed",
        f"{X}::test_s": "skipped",
    }


# -- bugs ------------------------------------------------------------------------------------


ENTITY_REPORT = (
    '<?xml version="1.0" encoding="UTF-16"?>'
    '<!DOCTYPE testsuite [<!ENTITY name "test_y">]>'
    '<testsuite><testcase classname="c" name="&name;"/></testsuite>'
)


def test_a_utf16_report_declaring_an_entity_is_refused() -> None:
    with pytest.raises(ReportError):
        parse_junit_report(ENTITY_REPORT.encode("utf-16"))


def test_a_dtd_after_a_long_comment_is_refused() -> None:
    data = (
        '<?xml version="1.0"?><!--' + "x" * 5000 + "-->"
        f'<!DOCTYPE testsuite [<!ATTLIST testcase file CDATA "{X}">]>'
        '<testsuite><testcase classname="tests.test_x" name="test_y"/></testsuite>'
    ).encode()
    with pytest.raises(ReportError):
        parse_junit_report(data)
