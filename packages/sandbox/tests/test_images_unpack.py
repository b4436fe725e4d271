"""Unpacking image layers: the result `umoci unpack` gives, and no write outside the root.

Every image here is built by the test (image_fixtures.py) as an OCI layout and acquired through
the real `ImageCache`. The umoci comparison needs Debian's `umoci` (apt-get install umoci) and
skips without it; everything else runs anywhere, as root and as an ordinary user (then files
belong to the caller and device nodes are skipped, as docs/images.md says).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sandbox._images import ImageCache, ImageCacheConfig, ImageLease, ImagePullError
from sandbox._images._scoped import remove_tree
from sandbox._spec import OciLayoutImage

from .image_fixtures import (
    MTIME,
    Entry,
    Layout,
    build,
    char_device,
    directory,
    fifo,
    file,
    hardlink,
    opaque,
    symlink,
)

ROOT = os.geteuid() == 0
UMOCI = shutil.which("umoci")


async def acquire(tmp_path: Path, layout: Path, ref: str | None = "t") -> ImageLease:
    cache = ImageCache(ImageCacheConfig(root=tmp_path / "cache"))
    return await cache.acquire(OciLayoutImage(layout, ref))


def snapshot(root: Path) -> dict[str, dict[str, Any]]:
    """Every path under `root` (root itself as '.'): type, mode, owner, content, link target,
    device, mtime, and which other paths share its inode."""
    inodes: dict[tuple[int, int], list[str]] = {}
    found: dict[str, os.stat_result] = {}
    stack = [root]
    while stack:
        here = stack.pop()
        for entry in os.scandir(here):
            info = entry.stat(follow_symlinks=False)
            found[os.path.relpath(entry.path, root)] = info
            if stat.S_ISDIR(info.st_mode):
                stack.append(Path(entry.path))
    found["."] = os.lstat(root)
    for name, info in found.items():
        if not stat.S_ISDIR(info.st_mode):
            inodes.setdefault((info.st_dev, info.st_ino), []).append(name)
    tree: dict[str, dict[str, Any]] = {}
    for name, info in found.items():
        record: dict[str, Any] = {
            "type": stat.S_IFMT(info.st_mode),
            "mode": oct(stat.S_IMODE(info.st_mode)),
            "owner": (info.st_uid, info.st_gid),
            "mtime": info.st_mtime_ns,
        }
        path = root / name
        if not stat.S_ISLNK(info.st_mode):
            record["xattrs"] = {
                key: os.getxattr(path, key, follow_symlinks=False)
                for key in sorted(os.listxattr(path, follow_symlinks=False))
            }
        if stat.S_ISREG(info.st_mode):
            record["size"] = info.st_size
            record["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
            record["links"] = sorted(inodes[(info.st_dev, info.st_ino)])
        elif stat.S_ISLNK(info.st_mode):
            record["target"] = os.readlink(path)
            record["links"] = sorted(inodes[(info.st_dev, info.st_ino)])
        elif stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode):
            record["device"] = (os.major(info.st_rdev), os.minor(info.st_rdev))
        tree[name] = record
    return tree


def user_xattrs(directory: Path) -> bool:
    """Whether this file system takes user.* extended attributes (tmpfs did not always)."""
    probe = directory / "xattr-probe"
    probe.write_bytes(b"")
    try:
        os.setxattr(probe, "user.probe", b"1")
    except OSError:
        return False
    finally:
        probe.unlink()
    return True


def rich_layers() -> list[list[Entry]]:
    """Layers exercising every rule: owners, special modes, long and deep names, links of every
    kind, whiteouts and opaque directories in either order, type changes, exact times."""
    long_name = "d" * 120 + "/" + "f" * 200
    deep = "/".join(f"level{i}" for i in range(40))
    base: list[Entry] = [
        directory("bin/"),
        file("bin/tool", b"#!/bin/sh\necho tool\n", mode=0o755),
        file("bin/su", b"setuid", mode=0o4755),
        file("bin/wall", b"setgid", mode=0o2755, gid=5),
        directory("tmp/", mode=0o1777),
        directory("srv/", mode=0o2775, uid=1000, gid=1001),
        file("srv/owned", b"by 1000", uid=1000, gid=1001, mode=0o640),
        file("srv/big-ids", b"x", uid=70000, gid=70001),
        directory("ro/", mode=0o555),
        file("ro/kept", b"kept"),
        file("ro/hidden-later", b"gone"),
        directory("usr/"),
        directory("usr/lib/"),
        file("usr/lib/libc.so", b"\x7fELF" + bytes(range(256)) * 40, mode=0o755),
        symlink("lib", "usr/lib"),
        symlink("abs-link", "/usr/lib/libc.so"),
        symlink("dangling", "nowhere/at/all"),
        hardlink("usr/lib/libc-alias.so", "usr/lib/libc.so"),
        directory("gone-dir/"),
        directory("gone-dir/sub/"),
        file("gone-dir/sub/file", b"deep"),
        file("gone-file", b"bye"),
        directory("opaque-first/"),
        file("opaque-first/lower", b"lower"),
        directory("opaque-last/"),
        file("opaque-last/lower", b"lower"),
        directory("opaque-last/lower-dir/"),
        file("opaque-last/lower-dir/x", b"x"),
        file("becomes-dir", b"file"),
        directory("becomes-file/"),
        file("becomes-file/child", b"child"),
        symlink("link-replaced", "usr/lib/libc.so"),
        file("shared-inode", b"both layers"),
        directory("d" * 120 + "/"),
        file(long_name, b"long"),
        *(directory(deep.rsplit("/", i)[0] + "/") for i in range(39, -1, -1)),
        file(deep + "/bottom", b"bottom"),
        file("precise", b"t", mtime=1_700_000_000.123456),
        file("unicodé ✓", b"utf-8 name"),
        file("annotated", b"x", xattrs={"user.note": "kept"}),
        file("latin-1 \udce9t\udce9", b"a name that is not UTF-8"),
        fifo("pipe"),
    ]
    if ROOT:
        base.append(char_device("null", 1, 3))
    upper: list[Entry] = [
        # A whiteout of a file, of a directory tree, and of a path inside a read-only directory.
        file(".wh.gone-file"),
        directory("gone-dir/", mtime=MTIME + 5),
        file("gone-dir/.wh.sub"),
        file("ro/.wh.hidden-later"),
        file("ro/added", b"written below a read-only directory"),
        # Opaque marker first, then this layer's own entry; and the other way round.
        directory("opaque-first/", mtime=MTIME + 7),
        file("opaque-first/.wh..wh..opq"),
        file("opaque-first/upper", b"upper"),
        directory("opaque-last/"),
        file("opaque-last/upper", b"upper"),
        directory("opaque-last/upper-dir/"),
        file("opaque-last/upper-dir/y", b"y"),
        opaque("opaque-last"),
        # Types change; a symlink is replaced, never written through.
        directory("becomes-dir/", mode=0o750),
        file("becomes-dir/inside", b"inside"),
        file("becomes-file", b"now a file"),
        file("link-replaced", b"replaced the link"),
        # Through the parent symlink lib -> usr/lib, as a runtime resolves it.
        file("lib/through-link", b"via lib"),
        # A hard link to a file of the layer below, and a new file over an old hard link.
        hardlink("second-name", "shared-inode"),
        file("usr/lib/libc-alias.so", b"new content, own inode"),
        directory("srv/", mode=0o2770, uid=1000, gid=1001, mtime=MTIME + 9),
    ]
    top: list[Entry] = [
        # The hard link's original goes; the link stays with its content.
        file(".wh.shared-inode"),
        directory("bin/", mode=0o711),
    ]
    return [base, upper, top]


def expected_paths() -> set[str]:
    return {
        "bin/su",
        "ro/kept",
        "ro/added",
        "opaque-first/upper",
        "opaque-last/upper",
        "opaque-last/upper-dir/y",
        "becomes-dir/inside",
        "usr/lib/through-link",
        "second-name",
    }


async def test_rich_image_unpacks_by_the_layer_rules(tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    build(layout, "t", rich_layers())
    async with await acquire(tmp_path, layout) as lease:
        tree = snapshot(lease.root)
    assert expected_paths() <= set(tree)
    for gone in (
        "gone-file",
        "gone-dir/sub",
        "ro/hidden-later",
        "opaque-first/lower",
        "opaque-last/lower",
        "opaque-last/lower-dir",
        "shared-inode",
        "becomes-file/child",
    ):
        assert gone not in tree, gone
    assert not any(".wh." in name for name in tree)
    assert tree["bin/su"]["mode"] == oct(0o4755)
    assert tree["tmp"]["mode"] == oct(0o1777)
    assert tree["ro"]["mode"] == oct(0o555)
    assert tree["bin"]["mode"] == oct(0o711)
    assert tree["becomes-file"]["type"] == stat.S_IFREG
    assert tree["becomes-dir"]["type"] == stat.S_IFDIR
    assert tree["link-replaced"]["type"] == stat.S_IFREG
    assert tree["lib"]["target"] == "usr/lib"
    assert tree["second-name"]["sha256"] == hashlib.sha256(b"both layers").hexdigest()
    assert tree["usr/lib/libc.so"]["links"] == ["usr/lib/libc.so"]
    assert tree["precise"]["mtime"] == 1_700_000_000_123_456_000
    assert tree["gone-dir"]["mtime"] == (MTIME + 5) * 10**9
    assert tree["pipe"]["type"] == stat.S_IFIFO
    if user_xattrs(tmp_path):
        assert tree["annotated"]["xattrs"] == {"user.note": b"kept"}
    if ROOT:
        assert tree["srv/owned"]["owner"] == (1000, 1001)
        assert tree["srv/big-ids"]["owner"] == (70000, 70001)
        assert tree["srv"]["mode"] == oct(0o2770)
        assert tree["null"]["device"] == (1, 3)
    else:
        assert tree["srv/owned"]["owner"] == (os.geteuid(), os.getegid())
        assert "null" not in tree


@pytest.mark.skipif(UMOCI is None, reason="umoci is not installed (apt-get install umoci)")
async def test_unpack_matches_umoci(tmp_path: Path) -> None:
    layout = tmp_path / "layout"
    build(layout, "t", rich_layers())
    bundle = tmp_path / "bundle"
    command = [str(UMOCI), "unpack", *([] if ROOT else ["--rootless"]), "--image"]
    subprocess.run([*command, f"{layout}:t", str(bundle)], check=True, capture_output=True)
    theirs = snapshot(bundle / "rootfs")
    async with await acquire(tmp_path, layout) as lease:
        ours = snapshot(lease.root)
    if not ROOT:
        # Rootless umoci keeps devices as empty placeholder files (we skip them) and notes the
        # tar's owners in an xattr of its own (ours are the caller's, as docs/images.md says).
        theirs = {k: v for k, v in theirs.items() if k != "null"}
        for record in theirs.values():
            record.get("xattrs", {}).pop("user.rootlesscontainers", None)
    assert sorted(ours) == sorted(theirs)
    for name in sorted(ours):
        assert ours[name] == theirs[name], name


async def test_gzip_zstd_and_plain_layers_unpack_alike(tmp_path: Path) -> None:
    pytest.importorskip("zstandard")
    trees = []
    for compression in ("gzip", "zstd", "none"):
        layout = tmp_path / compression
        build(layout, "t", rich_layers(), compression=compression)
        async with await acquire(tmp_path / f"{compression}-cache", layout) as lease:
            trees.append(snapshot(lease.root))
    assert trees[0] == trees[1] == trees[2]


async def test_zstd_layer_without_the_module_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("zstandard")
    build(tmp_path / "layout", "t", [[file("a", b"a")]], compression="zstd")
    monkeypatch.setitem(__import__("sys").modules, "zstandard", None)
    with pytest.raises(ImagePullError, match=r"zstd.*agent-rl-sandbox\[zstd\]"):
        await acquire(tmp_path, tmp_path / "layout")
    assert_nothing_cached(tmp_path / "cache")


def assert_nothing_cached(cache: Path) -> None:
    """No image was made, and no half-made one was left behind."""
    assert list((cache / "images").iterdir()) == []
    assert list((cache / "tmp").iterdir()) == []


# -- attacks: no entry may write, link or remove outside the root ---------------------------


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """A host directory an attacking layer aims at, with a file it would like to change."""
    victim = tmp_path / "host"
    victim.mkdir()
    (victim / "secret").write_text("host data")
    return victim


def host_state(host: Path) -> list[tuple[str, int, int, str]]:
    return [
        (p.name, p.stat().st_nlink, p.stat().st_mode, p.read_text() if p.is_file() else "")
        for p in sorted(host.iterdir())
    ]


async def unpack_attack(tmp_path: Path, layers: list[list[Entry]]) -> Path | None:
    """The unpacked root, or None when the layer was refused (and then nothing is cached)."""
    build(tmp_path / "layout", "t", layers)
    try:
        lease = await acquire(tmp_path, tmp_path / "layout")
    except ImagePullError:
        assert_nothing_cached(tmp_path / "cache")
        return None
    await lease.release()
    return lease.root


async def test_absolute_and_climbing_names_stay_inside(tmp_path: Path, host: Path) -> None:
    before = host_state(host)
    climb = "../" * 30 + str(host).lstrip("/")
    root = await unpack_attack(
        tmp_path, [[file(f"{host}/secret", b"pwned"), file(f"{climb}/new", b"pwned")]]
    )
    assert host_state(host) == before
    assert root is not None
    inside = root / str(host).lstrip("/")
    assert (inside / "secret").read_bytes() == b"pwned"
    assert (inside / "new").read_bytes() == b"pwned"


@pytest.mark.parametrize(
    "link_target",
    ["HOST", "../../../../../../../../HOST", "/../../HOST/."],
    ids=["absolute", "climbing", "dotted"],
)
async def test_writes_through_a_symlink_stay_inside(
    tmp_path: Path, host: Path, link_target: str
) -> None:
    before = host_state(host)
    target = link_target.replace(
        "HOST", str(host).lstrip("/") if "../" in link_target else str(host)
    )
    root = await unpack_attack(
        tmp_path,
        [
            [symlink("escape", target)],
            [file("escape/secret", b"pwned"), file("escape/planted", b"pwned")],
        ],
    )
    assert host_state(host) == before
    assert root is not None
    assert (root / str(host).lstrip("/") / "planted").read_bytes() == b"pwned"


async def test_a_symlink_chain_to_the_host_stays_inside(tmp_path: Path, host: Path) -> None:
    before = host_state(host)
    await unpack_attack(
        tmp_path,
        [
            [symlink("a", "b"), symlink("b", "c/../../.."), directory("c/"), symlink("c/d", "/")],
            [file(f"a/{str(host).lstrip('/')}/secret", b"pwned")],
        ],
    )
    assert host_state(host) == before


async def test_a_file_replaces_a_symlink_rather_than_writing_through_it(
    tmp_path: Path, host: Path
) -> None:
    before = host_state(host)
    root = await unpack_attack(
        tmp_path, [[symlink("config", str(host / "secret"))], [file("config", b"pwned")]]
    )
    assert host_state(host) == before
    assert root is not None
    assert not (root / "config").is_symlink()
    assert (root / "config").read_bytes() == b"pwned"


async def test_hard_links_never_reach_host_files(tmp_path: Path, host: Path) -> None:
    before = host_state(host)
    for name, layers in {
        "absolute": [[hardlink("stolen", str(host / "secret"))]],
        "climbing": [[hardlink("stolen", "../../../../../../.." + str(host / "secret"))]],
        "via-symlink": [[symlink("escape", str(host))], [hardlink("stolen", "escape/secret")]],
    }.items():
        root = await unpack_attack(tmp_path / name, layers)
        assert root is None, name  # the target is not in the image: refused
        assert host_state(host) == before, name


async def test_whiteouts_through_a_symlink_remove_nothing_outside(
    tmp_path: Path, host: Path
) -> None:
    before = host_state(host)
    for name, marker in {"whiteout": "escape/.wh.secret", "opaque": "escape/.wh..wh..opq"}.items():
        await unpack_attack(tmp_path / name, [[symlink("escape", str(host))], [file(marker)]])
        assert host_state(host) == before, name


async def test_a_symlink_loop_is_refused(tmp_path: Path) -> None:
    root = await unpack_attack(tmp_path, [[symlink("loop", "loop"), file("loop/x", b"x")]])
    assert root is None


async def test_the_root_cannot_become_a_symlink(tmp_path: Path, host: Path) -> None:
    root = await unpack_attack(tmp_path, [[symlink("./", str(host)), file("x", b"x")]])
    assert root is None


# -- malformed layers and digests -----------------------------------------------------------


def corrupt_layer(layout: Path, mutate: Any) -> str:
    """Rewrite the (only) layer blob of the layout's image in place; returns its digest."""
    import json

    index = json.loads((layout / "index.json").read_text())
    blobs = layout / "blobs" / "sha256"
    manifest = json.loads((blobs / index["manifests"][0]["digest"][7:]).read_text())
    digest: str = manifest["layers"][0]["digest"]
    path = blobs / digest[7:]
    path.write_bytes(mutate(path.read_bytes()))
    return digest


@pytest.mark.parametrize(
    "mutate",
    [
        lambda b: b[: len(b) // 2],
        lambda b: b[:-1] + bytes([b[-1] ^ 1]),
        lambda b: b"\x1f\x8b" + b"garbage" * 10,
    ],
    ids=["truncated", "flipped-byte", "not-gzip"],
)
async def test_a_changed_layer_blob_is_refused_naming_its_digest(
    tmp_path: Path, mutate: Any
) -> None:
    build(tmp_path / "layout", "t", [[file("a", b"a" * 10000), file("b", b"b")]])
    digest = corrupt_layer(tmp_path / "layout", mutate)
    with pytest.raises(ImagePullError, match=digest):
        await acquire(tmp_path, tmp_path / "layout")
    assert_nothing_cached(tmp_path / "cache")


async def test_a_malformed_tar_is_refused(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "layout")
    import gzip

    blob = gzip.compress(b"this is not a tar archive" * 40)
    descriptor = layout.image([[file("a")]])
    # Swap the layer for the bad one and re-describe the manifest around it.
    import json

    blobs = tmp_path / "layout" / "blobs" / "sha256"
    manifest = json.loads((blobs / descriptor["digest"][7:]).read_text())
    config = json.loads((blobs / manifest["config"]["digest"][7:]).read_text())
    config["rootfs"]["diff_ids"] = ["sha256:" + hashlib.sha256(gzip.decompress(blob)).hexdigest()]
    manifest["config"] = layout.descriptor(
        json.dumps(config).encode(), manifest["config"]["mediaType"]
    )
    manifest["layers"] = [layout.descriptor(blob, manifest["layers"][0]["mediaType"])]
    layout.tag(layout.descriptor(json.dumps(manifest).encode(), descriptor["mediaType"]), "t")
    with pytest.raises(ImagePullError, match="is malformed"):
        await acquire(tmp_path, tmp_path / "layout")
    assert_nothing_cached(tmp_path / "cache")


async def test_a_wrong_diff_id_is_refused(tmp_path: Path) -> None:
    wrong = "sha256:" + "0" * 64
    build(tmp_path / "layout", "t", [[file("a", b"a")]], diff_ids=[wrong])
    with pytest.raises(ImagePullError, match=f"uncompressed.*{wrong}"):
        await acquire(tmp_path, tmp_path / "layout")
    assert_nothing_cached(tmp_path / "cache")


# -- choosing the image in a layout ---------------------------------------------------------


async def test_layout_refs_nested_indexes_and_platforms(tmp_path: Path) -> None:
    from sandbox._images import host_platform

    here = host_platform()
    layout = Layout(tmp_path / "layout")
    native = layout.image(
        [[file("which", b"native")]], architecture=here.architecture, variant=here.variant
    )
    other_arch = "s390x" if here.architecture != "s390x" else "amd64"
    foreign = layout.image([[file("which", b"foreign")]], architecture=other_arch)
    layout.tag(layout.image_index([foreign, native]), "multi")
    layout.tag(layout.image([[file("which", b"plain")]]), "plain")
    nested = layout.image_index([layout.image_index([foreign, native])])
    layout.tag(nested, "nested")
    layout.tag(layout.image_index([foreign]), "foreign-only")

    for ref, expected in {"multi": b"native", "plain": b"plain", "nested": b"native"}.items():
        async with await acquire(tmp_path, layout.path, ref) as lease:
            assert (lease.root / "which").read_bytes() == expected, ref
            if ref == "multi":
                assert lease.config.digest == native["digest"]
    with pytest.raises(ImagePullError, match=f"no manifest for platform {here}"):
        await acquire(tmp_path, layout.path, "foreign-only")
    with pytest.raises(ImagePullError, match="no image named 'missing'"):
        await acquire(tmp_path, layout.path, "missing")
    with pytest.raises(ImagePullError, match="holds 4 images"):
        await acquire(tmp_path, layout.path, None)

    single = tmp_path / "single"
    build(single, "only", [[file("which", b"only")]])
    async with await acquire(tmp_path, single, None) as lease:
        assert (lease.root / "which").read_bytes() == b"only"


async def test_image_config_is_reported(tmp_path: Path) -> None:
    build(
        tmp_path / "layout",
        "t",
        [[file("a")]],
        config={
            "Env": ["PATH=/usr/local/bin:/usr/bin", "EMPTY=", "X=a=b"],
            "WorkingDir": "/testbed",
            "User": "1000:1000",
        },
    )
    async with await acquire(tmp_path, tmp_path / "layout") as lease:
        assert dict(lease.config.env) == {
            "PATH": "/usr/local/bin:/usr/bin",
            "EMPTY": "",
            "X": "a=b",
        }
        assert str(lease.config.working_dir) == "/testbed"
        assert lease.config.user == "1000:1000"
        assert lease.config.digest.startswith("sha256:")


async def test_an_opaque_marker_over_a_deep_tree_of_its_own_layer(tmp_path: Path) -> None:
    deep = "/".join(["n"] * 1500)  # deeper than Python's recursion limit
    layers = [
        [directory("top/"), file("top/lower", b"lower")],
        [
            directory("top/"),
            *(directory("top/" + deep.rsplit("/", i)[0] + "/") for i in range(1499, -1, -1)),
            file(f"top/{deep}/leaf", b"leaf"),
            opaque("top"),
        ],
    ]
    build(tmp_path / "layout", "t", layers)
    try:
        async with await acquire(tmp_path, tmp_path / "layout") as lease:
            assert not (lease.root / "top" / "lower").exists()
            assert (lease.root / "top" / deep / "leaf").read_bytes() == b"leaf"
    finally:
        remove_tree(str(tmp_path / "cache"))  # too deep for pytest's recursive clean-up
