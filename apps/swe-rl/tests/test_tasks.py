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


def image_payload(**changes: object) -> dict[str, object]:
    payload: dict[str, object] = {
        "instance_id": "x__y-1",
        "environment": {"image": "swebench/sweb.eval.x86_64.x_1776_y-1:latest"},
        "problem_statement": "fix it",
        "grading": {
            "runner": {"type": "pytest"},
            "fail_to_pass": ["tests/test_x.py::test_y"],
            "test_patch": "",
        },
    }
    payload.update(changes)
    return payload


def test_an_environment_holding_the_repository_needs_no_repo_or_base_commit() -> None:
    task = parse_task(image_payload())
    assert task.repo is None
    assert task.base_commit is None
    assert task.in_image
    assert task.environment is not None
    assert task.environment.workdir is None  # the image's own working directory
    pinned = parse_task(image_payload(base_commit="ABC123"))
    assert pinned.base_commit == "abc123"


def test_an_environment_with_a_repo_checks_the_repository_out_on_the_image(
    good_row: dict[str, object],
) -> None:
    metadata = dict(good_row["metadata"])  # type: ignore[call-overload]
    task = parse_task({**metadata, "environment": {"rootfs": "/data/rootfs/x", "env": {"A": "1"}}})
    assert task.repo is not None
    assert not task.in_image
    assert task.environment is not None
    assert dict(task.environment.rootfs_env) == {"A": "1"}


def test_rows_without_an_environment_still_need_their_repository() -> None:
    payload = image_payload()
    del payload["environment"]
    with pytest.raises(TaskError, match=r"^repo: is required and must be an object$"):
        parse_task(payload)


@pytest.mark.parametrize(
    ("environment", "field", "message"),
    [
        ({}, "environment", "must have exactly one of image, oci_layout, rootfs, e2b_template"),
        ({"image": "a", "rootfs": "/b"}, "environment", "must have exactly one of"),
        ({"image": ""}, "environment.image", "must not be empty"),
        ({"oci_layout": "relative/dir"}, "environment.oci_layout", "must be an absolute host path"),
        ({"image": "a", "ref": "v1"}, "environment.ref", "is a field of an oci_layout"),
        ({"image": "a", "env": {}}, "environment.env", "is a field of a rootfs"),
        ({"rootfs": "/r", "env": {"A": 1}}, "environment.env.A", "must be a string"),
        ({"image": "a", "workdir": "testbed"}, "environment.workdir", "must be an absolute"),
        ({"image": "a", "platform": "arm64"}, "environment.platform", "is not a field"),
        ("swebench/x", "environment", "is required and must be an object"),
    ],
)
def test_a_bad_environment_names_its_field(environment: object, field: str, message: str) -> None:
    with pytest.raises(TaskError) as raised:
        parse_task(image_payload(environment=environment))
    assert raised.value.field == field
    assert message in raised.value.message


def test_the_sandbox_is_built_from_the_environment(tmp_path: Path) -> None:
    from pathlib import PurePosixPath

    from sandbox import GitWorkspace, ImageWorkspace, OciLayoutImage, RegistryImage, RootfsImage
    from swe_rl.environment import sandbox_spec

    in_image = parse_task(image_payload())
    spec = sandbox_spec(in_image, None, env={})
    assert spec.image == RegistryImage("swebench/sweb.eval.x86_64.x_1776_y-1:latest")
    assert spec.workspace == ImageWorkspace(None)  # the image's working directory
    layout = parse_task(image_payload(environment={"oci_layout": "/o", "ref": "v1"}))
    assert sandbox_spec(layout, None, env={}).image == OciLayoutImage(Path("/o"), "v1")
    rootfs = parse_task(
        image_payload(environment={"rootfs": "/r", "workdir": "/app"}, base_commit="abc1")
    )
    spec = sandbox_spec(rootfs, None, env={})
    assert spec.image == RootfsImage(Path("/r"))
    assert spec.workspace == ImageWorkspace(PurePosixPath("/app"))
    with_repo = parse_task(image_payload(repo={"path": "/src"}, base_commit="abc1"))
    assert sandbox_spec(with_repo, tmp_path, env={}).workspace == GitWorkspace(tmp_path, "abc1")
