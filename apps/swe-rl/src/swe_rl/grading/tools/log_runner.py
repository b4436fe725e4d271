"""Run a repository's own test runner script for the grader and report what ITS REPORTER wrote.

Usage, inside the grading sandbox with the task's interpreter (Python 3.5 or newer: old
SWE-bench environments; so no f-strings here), from the repository root:

    python log_runner.py FRAMEWORK SCRIPT [ARGS...]

FRAMEWORK names the runner whose per-test lines an official log parser reads: "django"
(`tests/runtests.py`: unittest's verbose lines, `test_x (module.Class) ... ok`) or "sympy"
(`bin/test`: sympy's reporter, `test_x ok`). SCRIPT runs as `python SCRIPT ARGS` would run it.

A printed log cannot be trusted: the code under test can print `test_x (m.C) ... ok` as well
as the runner can. So the log handed to the parser holds only what the runner's reporter
wrote: sys.stdout and sys.stderr are replaced by writers that pass everything on to stderr
(the run's log, kept for people) and copy a write into the report only when the code that made
it is the reporter reporting a test: walking out from the writer, frames of the reporter's
module until one of its per-test methods (`addSuccess`, `test_pass`, ...). A write from
anywhere else (the code under test, the runner's summary of failures that quotes exception
messages, a subprocess writing to the descriptor) never reaches the report.

The report goes to the process's original stdout, kept aside (not inherited by programs the
tests start), as one line when the runner returns or exits:

    agent-rl-test-report {"runner": "log", "log": TEXT, "exit_code": N}

Nothing is written if the process dies first: the grader then has no report, which earns
nothing. What this cannot stop, code under test that calls the reporter itself or rewrites
the writers in-process, is in the app's docs/grading.md.
"""

# This file runs on the task's interpreter, Python 3.5 or newer: typing's generics, no f-strings.
# ruff: noqa: UP006, UP035

import json
import os
import runpy
import sys
from typing import Any, Iterable, List, Sequence

MARKER = "agent-rl-test-report "
#: The reporter's module(s), and its methods that report one test, per framework.
REPORTERS = {
    "django": (
        ("unittest.runner",),
        (
            "startTest",
            "addSuccess",
            "addError",
            "addFailure",
            "addSkip",
            "addExpectedFailure",
            "addUnexpectedSuccess",
            "addSubTest",
        ),
    ),
    "sympy": (
        ("sympy.testing.runtests", "sympy.utilities.runtests"),
        (
            "entering_filename",
            "leaving_filename",
            "entering_test",
            "test_pass",
            "test_fail",
            "test_exception",
            "test_xfail",
            "test_xpass",
            "import_error",
        ),
    ),
}
#: A skip's message is the code under test's (`skip("...")`) and may hold a forged line: its
#: status is left out of the report, as the parser ignores it anyway.
_MAX_DEPTH = 12


class Splitter:
    """A text stream writing to `out`, copying the reporter's per-test writes to `kept`."""

    def __init__(
        self, out: Any, kept: List[str], modules: Sequence[str], methods: Sequence[str]
    ) -> None:
        self._out = out
        self._kept = kept
        self._modules = frozenset(modules)
        self._methods = frozenset(methods)

    def _from_reporter(self) -> bool:
        frame = sys._getframe(2)  # type: Any  # the caller of write()
        depth = 0
        while frame is not None and depth < _MAX_DEPTH:
            if frame.f_globals.get("__name__") not in self._modules:
                return False
            if frame.f_code.co_name in self._methods:
                return True
            frame = frame.f_back
            depth += 1
        return False

    def write(self, text: Any) -> int:
        text = text if isinstance(text, str) else str(text)
        if self._from_reporter():
            self._kept.append(text)
        return int(self._out.write(text))

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self._out.flush()

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return int(self._out.fileno())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._out, name)


def main() -> int:
    framework, script, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    modules, methods = REPORTERS[framework]
    report = os.fdopen(os.dup(1), "wb")  # os.dup: not inherited by programs the tests run
    os.dup2(2, 1)
    kept = []  # type: List[str]
    sys.stdout = Splitter(sys.__stderr__, kept, modules, methods)
    sys.stderr = Splitter(sys.__stderr__, kept, modules, methods)
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.abspath(script)
    # As `python SCRIPT` would: the script's directory first, not ours, not the working one.
    sys.path[:] = [os.path.dirname(path)] + [
        entry for entry in sys.path if entry and os.path.abspath(entry) not in (here, os.getcwd())
    ]
    sys.argv = [script, *args]
    code = 0  # type: Any
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    document = {"runner": "log", "log": "".join(kept), "exit_code": code}
    report.write((MARKER + json.dumps(document) + "\n").encode("ascii"))
    report.flush()
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
