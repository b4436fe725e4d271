"""Uid leases: exclusive across holders, given back on release, and leaving no file behind."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Any

import pytest

from sandbox import SandboxUnavailableError, UidRange
from sandbox._local._uids import lease_uid


def test_a_lease_is_exclusive_and_its_release_removes_its_file(tmp_path: Path) -> None:
    uids = UidRange(first=50_000, count=2, lock_dir=tmp_path)
    first, second = lease_uid(uids, tmp_path), lease_uid(uids, tmp_path)
    assert {first.uid, second.uid} == {50_000, 50_001}
    with pytest.raises(SandboxUnavailableError, match="all 2 sandbox uids"):
        lease_uid(uids, tmp_path)
    first.release()
    first.release()  # idempotent
    assert sorted(p.name for p in tmp_path.iterdir()) == [str(second.uid)]
    again = lease_uid(uids, tmp_path)
    assert again.uid == first.uid
    second.release()
    again.release()
    assert list(tmp_path.iterdir()) == []


def test_a_lock_on_a_file_its_holder_just_unlinked_is_not_a_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between our open and our lock, the holder releases (unlinks) and a third taker creates and
    locks a new file at the same path: our lock guards nothing, so the uid is not ours."""
    uids = UidRange(first=50_000, count=1, lock_dir=tmp_path)
    path = tmp_path / "50000"
    real_flock = fcntl.flock
    competitor: list[int] = []

    def flock_after_a_race(fd: Any, operation: int) -> None:
        if not competitor:
            path.unlink()
            competitor.append(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
            real_flock(competitor[0], fcntl.LOCK_EX | fcntl.LOCK_NB)
        real_flock(fd, operation)

    path.touch()
    monkeypatch.setattr(fcntl, "flock", flock_after_a_race)
    try:
        with pytest.raises(SandboxUnavailableError):
            lease_uid(uids, tmp_path)
    finally:
        os.close(competitor[0])
