"""The node-wide cache: leases, eviction by least-recent use, crashes, size accounting.

Images are OCI layouts the tests build (image_fixtures.py); a second process is a real one
(image_worker.py) sharing the cache directory, as rollout workers on a node do.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from sandbox._images import ImageCache, ImageCacheConfig, ImageLease
from sandbox._spec import OciLayoutImage

from .image_fixtures import build, directory, file, hardlink

WORKER = Path(__file__).with_name("image_worker.py")
MiB = 1 << 20


def make_images(tmp_path: Path, *names: str, size: int = MiB) -> dict[str, OciLayoutImage]:
    """One layout per name, each image about `size` bytes of incompressible content."""
    images = {}
    for name in names:
        layout = tmp_path / f"layout-{name}"
        build(layout, "t", [[file("name", name.encode()), file("data", os.urandom(size))]])
        images[name] = OciLayoutImage(layout, "t")
    return images


def cached(root: Path) -> set[str]:
    """Marker content of each image in the cache."""
    return {(entry / "rootfs" / "name").read_text() for entry in (root / "images").iterdir()}


def recorded_size(lease: ImageLease) -> int:
    size: int = json.loads((lease.root.parent / "image.json").read_text())["size"]
    return size


async def test_least_recently_used_images_are_evicted_past_the_cap(tmp_path: Path) -> None:
    images = make_images(tmp_path, "a", "b", "c")
    probe = await ImageCache(ImageCacheConfig(root=tmp_path / "probe")).acquire(images["a"])
    one = recorded_size(probe)
    await probe.release()
    cache = ImageCache(ImageCacheConfig(root=tmp_path / "cache", max_bytes=int(one * 2.5)))
    for name in ("a", "b", "a"):  # b is now the least recently used
        await (await cache.acquire(images[name])).release()
    assert cached(tmp_path / "cache") == {"a", "b"}
    async with await cache.acquire(images["c"]):
        assert cached(tmp_path / "cache") == {"a", "c"}


async def test_an_image_in_use_is_never_evicted(tmp_path: Path) -> None:
    images = make_images(tmp_path, "held", "passing", "new")
    cache = ImageCache(ImageCacheConfig(root=tmp_path / "cache", max_bytes=0))
    async with await cache.acquire(images["held"]) as held:
        await (await cache.acquire(images["passing"])).release()
        async with await cache.acquire(images["new"]):
            assert cached(tmp_path / "cache") == {"held", "new"}
        assert (held.root / "name").read_text() == "held"
        assert len((held.root / "data").read_bytes()) == MiB
    # Eviction runs after an acquire, whose own image is leased by then.
    await (await cache.acquire(images["new"])).release()
    assert cached(tmp_path / "cache") == {"new"}


def worker(options: dict[str, Any]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(WORKER), json.dumps(options)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def test_an_image_leased_by_another_process_is_never_evicted(tmp_path: Path) -> None:
    images = make_images(tmp_path, "theirs", "mine", "later")
    root = tmp_path / "cache"
    other = worker(
        {"root": str(root), "layout": str(images["theirs"].path), "ref": "t", "hold": True}
    )
    try:
        assert other.stdout is not None
        their_root = Path((await asyncio.to_thread(other.stdout.readline)).strip())
        cache = ImageCache(ImageCacheConfig(root=root, max_bytes=0))
        await (await cache.acquire(images["mine"])).release()
        async with await cache.acquire(images["later"]):
            assert cached(root) == {"theirs", "later"}
            assert (their_root / "name").read_text() == "theirs"
    finally:
        other.communicate(timeout=60)  # closes its stdin: it releases and exits
    assert other.returncode == 0
    await (await cache.acquire(images["later"])).release()
    assert cached(root) == {"later"}


async def test_a_crash_mid_unpack_leaves_nothing_that_is_used(tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    many = [file(f"files/{i:05}", os.urandom(512)) for i in range(4000)]
    digest = build(layout, "t", [[directory("files/"), *many]])
    manifest = json.loads((layout / "blobs" / "sha256" / digest[7:]).read_text())
    blob_path = layout / "blobs" / "sha256" / manifest["layers"][0]["digest"][7:]
    blob = blob_path.read_bytes()
    # The layer becomes a pipe: the worker unpacks what we feed it, and we kill it mid-way.
    blob_path.unlink()
    os.mkfifo(blob_path)
    root = tmp_path / "cache"
    victim = worker({"root": str(root), "layout": str(layout), "ref": "t"})
    try:
        pipe = await asyncio.to_thread(os.open, blob_path, os.O_WRONLY)
        try:
            await asyncio.to_thread(os.write, pipe, blob[: len(blob) // 2])
            work = await wait_for_partial_unpack(root / "tmp")
        finally:
            victim.send_signal(signal.SIGKILL)
            victim.wait(timeout=60)
            os.close(pipe)
    finally:
        if victim.poll() is None:
            victim.kill()
    assert list((root / "images").iterdir()) == []
    assert work.exists()  # what the crash left, never under images/
    blob_path.unlink()
    blob_path.write_bytes(blob)
    async with await ImageCache(ImageCacheConfig(root=root)).acquire(
        OciLayoutImage(layout, "t")
    ) as lease:
        assert len(list((lease.root / "files").iterdir())) == 4000
    assert not work.exists()
    assert list((root / "tmp").iterdir()) == []


async def wait_for_partial_unpack(tmp: Path) -> Path:
    """The worker's unpack directory once it holds some files (bounded wait, not a timing)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for work in tmp.glob("*.*"):
            files = work / "rootfs" / "files"
            if files.is_dir() and any(files.iterdir()):
                return work
        await asyncio.sleep(0.05)
    raise AssertionError("the worker never started unpacking")


async def test_sixteen_tasks_share_one_unpack(tmp_path: Path) -> None:
    images = make_images(tmp_path, "crowd")
    cache = ImageCache(ImageCacheConfig(root=tmp_path / "cache"))
    leases = await asyncio.gather(*(cache.acquire(images["crowd"]) for _ in range(16)))
    try:
        assert len({lease.root for lease in leases}) == 1
        assert len(list((tmp_path / "cache" / "images").iterdir())) == 1
    finally:
        for lease in leases:
            await lease.release()


async def test_the_recorded_size_is_what_du_counts(tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    build(
        layout,
        "t",
        [
            [
                directory("d/"),
                file("d/big", os.urandom(300_000)),
                hardlink("d/same", "d/big"),
                file("small", b"x"),
            ]
        ],
    )
    async with await ImageCache(ImageCacheConfig(root=tmp_path / "cache")).acquire(
        OciLayoutImage(layout, "t")
    ) as lease:
        du = subprocess.run(
            ["du", "-s", "--block-size=1", str(lease.root)],
            capture_output=True,
            text=True,
            check=True,
        )
        assert recorded_size(lease) == int(du.stdout.split()[0])


async def test_a_lease_is_released_once_and_by_its_context(tmp_path: Path) -> None:
    images = make_images(tmp_path, "x", size=1024)
    cache = ImageCache(ImageCacheConfig(root=tmp_path / "cache", max_bytes=0))
    lease = await cache.acquire(images["x"])
    await lease.release()
    await lease.release()
    async with await cache.acquire(images["x"]) as again:
        assert (again.root / "name").read_text() == "x"
    forgotten = await cache.acquire(images["x"])
    with pytest.warns(ResourceWarning, match="unreleased image lease"):
        forgotten.__del__()


async def test_cancelled_acquires_leave_no_lease_behind(tmp_path: Path) -> None:
    images = make_images(tmp_path, "a", "b")
    cache = ImageCache(ImageCacheConfig(root=tmp_path / "cache", max_bytes=0))
    tasks = [asyncio.create_task(cache.acquire(images["a"])) for _ in range(8)]
    await asyncio.sleep(0)  # every task is waiting for the one pull
    for task in tasks[:4]:
        task.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert sum(isinstance(r, asyncio.CancelledError) for r in results) == 4
    for result in results:
        if isinstance(result, ImageLease):
            await result.release()
    # The next acquire's sweep may evict "a" only if no lease on it is left anywhere.
    await (await cache.acquire(images["b"])).release()
    assert cached(tmp_path / "cache") == {"b"}
