"""A sandbox on an image the backend's cache unpacked (an OCI layout here; a registry image
takes the same path after its pull, tested in test_images_registry.py): the layers applied in
order, the image's configuration honored, the image held while the sandbox lives."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox import (
    ImageWorkspace,
    LocalBackend,
    OciLayoutImage,
    SandboxFileNotFoundError,
    SandboxSpec,
    UnsupportedSpecError,
)
from sandbox._images import ImageCacheConfig

from .conftest import local_config
from .image_fixtures import build, directory, file, whiteout
from .image_roots import reporter


def layout(where: Path) -> Path:
    shell = reporter(where)
    base = [
        directory("bin"),
        file("bin/bash", shell, mode=0o755),
        directory("etc"),
        file("etc/passwd", b"root:x:0:0::/root:/bin/bash\napp:x:1000:1000::/home/app:/bin/bash\n"),
        directory("home"),
        directory("home/app"),
        directory("testbed"),
        file("testbed/calc.py", b"old\n"),
        file("testbed/stale.txt", b"removed by the next layer\n"),
    ]
    fix = [file("testbed/calc.py", b"new\n"), whiteout("testbed/stale.txt")]
    config = {"Env": ["TASK_MARK=from-image"], "WorkingDir": "/testbed", "User": "app"}
    path = where / "layout"
    build(path, "v1", [base, fix], config=config)
    return path


async def test_a_cached_image_runs_with_its_layers_and_configuration(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    cache = ImageCacheConfig(root=tmp_path / "cache")
    backend = LocalBackend(local_config(state, images=cache))
    spec = SandboxSpec(image=OciLayoutImage(layout(tmp_path), "v1"), workspace=ImageWorkspace())
    async with await backend.create(spec) as box:
        assert box.workspace == "/testbed"
        assert await box.read_text("calc.py") == "new\n"
        with pytest.raises(SandboxFileNotFoundError):
            await box.read_text("stale.txt")
        seen = await box.exec("anything")
        assert seen.stdout == "uid=1000 gid=1000 cwd=/testbed mark=from-image home=/home/app\n"


async def test_an_image_without_a_cache_is_refused(backend: LocalBackend, tmp_path: Path) -> None:
    spec = SandboxSpec(image=OciLayoutImage(tmp_path / "nowhere"))
    with pytest.raises(UnsupportedSpecError, match=r"LocalConfig\(images=...\)"):
        await backend.create(spec)
