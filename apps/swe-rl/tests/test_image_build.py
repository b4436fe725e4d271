"""Harbor tasks whose Dockerfile builds their image, built with buildah (image_build.py).

The unit tests check what buildah is given (registries.conf, auth.json), the build context's
hash, and that a missing buildah skips the task saying so. The slow ones are real end to end:
Debian's docker-registry on loopback (plain HTTP) serves the tests' Debian root
(tests/images.py) as `library/python:3.11-slim`, the mirror of docker.io, as a cluster's
pull-through cache would; `swe-rl convert-harbor --build-images` builds the fixture task
`fixtures/harbor/calc-build` (FROM, WORKDIR, COPY, RUN, ENV) into an OCI layout once,
reuses it when the context is unchanged and builds it again when it changed; `swe-rl validate`
runs the built image: gold 1, empty 0; a build whose RUN fails skips its task with buildah's
words while the others go on.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import secrets
import shutil
import socket
import subprocess
import time
import tomllib
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from machine_load import slowdown

from sandbox import RegistryCredentials
from swe_rl.cli import main
from swe_rl.harbor import HarborOptions, convert_tasks
from swe_rl.image_build import (
    BuildahBuilder,
    BuildConfig,
    auth_file,
    context_tag,
    has_tag,
    registries_conf,
)

from .images import FIXTURES, LAYOUT_REF, debian_layout

TASK = FIXTURES / "harbor" / "calc-build"
LAYOUT_NAME = "fixture_harbor-calc-build"  # the task's name as a directory
TOOLS = ("buildah", "docker-registry", "skopeo", "umoci", "mmdebstrap")
MISSING = [tool for tool in TOOLS if shutil.which(tool) is None]
needs_buildah = pytest.mark.skipif(
    bool(MISSING) or os.geteuid() != 0,
    reason=f"needs {', '.join(MISSING)} (apt-get install {' '.join(MISSING)})"
    if MISSING
    else "needs root: the Debian root is built as root, and rootless buildah needs "
    "subordinate ids (/etc/subuid, /etc/subgid) set up for the user",
)


# -- what buildah is given -----------------------------------------------------------------------


def test_registries_conf_names_each_registrys_mirrors_and_the_plain_http_hosts() -> None:
    config = BuildConfig(
        images_dir=Path("images"),
        storage_dir=Path("storage"),
        mirrors={"registry-1.docker.io": ("127.0.0.1:5000", "mirror.example")},
        plain_http=("127.0.0.1:5000", "registry.internal:8080"),
    )
    conf = tomllib.loads(registries_conf(config))
    assert conf == {
        # A Dockerfile's `FROM python:3.11-slim` means Docker Hub's image.
        "unqualified-search-registries": ["docker.io"],
        "registry": [
            {
                "prefix": "docker.io",
                "location": "docker.io",
                "insecure": False,
                "mirror": [
                    {"location": "127.0.0.1:5000", "insecure": True},
                    {"location": "mirror.example", "insecure": False},
                ],
            },
            # A plain-HTTP host is spoken to so when named itself, too.
            {"prefix": "127.0.0.1:5000", "location": "127.0.0.1:5000", "insecure": True},
            {
                "prefix": "registry.internal:8080",
                "location": "registry.internal:8080",
                "insecure": True,
            },
        ],
    }


def test_the_auth_file_holds_each_hosts_credentials() -> None:
    credentials = {
        "index.docker.io": RegistryCredentials("hub-user", "hub-token"),
        "mirror.example": RegistryCredentials("mirror", 'p:a"ss'),
    }
    auths = json.loads(auth_file(credentials))["auths"]
    assert set(auths) == {"docker.io", "mirror.example"}
    assert base64.b64decode(auths["docker.io"]["auth"]) == b"hub-user:hub-token"
    assert base64.b64decode(auths["mirror.example"]["auth"]) == b'mirror:p:a"ss'


def test_the_tag_is_the_contexts_paths_modes_and_bytes(tmp_path: Path) -> None:
    context = tmp_path / "environment"
    shutil.copytree(TASK / "environment", context)
    tag = context_tag(context)
    assert len(tag) == 32
    os.utime(context / "adding.py", (0, 0))
    assert context_tag(context) == tag, "a file's time is not its content"
    changes = []
    (context / "adding.py").write_text((TASK / "environment" / "adding.py").read_text() + "\n")
    changes.append(context_tag(context))
    (context / "adding.py").chmod(0o755)
    changes.append(context_tag(context))
    (context / "adding.py").rename(context / "summer.py")
    changes.append(context_tag(context))
    (context / "data").mkdir()
    changes.append(context_tag(context))
    (context / "data" / "link").symlink_to("../summer.py")
    changes.append(context_tag(context))
    assert len({tag, *changes}) == 1 + len(changes)


def test_without_buildah_the_task_is_skipped_saying_so(tmp_path: Path) -> None:
    config = BuildConfig(tmp_path / "images", tmp_path / "storage", buildah="buildah-missing")
    options = HarborOptions(builder=BuildahBuilder(config))
    converted = convert_tasks([TASK], options)
    assert converted.rows == ()
    assert converted.skipped == (
        (
            str(TASK),
            "environment/Dockerfile: the image build failed: buildah-missing is not installed "
            "(Debian: apt-get install buildah)",
        ),
    )


def test_build_images_needs_the_images_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["convert-harbor", str(TASK), str(tmp_path / "out.jsonl"), "--build-images"])
    assert code == 2
    assert "--build-images needs --images-dir" in capsys.readouterr().err


# -- real builds ---------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """docker-registry on loopback, plain HTTP, serving the Debian root as Docker Hub's
    `library/python:3.11-slim`; its host:port."""
    directory = tmp_path_factory.mktemp("registry")
    host = f"127.0.0.1:{_free_port()}"
    config = directory / "registry.yml"
    config.write_text(
        "version: 0.1\n"
        "log:\n  level: error\n"
        f"storage:\n  filesystem:\n    rootdirectory: {directory / 'storage'}\n"
        f"http:\n  addr: {host}\n  secret: {secrets.token_hex(16)}\n"
    )
    with (directory / "registry.log").open("wb") as log:
        process = subprocess.Popen(
            ["docker-registry", "serve", str(config)], stdout=log, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://{host}/v2/", timeout=2).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError((directory / "registry.log").read_text()) from None
                time.sleep(0.05)
        subprocess.run(
            [
                "skopeo",
                "--insecure-policy",
                "copy",
                "--quiet",
                "--dest-tls-verify=false",
                f"oci:{debian_layout()}:{LAYOUT_REF}",
                f"docker://{host}/library/python:3.11-slim",
            ],
            check=True,
            capture_output=True,
            env={**os.environ, "HOME": str(directory)},
        )
        yield host
    finally:
        process.terminate()
        process.wait(timeout=10)


@dataclass
class Converted:
    rows: list[dict[str, Any]]
    printed: str
    seconds: float


@dataclass
class Builds:
    """Where the module's builds go, and convert-harbor with --build-images into there."""

    registry: str
    storage: Path
    work: Path

    def convert(self, source: Path, images: Path) -> Converted:
        out = self.work / f"rows-{secrets.token_hex(4)}.jsonl"
        printed = io.StringIO()
        started = time.monotonic()
        with contextlib.redirect_stdout(printed):
            code = main(
                [
                    "convert-harbor",
                    str(source),
                    str(out),
                    "--build-images",
                    "--images-dir",
                    str(images),
                    "--registry-mirror",
                    f"docker.io={self.registry}",
                    "--plain-http",
                    self.registry,
                    "--build-storage",
                    str(self.storage),
                ]
            )
        assert code == 0, printed.getvalue()
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        return Converted(rows, printed.getvalue(), time.monotonic() - started)


@pytest.fixture(scope="module")
def builds(registry: str, tmp_path_factory: pytest.TempPathFactory) -> Builds:
    work = tmp_path_factory.mktemp("builds")
    return Builds(registry, work / "buildah", work)


@pytest.fixture(scope="module")
def first(builds: Builds) -> Converted:
    """The fixture task converted, its image built (the base pulled through the mirror)."""
    return builds.convert(TASK, builds.work / "images")


def _config(layout: Path, tag: str) -> dict[str, Any]:
    done = subprocess.run(
        ["skopeo", "inspect", "--config", f"oci:{layout}:{tag}"],
        check=True,
        capture_output=True,
        text=True,
    )
    config: dict[str, Any] = json.loads(done.stdout)
    return config


def _base_layer() -> str:
    index = json.loads((debian_layout() / "index.json").read_text())
    digest = index["manifests"][0]["digest"].removeprefix("sha256:")
    manifest = json.loads((debian_layout() / "blobs" / "sha256" / digest).read_text())
    config = manifest["config"]["digest"].removeprefix("sha256:")
    layers: list[str] = json.loads((debian_layout() / "blobs" / "sha256" / config).read_text())[
        "rootfs"
    ]["diff_ids"]
    return layers[0]


@needs_buildah
@pytest.mark.slow
def test_the_built_image_is_an_oci_layout_built_once(builds: Builds, first: Converted) -> None:
    [row] = first.rows
    environment = row["metadata"]["environment"]
    layout = builds.work / "images" / LAYOUT_NAME
    tag = context_tag(TASK / "environment")
    # The working directory is the Dockerfile's (task.toml names none).
    assert environment == {"oci_layout": str(layout), "ref": tag, "workdir": "/app"}
    assert "built fixture/harbor-calc-build in " in first.printed, first.printed
    config = _config(layout, tag)
    assert "CALC_CASES=/opt/calc/cases.json" in config["config"]["Env"]
    assert config["config"]["WorkingDir"] == "/app"
    # Its base is the mirror's image (the Debian root), not Docker Hub's.
    assert config["rootfs"]["diff_ids"][0] == _base_layer()
    assert len(config["rootfs"]["diff_ids"]) == 2

    # Unchanged: not built again, the layout untouched.
    index = layout / "index.json"
    before = index.stat().st_mtime_ns
    again = builds.convert(TASK, builds.work / "images")
    assert again.rows == first.rows
    assert f"fixture/harbor-calc-build: built before ({tag})" in again.printed, again.printed
    assert index.stat().st_mtime_ns == before
    assert again.seconds < 10 * slowdown(), again.seconds


@needs_buildah
@pytest.mark.slow
def test_a_changed_context_is_built_again_under_a_new_tag(
    builds: Builds, first: Converted, tmp_path: Path
) -> None:
    images = tmp_path / "images"
    shutil.copytree(builds.work / "images", images, symlinks=True)
    task = tmp_path / "calc-build"
    shutil.copytree(TASK, task)
    module = task / "environment" / "adding.py"
    module.write_text(module.read_text() + "# changed\n")
    old = first.rows[0]["metadata"]["environment"]["ref"]

    changed = builds.convert(task, images)
    [row] = changed.rows
    new = row["metadata"]["environment"]["ref"]
    assert new == context_tag(task / "environment") != old
    assert "built fixture/harbor-calc-build in " in changed.printed, changed.printed
    layout = images / LAYOUT_NAME
    assert has_tag(layout, new)
    assert not has_tag(layout, old), "the layout holds the current context's image only"
    assert sorted(p.name for p in images.iterdir()) == [LAYOUT_NAME, f"{LAYOUT_NAME}.lock"]


@needs_buildah
@pytest.mark.slow
def test_validate_grades_the_built_image_gold_1_and_empty_0(
    first: Converted, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(first.rows[0]) + "\n")
    arguments = ["validate", str(tasks), "--out", str(tmp_path / "valid.jsonl")]
    arguments += ["--cache-dir", str(tmp_path), "--image-cache", str(tmp_path / "image-cache")]
    code = main([*arguments, "--logs", str(tmp_path / "logs")])
    printed = capsys.readouterr().out
    line = next(line for line in printed.splitlines() if "fixture/harbor-calc-build" in line)
    assert [cell.strip() for cell in line.split("\u2502")][2:5] == ["0", "1", "ok"], printed
    assert code == 0


@needs_buildah
@pytest.mark.slow
def test_a_failing_build_skips_its_task_with_buildahs_words(
    builds: Builds, first: Converted, tmp_path: Path
) -> None:
    dataset = tmp_path / "dataset"
    shutil.copytree(TASK, dataset / "good")
    broken = dataset / "broken"
    shutil.copytree(TASK, broken)
    toml = broken / "task.toml"
    toml.write_text(toml.read_text().replace("harbor-calc-build", "harbor-calc-broken"))
    (broken / "environment" / "Dockerfile").write_text(
        'FROM python:3.11-slim\nRUN echo "E: Unable to locate package calc-deps" >&2 && exit 1\n'
    )
    images = tmp_path / "images"
    shutil.copytree(builds.work / "images", images, symlinks=True)

    converted = builds.convert(dataset, images)
    assert [row["metadata"]["instance_id"] for row in converted.rows] == [
        "fixture/harbor-calc-build"
    ]
    assert converted.rows[0]["metadata"]["environment"]["ref"] == context_tag(TASK / "environment")
    skipped = converted.printed.split(f"skipped {broken}: ", 1)[1]
    assert skipped.startswith(
        "environment/Dockerfile: the image build failed: buildah build failed (exit 1): "
    ), converted.printed
    assert "E: Unable to locate package calc-deps" in skipped
    assert 'building at STEP "RUN echo' in skipped
    assert not (images / "fixture_harbor-calc-broken").exists()
    assert not list(images.glob(".*")), "no half-built layout is left"
