"""Task files: every bad row is reported with its row and field and skipped; good rows go on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from swe_rl.demo.repos import TASKS, create_repository, task_row
from swe_rl.task import TaskError, parse_task
from swe_rl.task_file import parse_task_lines, read_task_file


@pytest.fixture
def good_row(tmp_path: Path) -> dict[str, object]:
    repo, base = create_repository(TASKS[0], tmp_path)
    return task_row(TASKS[0], repo, base)


def with_metadata(row: dict[str, object], **changes: object) -> str:
    metadata = dict(row["metadata"])  # type: ignore[call-overload]
    for key, value in changes.items():
        if value is None:
            metadata.pop(key, None)
        else:
            metadata[key] = value
    return json.dumps({**row, "metadata": metadata})


def test_a_good_row_is_read_and_its_metadata_kept_verbatim(
    good_row: dict[str, object], tmp_path: Path
) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(good_row) + "\n\n")
    tasks = read_task_file(path)
    assert tasks.errors == ()
    (row,) = tasks.rows
    assert row.metadata == good_row["metadata"]
    assert row.task.grading.fail_to_pass == ("test_calc.TestAdd.test_add",)


def test_bad_rows_are_reported_with_row_and_field_and_skipped(
    good_row: dict[str, object],
) -> None:
    grading = dict(good_row["metadata"]["grading"])  # type: ignore[index]
    lines = [
        json.dumps(good_row),
        "{not json",
        json.dumps({"prompt": "x"}),
        with_metadata(good_row, instance_id="other", base_commit="not-hex!"),
        with_metadata(good_row, instance_id="third", repo={"path": "/a", "git_url": "b"}),
        with_metadata(good_row, instance_id="fourth", grading={**grading, "fail_to_pass": [""]}),
        with_metadata(good_row, instance_id="fifth", grading={**grading, "timeout_s": -1}),
        json.dumps(good_row),  # a repeated instance id
        with_metadata(good_row, instance_id="sixth"),
    ]
    tasks = parse_task_lines(lines)
    assert [row.line for row in tasks.rows] == [1, 9]
    assert [str(error) for error in tasks.errors] == [
        "row 2: (row): not JSON: Expecting property name enclosed in double quotes: "
        "line 1 column 2 (char 1)",
        "row 3: metadata: is required and must be an object (the task payload)",
        "row 4: metadata.base_commit: must be a hexadecimal commit id, got 'not-hex!'",
        "row 5: metadata.repo: must have exactly one of path, git_url, template",
        "row 6: metadata.grading.fail_to_pass[0]: must be a non-empty string",
        "row 7: metadata.grading.timeout_s: must be a positive number of seconds, got -1",
        "row 8: metadata.instance_id: repeats the id of row 1",
    ]


def test_a_payload_that_is_not_an_object_is_a_task_error() -> None:
    with pytest.raises(TaskError, match="metadata: must be an object"):
        parse_task([])  # type: ignore[arg-type]
