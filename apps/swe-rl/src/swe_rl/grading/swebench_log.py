"""SWE-bench-family outcomes: the official harness's log parser, fed only what our runners saw.

The harness runs a repository's test command and parses its printed log with the parser for
that repository (`swebench.harness.log_parsers.MAP_REPO_TO_PARSER`). The test ids of the
datasets (FAIL_TO_PASS, PASS_TO_PASS) are that parser's keys, so the same parser must read our
runs for our verdicts to agree with the harness's. What it reads is never the printed log
(which the code under test writes into too):

- pytest repositories: our launcher's report (one JSON line on a private descriptor, exact node
  ids and outcomes) rendered as pytest's own `-rA` summary lines (`PASSED tests/x.py::test_y`),
  one per test, and nothing else;
- Django and SymPy: only what the runner's reporter wrote for each test, kept apart by
  tools/log_runner.py.

The verdict follows the harness's meaning of the parser's statuses: a FAIL_TO_PASS test must
be PASSED or XFAIL; a PASS_TO_PASS test must be PASSED or XFAIL, or SKIPPED (not a
regression). A skipped FAIL_TO_PASS test does not pass (swebench 4 left it out of the count,
so skipping every such test resolved a task; swebench 5 fixed that and so do we).

The `swebench` package (the app's `swebench` extra) is imported on first use, off the event
loop: it imports its whole harness, seconds the first time.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Mapping
from types import SimpleNamespace
from typing import Any

from swe_rl.grading.report import TestReport

Parser = Callable[[str, Any], dict[str, str]]

#: Our runners' statuses as pytest's `-rA` summary words (what the harness's pytest parsers
#: read); an xpassed test shows as XPASS there, which no parser counts as a pass.
_SUMMARY_WORDS = {
    "passed": "PASSED",
    "failed": "FAILED",
    "error": "ERROR",
    "skipped": "SKIPPED",
    "xfailed": "XFAIL",
    "xpassed": "XPASS",
}
#: The harness's statuses as ours (GradeResult.tests).
_OUR_STATUS = {
    "PASSED": "passed",
    "FAILED": "failed",
    "ERROR": "error",
    "SKIPPED": "skipped",
    "XFAIL": "xfailed",
}
F2P_PASSING = frozenset({"passed", "xfailed"})
P2P_PASSING = frozenset({"passed", "xfailed", "skipped"})

_lock = threading.Lock()


class ParserUnavailableError(RuntimeError):
    """The swebench package, or a parser for the task's repository, is not to be had."""


def load_parser(name: str) -> Parser:
    """The harness's parser for repository `name` ("owner/name"), or the parser function of
    that name (`parse_log_pytest`). Blocking (imports swebench): call it off the loop."""
    with _lock:
        try:
            parsers = importlib.import_module("swebench.harness.log_parsers")
        except ImportError as error:
            raise ParserUnavailableError(
                "grading SWE-bench tasks needs the swebench package "
                f"(install agent-rl-swe-rl[swebench]): {error}"
            ) from None
    by_repo: Mapping[str, Parser] = getattr(parsers, "MAP_REPO_TO_PARSER", {})
    if name in by_repo:
        return by_repo[name]
    if name.startswith("parse_log_"):
        for module in ("python", "javascript", "java", "go", "rust", "c", "php", "ruby"):
            found = getattr(_module(f"swebench.harness.log_parsers.{module}"), name, None)
            if callable(found):
                return found  # type: ignore[no-any-return]
    raise ParserUnavailableError(f"swebench has no log parser for {name!r}")


def _module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def pytest_summary(report: TestReport) -> str:
    """Our pytest report as the `-rA` summary lines pytest would print for it."""
    return "".join(
        f"{_SUMMARY_WORDS[status]} {test_id}\n" for test_id, status in report.tests.items()
    )


def parse(parser: Parser, log: str, repo: str, version: str = "") -> dict[str, str]:
    """The parser's status map of `log` (test id -> PASSED, FAILED, ...)."""
    spec = SimpleNamespace(repo=repo, version=version, instance_id="", log_parser="")
    return dict(parser(log, spec))


def outcomes(status_map: Mapping[str, str], wanted: tuple[str, ...]) -> dict[str, str]:
    """Each wanted test's status, in our words ("missing" when the parser did not name it)."""
    return {
        test_id: _OUR_STATUS.get(status_map[test_id], "error")
        if test_id in status_map
        else "missing"
        for test_id in wanted
    }


def failing(
    tests: Mapping[str, str], fail_to_pass: tuple[str, ...], pass_to_pass: tuple[str, ...]
) -> list[tuple[str, str]]:
    """The wanted tests that keep the change from resolving the task, with their status."""
    bad = [(t, tests[t]) for t in fail_to_pass if tests.get(t) not in F2P_PASSING]
    bad += [(t, tests[t]) for t in pass_to_pass if tests.get(t) not in P2P_PASSING]
    return bad
