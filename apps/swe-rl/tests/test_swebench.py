"""SWE-bench rows (its public field names, lists JSON-encoded as in the published datasets)
become task rows graded by the pytest runner; rows pytest does not run are skipped with a
reason."""

from __future__ import annotations

import json
from pathlib import Path

from swe_rl.swebench import ConversionOptions, convert_row, convert_rows
from swe_rl.task import PytestRunner, parse_task

TEST_PATCH = """\
diff --git a/astropy/io/tests/test_fits.py b/astropy/io/tests/test_fits.py
--- a/astropy/io/tests/test_fits.py
+++ b/astropy/io/tests/test_fits.py
@@ -1,2 +1,3 @@
 import pytest
+
 def test_header(): pass
"""

ROW = {
    "repo": "astropy/astropy",
    "instance_id": "astropy__astropy-12907",
    "base_commit": "d16bfe05a744909de4b27f5875fe0d4ed41ce607",
    "patch": "diff --git a/astropy/io/fits.py b/astropy/io/fits.py\n(the gold fix)",
    "test_patch": TEST_PATCH,
    "problem_statement": "Header parsing drops the last card.",
    "hints_text": "",
    "created_at": "2022-03-03T15:14:54Z",
    "version": "4.3",
    "FAIL_TO_PASS": json.dumps(["astropy/io/tests/test_fits.py::test_header"]),
    "PASS_TO_PASS": json.dumps([]),
    "environment_setup_commit": "298ccb478e6bf092953bca67a3d29dc6c35f6752",
}


def test_a_pytest_row_becomes_a_valid_task_without_the_gold_patch() -> None:
    options = ConversionOptions(
        setup_commands=("pip install -e .",), python="python", plugins=("pytest_doctestplus",)
    )
    row = convert_row(ROW, options)
    task = parse_task(row["metadata"])
    assert task.instance_id == "astropy__astropy-12907"
    assert task.repo.git_url == "https://github.com/astropy/astropy.git"
    assert task.grading.fail_to_pass == ("astropy/io/tests/test_fits.py::test_header",)
    assert task.grading.runner == PytestRunner(
        python="python",
        config=None,  # the repository's own, as of the base commit and the test patch
        plugins=("pytest_doctestplus",),
        paths=("astropy/io/tests/test_fits.py",),
    )
    assert task.setup_commands == ("pip install -e .",)
    assert "gold fix" not in json.dumps(row)


def test_sources_from_a_mirror_directory_or_an_e2b_template(tmp_path: Path) -> None:
    mirrored = convert_row(ROW, ConversionOptions(repos_dir=tmp_path))
    assert mirrored["metadata"]["repo"] == {"path": str(tmp_path / "astropy__astropy")}
    templated = convert_row(ROW, ConversionOptions(template_prefix="swe-"))
    assert templated["metadata"]["repo"] == {"template": "swe-astropy__astropy-12907"}


def test_rows_that_cannot_be_graded_are_skipped_with_a_reason() -> None:
    rows = [
        ROW,
        {**ROW, "repo": "django/django", "instance_id": "django__django-1"},
        {**ROW, "instance_id": "x-2", "FAIL_TO_PASS": "not json"},
        {**ROW, "instance_id": "x-3", "base_commit": "zzz"},
        {**ROW, "instance_id": "x-4", "test_patch": ""},
    ]
    converted = convert_rows(rows, ConversionOptions())
    assert len(converted.rows) == 1
    assert [(line, instance) for line, instance, _ in converted.skipped] == [
        (2, "django__django-1"),
        (3, "x-2"),
        (4, "x-3"),
        (5, "x-4"),
    ]
    reasons = [reason for _, _, reason in converted.skipped]
    assert reasons[0] == "repo: django/django runs its own test runner, not pytest"
    assert reasons[1] == "FAIL_TO_PASS: is not a JSON list of test ids"
    assert reasons[2].startswith("base_commit: must be a hexadecimal commit id")
