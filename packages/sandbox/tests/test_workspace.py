"""Checkouts from a real repository, and setup commands run in a real sandbox."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox import CheckoutError, LocalSandbox, SetupFailedError, checkout_repo, run_setup

from .conftest import git


def test_checkout_is_detached_at_the_base_and_shares_objects(
    source_repo: tuple[Path, str], tmp_path: Path
) -> None:
    repo, base = source_repo
    checkout = checkout_repo(repo, base[:10], tmp_path / "co")
    assert checkout.commit == base
    assert git(checkout.path, "rev-parse", "HEAD") == base
    assert git(checkout.path, "status", "--porcelain") == ""
    assert not (checkout.path / "later.txt").exists()
    alternates = (checkout.path / ".git/objects/info/alternates").read_text().strip()
    assert Path(alternates) == checkout.shared_objects == (repo / ".git/objects").resolve()


def test_checkout_errors_are_clear(source_repo: tuple[Path, str], tmp_path: Path) -> None:
    repo, _ = source_repo
    with pytest.raises(CheckoutError, match="not found"):
        checkout_repo(repo, "deadbeef" * 5, tmp_path / "a")
    with pytest.raises(CheckoutError, match="does not exist"):
        checkout_repo(tmp_path / "missing", "HEAD", tmp_path / "b")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("")
    with pytest.raises(CheckoutError, match="not empty"):
        checkout_repo(repo, "HEAD", busy)


async def test_run_setup_stops_at_the_first_failure(box: LocalSandbox) -> None:
    done = await run_setup(box, ["echo one > a.txt", "echo two"], timeout=10)
    assert [r.stdout for r in done] == ["", "two\n"]
    with pytest.raises(SetupFailedError, match="exited 3") as failed:
        await run_setup(box, ["echo ok", "echo bad >&2; exit 3", "touch never"])
    assert failed.value.result.stderr == "bad\n"
    assert (await box.exec("test -e never")).exit_code == 1
    with pytest.raises(SetupFailedError, match="timed out"):
        await run_setup(box, ["sleep 5"], timeout=0.2)
