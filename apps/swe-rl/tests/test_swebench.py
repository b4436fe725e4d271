"""SWE-bench-family rows (their public field names, lists JSON-encoded as in the published
datasets) become task rows in each instance's own image, with the official harness's test
command, test files and parser (the real swebench package); rows that cannot be graded are
skipped with a reason, and the gold patch never reaches the task's metadata."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from swe_rl.swebench import ConversionOptions, convert_row, convert_rows
from swe_rl.task import Environment, SwebenchRunner, parse_task

TEST_PATCH = """\
diff --git a/astropy/io/tests/test_fits.py b/astropy/io/tests/test_fits.py
--- a/astropy/io/tests/test_fits.py
+++ b/astropy/io/tests/test_fits.py
@@ -1,2 +1,3 @@
 import pytest
+
 def test_header(): pass
"""
DJANGO_TEST_PATCH = """\
diff --git a/tests/admin_views/tests.py b/tests/admin_views/tests.py
--- a/tests/admin_views/tests.py
+++ b/tests/admin_views/tests.py
@@ -1 +1,2 @@
 import unittest
+
"""

ROW: dict[str, Any] = {
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


def test_a_row_runs_in_its_official_image_with_the_harness_command() -> None:
    row = convert_row(ROW, ConversionOptions())
    task = parse_task(row["metadata"])
    assert task.instance_id == "astropy__astropy-12907"
    assert task.repo is None
    assert task.in_image
    assert task.environment == Environment(
        image="swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest", workdir="/testbed"
    )
    assert task.grading.runner == SwebenchRunner(
        repo="astropy/astropy",
        framework="pytest",
        command="pytest -rA",  # MAP_REPO_VERSION_TO_SPECS["astropy/astropy"]["4.3"]
        directives=("astropy/io/tests/test_fits.py",),
        prelude=("source /opt/miniconda3/bin/activate", "conda activate testbed"),
    )
    assert task.grading.fail_to_pass == ("astropy/io/tests/test_fits.py::test_header",)
    assert task.base_commit == ROW["base_commit"]
    assert "gold fix" not in json.dumps(row["metadata"])
    assert row["reference"] == {"patch": ROW["patch"]}


def test_django_and_sympy_rows_get_their_own_runners() -> None:
    django = {
        **ROW,
        "repo": "django/django",
        "instance_id": "django__django-11099",
        "version": "3.0",
        "test_patch": DJANGO_TEST_PATCH,
    }
    runner = parse_task(convert_row(django, ConversionOptions())["metadata"]).grading.runner
    assert isinstance(runner, SwebenchRunner)
    assert (runner.framework, runner.directives) == ("django", ("admin_views.tests",))
    assert runner.command == "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1"
    assert "export LANG=en_US.UTF-8" in runner.prelude  # the spec's eval_commands
    sympy = {**ROW, "repo": "sympy/sympy", "instance_id": "sympy__sympy-20590", "version": "1.7"}
    runner = parse_task(convert_row(sympy, ConversionOptions())["metadata"]).grading.runner
    assert isinstance(runner, SwebenchRunner)
    assert runner.framework == "sympy"
    assert "bin/test -C --verbose" in runner.command


def test_image_sources_a_mirror_a_column_local_images_or_e2b(tmp_path: Path) -> None:
    def environment(options: ConversionOptions, row: dict[str, Any] = ROW) -> Any:
        return convert_row(row, options)["metadata"]["environment"]

    mirror = ConversionOptions(image_prefix="registry.example:5000/swe/sweb.eval.x86_64.")
    assert environment(mirror)["image"] == (
        "registry.example:5000/swe/sweb.eval.x86_64.astropy_1776_astropy-12907:latest"
    )
    column = {**ROW, "image_name": "jyangballin/swesmith.x86_64.astropy:abc"}
    assert environment(ConversionOptions(image_column="image_name"), column) == {
        "image": "jyangballin/swesmith.x86_64.astropy:abc",
        "workdir": "/testbed",
    }
    local = environment(ConversionOptions(images_dir=tmp_path, image_format="rootfs"))
    assert local["rootfs"] == str(
        tmp_path / "swebench_sweb.eval.x86_64.astropy_1776_astropy-12907_latest"
    )
    layout = environment(ConversionOptions(images_dir=tmp_path))
    assert layout["ref"] == "latest"
    assert layout["oci_layout"].startswith(str(tmp_path))
    assert environment(ConversionOptions(template_prefix="swe-")) == {
        "e2b_template": "swe-astropy__astropy-12907",
        "workdir": "/testbed",
    }


def test_a_dataset_the_harness_does_not_know_gives_its_command_and_parser() -> None:
    gym = {**ROW, "repo": "getmoto/moto", "instance_id": "getmoto__moto-5752", "version": "4.0"}
    skipped = convert_rows([gym], ConversionOptions())
    assert skipped.skipped == (
        (
            1,
            "getmoto__moto-5752",
            "version: swebench has no spec for the repository of getmoto/moto (give test_command)",
        ),
    )
    options = ConversionOptions(test_command="pytest -n0 -rA", log_parser="parse_log_pytest")
    runner = parse_task(convert_row(gym, options)["metadata"]).grading.runner
    assert isinstance(runner, SwebenchRunner)
    assert (runner.command, runner.parser) == ("pytest -n0 -rA", "parse_log_pytest")


def test_rows_that_cannot_be_graded_are_skipped_with_a_reason() -> None:
    rows = [
        ROW,
        {**ROW, "instance_id": "x-1", "version": "99.9"},
        {**ROW, "instance_id": "x-2", "FAIL_TO_PASS": "not json"},
        {**ROW, "instance_id": "x-3", "base_commit": "zzz"},
        {**ROW, "instance_id": "x-4", "test_patch": ""},
        {**ROW, "instance_id": "x-5", "repo": "chartjs/Chart.js", "version": "4.0"},
    ]
    converted = convert_rows(rows, ConversionOptions())
    assert len(converted.rows) == 1
    reasons = {instance: reason for _, instance, reason in converted.skipped}
    assert reasons["x-1"] == (
        "version: swebench has no version '99.9' of astropy/astropy (give test_command)"
    )
    assert reasons["x-2"] == "FAIL_TO_PASS: is not a JSON list of test ids"
    assert reasons["x-3"].startswith("(converted) base_commit: must be a hexadecimal commit id")
    assert reasons["x-4"] == "test_patch: is required and must be a non-empty string"
    assert reasons["x-5"].startswith("test_cmd: the harness's command for chartjs/Chart.js")
