"""Pulling from a real registry on loopback: Debian's docker-registry with token auth on.

The registry, its token server and any mirror run for this module on 127.0.0.1 and are
stopped at its end (registry_fixtures.py). Images are built here and pushed with skopeo. Needs
`apt-get install docker-registry skopeo`; the module skips, naming them, without.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sandbox._images import (
    ImageCache,
    ImageCacheConfig,
    ImageLease,
    ImagePullError,
    Platform,
    RegistryCredentials,
    host_platform,
)
from sandbox._spec import RegistryImage

from .image_fixtures import Layout, build, file
from .registry_fixtures import (
    MISSING_TOOLS,
    PASSWORD,
    USER,
    Proxy,
    Registry,
    Storage,
    TokenServer,
    closed_port,
    running_registry,
)

pytestmark = pytest.mark.skipif(
    bool(MISSING_TOOLS), reason=f"needs {MISSING_TOOLS} (apt-get install docker-registry skopeo)"
)
WORKER = Path(__file__).with_name("image_worker.py")


@dataclass
class Env:
    registry: Registry
    tokens: TokenServer
    work: Path

    @property
    def token_host(self) -> str:
        return f"127.0.0.1:{self.tokens.port}"

    def config(
        self,
        root: Path,
        *,
        anonymous: bool = False,
        credentials: dict[str, RegistryCredentials] | None = None,
        plain_http: tuple[str, ...] = (),
        **overrides: Any,
    ) -> ImageCacheConfig:
        """A cache at `root` that speaks plain HTTP to the registry and its token server and
        has the registry's credentials (none when `anonymous`, others when given)."""
        if credentials is None:
            good = RegistryCredentials(USER, PASSWORD)
            credentials = {} if anonymous else {self.registry.host: good}
        hosts = (self.registry.host, self.token_host, *plain_http)
        return ImageCacheConfig(root=root, plain_http=hosts, credentials=credentials, **overrides)

    def image(self, name: str, *, size: int = 64 << 10) -> tuple[str, list[str]]:
        """A fresh image pushed as ``<name>:v1`` (random content: no blob shared with another
        test); returns its manifest digest and its layer digests."""
        layout = self.work / f"layout-{name.replace('/', '-')}"
        digest = build(
            layout,
            "v1",
            [
                [file("marker", name.encode()), file("random", os.urandom(size))],
                [file("second", os.urandom(2048))],
            ],
            config={"Env": ["IMAGE=" + name]},
        )
        self.registry.push(layout, "v1", name, "v1")
        manifest = json.loads((layout / "blobs" / "sha256" / digest[7:]).read_text())
        return digest, [layer["digest"] for layer in manifest["layers"]]


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    with (
        tempfile.TemporaryDirectory(prefix="registry-test-") as directory,
        running_registry(Path(directory)) as (registry, tokens),
    ):
        yield Env(registry, tokens, Path(directory))


async def acquire(config: ImageCacheConfig, reference: str) -> ImageLease:
    return await ImageCache(config).acquire(RegistryImage(reference))


def assert_nothing_cached(root: Path, *digests: str) -> None:
    assert list((root / "images").iterdir()) == []
    assert list((root / "tmp").iterdir()) == []
    for digest in digests:
        assert not (root / "blobs" / "sha256" / digest[7:]).exists(), digest


async def test_pull_by_tag_and_by_digest(env: Env, tmp_path: Path) -> None:
    digest, layers = env.image("private/by-tag")
    host = env.registry.host
    for n, reference in enumerate(
        [
            f"{host}/private/by-tag:v1",
            f"{host}/private/by-tag@{digest}",
            f"{host}/private/by-tag:v1@{digest}",
        ]
    ):
        async with await acquire(env.config(tmp_path / str(n)), reference) as lease:
            assert lease.config.digest == digest
            assert (lease.root / "marker").read_bytes() == b"private/by-tag"
            assert lease.config.env["IMAGE"] == "private/by-tag"
            assert lease.root == tmp_path / str(n) / "images" / digest[7:] / "rootfs"
        for layer in layers:
            assert (tmp_path / str(n) / "blobs" / "sha256" / layer[7:]).is_file()
    # Each of the three caches pulled each layer once.
    assert [env.registry.blob_gets(layer) for layer in layers] == [3, 3]


async def test_anonymous_pull_through_the_token_flow(env: Env, tmp_path: Path) -> None:
    env.image("public/open")
    before = len(env.tokens.requests)
    reference = f"{env.registry.host}/public/open:v1"
    async with await acquire(env.config(tmp_path, anonymous=True), reference) as lease:
        assert (lease.root / "marker").read_bytes() == b"public/open"
    asked = env.tokens.requests[before:]
    assert asked
    assert all(r["user"] is None for r in asked)
    assert asked[0]["scopes"] == ["repository:public/open:pull"]


async def test_unauthorized_is_a_clear_error(env: Env, tmp_path: Path) -> None:
    env.image("private/locked")
    reference = f"{env.registry.host}/private/locked:v1"
    with pytest.raises(ImagePullError, match=r"private/locked.*unauthorized.*no credentials"):
        await acquire(env.config(tmp_path / "anonymous", anonymous=True), reference)
    assert_nothing_cached(tmp_path / "anonymous")
    wrong = {env.registry.host: RegistryCredentials(USER, "wrong")}
    with pytest.raises(ImagePullError, match=r"unauthorized.*refused a token with the configured"):
        await acquire(env.config(tmp_path / "wrong", credentials=wrong), reference)
    assert_nothing_cached(tmp_path / "wrong")


async def test_a_missing_image_is_not_found(env: Env, tmp_path: Path) -> None:
    env.image("private/present")
    for reference in ("private/present:nope", "private/absent:v1"):
        with pytest.raises(ImagePullError, match=r"not found.*(MANIFEST|NAME)_UNKNOWN"):
            await acquire(env.config(tmp_path), f"{env.registry.host}/{reference}")
    assert_nothing_cached(tmp_path)


async def test_an_index_resolves_to_the_configured_platform(env: Env, tmp_path: Path) -> None:
    here = host_platform()
    other = Platform("linux", "s390x" if here.architecture != "s390x" else "amd64")
    layout = Layout(env.work / "layout-multi")
    native = layout.image(
        [[file("which", b"native")]], architecture=here.architecture, variant=here.variant
    )
    foreign = layout.image([[file("which", b"foreign")]], architecture=other.architecture)
    index = layout.tag(layout.image_index([foreign, native]), "v1")
    env.registry.push(layout.path, "v1", "private/multi", "v1", all=True)
    host = env.registry.host
    async with await acquire(env.config(tmp_path / "host"), f"{host}/private/multi:v1") as lease:
        assert (lease.root / "which").read_bytes() == b"native"
        assert lease.config.digest == native["digest"]
    other_config = env.config(tmp_path / "other", platform=other)
    by_digest = f"{host}/private/multi@{index['digest']}"
    async with await acquire(other_config, by_digest) as lease:
        assert (lease.root / "which").read_bytes() == b"foreign"
    missing = env.config(tmp_path / "none", platform=Platform("linux", "riscv64"))
    with pytest.raises(ImagePullError, match=r"no manifest for platform linux/riscv64.*it has: "):
        await acquire(missing, f"{host}/private/multi:v1")


async def test_mirrors_are_tried_first_then_the_registry(env: Env, tmp_path: Path) -> None:
    digest, layers = env.image("private/mirrored")
    mirror = Proxy(env.registry.host)
    try:
        # The registry named in the reference is down: only the mirror can serve it.
        down = f"127.0.0.1:{closed_port()}"
        config = env.config(
            tmp_path / "via-mirror",
            mirrors={down: (mirror.host,)},
            plain_http=(mirror.host, down),
            credentials={mirror.host: RegistryCredentials(USER, PASSWORD)},
        )
        async with await acquire(config, f"{down}/private/mirrored:v1") as lease:
            assert lease.config.digest == digest
        assert all(mirror.blob_gets(layer) == 1 for layer in layers)
        # The mirror is down: the registry serves.
        config = env.config(
            tmp_path / "fallback", mirrors={env.registry.host: (down,)}, plain_http=(down,)
        )
        async with await acquire(config, f"{env.registry.host}/private/mirrored:v1") as lease:
            assert lease.config.digest == digest
        # Both up: the mirror is asked first and serves everything.
        config = env.config(
            tmp_path / "both",
            mirrors={env.registry.host: (mirror.host,)},
            plain_http=(mirror.host,),
            credentials={
                mirror.host: RegistryCredentials(USER, PASSWORD),
                env.registry.host: RegistryCredentials(USER, PASSWORD),
            },
        )
        async with await acquire(config, f"{env.registry.host}/private/mirrored:v1") as lease:
            assert lease.config.digest == digest
        assert all(mirror.blob_gets(layer) == 2 for layer in layers)
        # Every registry GET of a layer came through the mirror, but the fallback pull's one.
        assert all(env.registry.blob_gets(layer) == 3 for layer in layers)
    finally:
        mirror.close()


async def test_a_tampered_mirror_is_refused_and_the_registry_used(env: Env, tmp_path: Path) -> None:
    _, layers = env.image("private/tampered-mirror")
    mirror = Proxy(env.registry.host, tamper=True)
    try:
        config = env.config(
            tmp_path,
            mirrors={env.registry.host: (mirror.host,)},
            plain_http=(mirror.host,),
            credentials={
                mirror.host: RegistryCredentials(USER, PASSWORD),
                env.registry.host: RegistryCredentials(USER, PASSWORD),
            },
        )
        reference = f"{env.registry.host}/private/tampered-mirror:v1"
        async with await acquire(config, reference) as lease:
            assert (lease.root / "marker").read_bytes() == b"private/tampered-mirror"
        big = layers[0]
        assert mirror.blob_gets(big) == 1  # tried first, refused
        assert env.registry.blob_gets(big) == 2  # through the mirror, then directly
    finally:
        mirror.close()


async def test_a_tampered_blob_is_refused_with_nothing_cached(env: Env, tmp_path: Path) -> None:
    _, layers = env.image("private/tampered")
    tampering = Proxy(env.registry.host, tamper=True)
    try:
        config = env.config(
            tmp_path,
            plain_http=(tampering.host,),
            credentials={tampering.host: RegistryCredentials(USER, PASSWORD)},
        )
        with pytest.raises(ImagePullError, match=f"digest mismatch: expected {layers[0]}"):
            await acquire(config, f"{tampering.host}/private/tampered:v1")
    finally:
        tampering.close()
    assert_nothing_cached(tmp_path, layers[0])


async def test_sixteen_concurrent_acquires_pull_once(env: Env, tmp_path: Path) -> None:
    digest, layers = env.image("private/crowd", size=1 << 20)
    cache = ImageCache(env.config(tmp_path))
    reference = RegistryImage(f"{env.registry.host}/private/crowd:v1")
    leases = await asyncio.gather(*(cache.acquire(reference) for _ in range(16)))
    try:
        assert {lease.root for lease in leases} == {tmp_path / "images" / digest[7:] / "rootfs"}
        assert [env.registry.blob_gets(layer) for layer in layers] == [1, 1]
    finally:
        for lease in leases:
            await lease.release()
            await lease.release()  # idempotent


def worker(options: dict[str, Any]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(WORKER), json.dumps(options)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def test_processes_sharing_a_cache_pull_once(env: Env, tmp_path: Path) -> None:
    digest, layers = env.image("private/shared", size=1 << 20)
    options = {
        "root": str(tmp_path),
        "reference": f"{env.registry.host}/private/shared:v1",
        "plain_http": [env.registry.host, env.token_host],
        "credentials": {env.registry.host: [USER, PASSWORD]},
    }
    processes = [worker(options) for _ in range(4)]
    results = [p.communicate(timeout=120) for p in processes]
    assert [p.returncode for p in processes] == [0] * 4, results
    assert {out.strip() for out, _ in results} == {str(tmp_path / "images" / digest[7:] / "rootfs")}
    assert [env.registry.blob_gets(layer) for layer in layers] == [1, 1]


async def test_a_pinned_image_needs_no_network_once_cached(env: Env, tmp_path: Path) -> None:
    here = host_platform()
    layout = Layout(env.work / "layout-pinned")
    native = layout.image(
        [[file("which", b"pinned")]], architecture=here.architecture, variant=here.variant
    )
    index = layout.tag(layout.image_index([native]), "v1")
    env.registry.push(layout.path, "v1", "private/pinned", "v1", all=True)
    proxy = Proxy(env.registry.host)
    config = env.config(
        tmp_path,
        plain_http=(proxy.host,),
        credentials={proxy.host: RegistryCredentials(USER, PASSWORD)},
    )
    references = [f"{proxy.host}/private/pinned@{d}" for d in (index["digest"], native["digest"])]
    try:
        for reference in references:
            async with await acquire(config, reference) as lease:
                assert lease.config.digest == native["digest"]
    finally:
        proxy.close()
    # The host is gone; a new cache over the same directory still has both pins.
    for reference in references:
        async with await acquire(config, reference) as lease:
            assert (lease.root / "which").read_bytes() == b"pinned"
    with pytest.raises(ImagePullError, match="network error"):
        await acquire(config, f"{proxy.host}/private/pinned:v1")


async def test_plain_basic_auth(env: Env, tmp_path: Path) -> None:
    digest, _ = env.image("private/basic")
    front = Proxy(env.registry.host, basic=env.tokens)
    try:
        reference = f"{front.host}/private/basic:v1"
        with pytest.raises(ImagePullError, match="wants credentials and none are configured"):
            await acquire(env.config(tmp_path / "none", plain_http=(front.host,)), reference)
        credentials = {front.host: RegistryCredentials(USER, PASSWORD)}
        config = env.config(tmp_path / "ok", plain_http=(front.host,), credentials=credentials)
        async with await acquire(config, reference) as lease:
            assert lease.config.digest == digest
        wrong = {front.host: RegistryCredentials(USER, "wrong")}
        config = env.config(tmp_path / "wrong", plain_http=(front.host,), credentials=wrong)
        with pytest.raises(ImagePullError, match=r"unauthorized.*configured credentials"):
            await acquire(config, reference)
    finally:
        front.close()


async def test_blob_redirects_are_followed_without_the_token(env: Env, tmp_path: Path) -> None:
    digest, layers = env.image("private/redirected")
    storage = Storage()
    front = Proxy(env.registry.host, storage=storage)
    try:
        credentials = {front.host: RegistryCredentials(USER, PASSWORD)}
        config = env.config(
            tmp_path, plain_http=(front.host, storage.host), credentials=credentials
        )
        async with await acquire(config, f"{front.host}/private/redirected:v1") as lease:
            assert lease.config.digest == digest
            assert (lease.root / "marker").read_bytes() == b"private/redirected"
        assert len(storage.requests) == len(layers) + 1  # the layers and the config
        assert not any("Authorization" in headers for headers in storage.requests)
    finally:
        front.close()
        storage.close()


async def test_eviction_takes_the_blobs_only_evicted_images_used(env: Env, tmp_path: Path) -> None:
    first, first_layers = env.image("private/evicted")
    second, second_layers = env.image("private/kept")
    cache = ImageCache(env.config(tmp_path, max_bytes=0))
    host = env.registry.host
    await (await cache.acquire(RegistryImage(f"{host}/private/evicted:v1"))).release()
    async with await cache.acquire(RegistryImage(f"{host}/private/kept:v1")):
        assert [p.name for p in (tmp_path / "images").iterdir()] == [second[7:]]
        blobs = {p.name for p in (tmp_path / "blobs" / "sha256").iterdir()}
        assert not {d[7:] for d in (first, *first_layers)} & blobs
        assert {d[7:] for d in (second, *second_layers)} <= blobs
