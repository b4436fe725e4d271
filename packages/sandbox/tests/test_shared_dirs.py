"""Shared directories are hostile: what another local user plants there is never followed.

Each attack is what a second user on the host could do in /tmp before or while sandboxes run:
plant a link named like a stale state directory (root's sweep used to follow it and chmod the
target to 0777), pre-create the directory our state or uid leases go to, or plant links inside
a state directory. Where an attack needs another user's ownership, the test (as root) makes the
planted file belong to an unused uid; as an unprivileged user those cases are skipped, the rest
runs the same.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from sandbox import LocalBackend, SandboxUnavailableError, UidRange
from sandbox._local._owner import owner_tag
from sandbox._local._private_dirs import private_dir, remove_tree
from sandbox._local._uids import lease_uid

from .conftest import local_config

OTHER_UID = 54_321  # a uid no test process runs as
AS_ROOT = os.geteuid() == 0
root_only = pytest.mark.skipif(not AS_ROOT, reason="planting another user's files needs root")


def stale_name() -> str:
    """A state directory name whose owner tag names a dead process (our pid, another start)."""
    ns, pid, start, _ = owner_tag().split("-")
    return f"sandbox-{ns}-{pid}-{int(start) + 1}-planted"


async def test_the_sweep_never_follows_a_link_planted_as_a_stale_state_dir(
    tmp_path: Path,
) -> None:
    target = tmp_path / "precious"
    target.mkdir(mode=0o755)
    (target / "keep.txt").write_text("mine")
    state = tmp_path / "state"
    state.mkdir()
    link = state / stale_name()
    link.symlink_to(target)
    if AS_ROOT:
        os.lchown(link, OTHER_UID, OTHER_UID)
    backend = LocalBackend(local_config(state))
    await backend.enforcement()  # prepares the backend, which sweeps stale state
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    assert (target / "keep.txt").read_text() == "mine"


async def test_a_stale_state_dir_of_ours_is_swept(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    leftover = state / stale_name()
    (leftover / "io").mkdir(parents=True)
    (leftover / "io" / "out").write_text("x")
    os.chmod(leftover / "io", 0)
    await LocalBackend(local_config(state)).enforcement()
    assert not leftover.exists()


def test_removing_a_tree_never_follows_a_link_inside_it(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o500)
    tree = tmp_path / "tree"
    (tree / "deep").mkdir(parents=True)
    (tree / "deep" / "link").symlink_to(outside)
    (tree / "deep" / "file-link").symlink_to(outside / "nothing")
    os.chmod(tree / "deep", 0)
    remove_tree(tree)
    assert not tree.exists()
    assert stat.S_IMODE(outside.stat().st_mode) == 0o500  # never chmodded through the link


def test_a_private_dir_is_made_or_taken_only_when_it_is_really_ours(tmp_path: Path) -> None:
    made = private_dir(tmp_path / "fresh")
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
    assert private_dir(made) == made  # ours already: taken
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(elsewhere)
    with pytest.raises(SandboxUnavailableError, match="not a directory"):
        private_dir(tmp_path / "link")
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(SandboxUnavailableError, match="writable by other users"):
        private_dir(shared)


@root_only
def test_a_private_dir_planted_by_another_user_is_refused(tmp_path: Path) -> None:
    planted = tmp_path / "planted"
    planted.mkdir(mode=0o700)
    os.chown(planted, OTHER_UID, OTHER_UID)
    with pytest.raises(SandboxUnavailableError, match=f"belongs to uid {OTHER_UID}"):
        private_dir(planted)


@root_only
def test_a_uid_lease_directory_planted_by_another_user_is_refused(tmp_path: Path) -> None:
    planted = tmp_path / "uids"
    planted.mkdir(mode=0o700)
    os.chown(planted, OTHER_UID, OTHER_UID)
    with pytest.raises(SandboxUnavailableError, match="belongs to uid"):
        lease_uid(UidRange(lock_dir=planted), tmp_path / "unused")
    own = tmp_path / "own-uids"
    lease = lease_uid(UidRange(lock_dir=own), tmp_path / "unused")
    lease.release()
    assert stat.S_IMODE(own.stat().st_mode) == 0o700
