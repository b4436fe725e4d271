"""Diff capture round-trips every kind of change onto a fresh checkout (real git, sandboxes).

The attacks an agent can make on the capture from inside its sandbox are in test_capture.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox import (
    CheckoutError,
    GitWorkspace,
    LocalBackend,
    SandboxCommandError,
    SandboxError,
    SandboxSpec,
    UnsupportedSpecError,
    capture_diff,
)
from sandbox._git_diff import UnsafePatchError, apply_diff, check_patch_paths

# A listing of the tree (path, mode, content hash) outside .git and junk, taken inside.
TREE_LISTING = (
    "find . -path ./.git -prune -o \\( -type f -o -type l \\) -print | LC_ALL=C sort | "
    'while read -r f; do printf \'%s %s \' "$f" "$(stat -c %a "$f")"; '
    'if [ -L "$f" ]; then readlink "$f"; else sha256sum < "$f"; fi; done'
)

AGENT_WORK = r"""set -e
printf 'x = 2\n' > edit.py
rm gone.txt
git mv -q old_name.txt new_name.txt 2>/dev/null || mv old_name.txt new_name.txt
chmod +x script.sh
head -c 3000 /dev/urandom > new.bin
mkdir 'dir with space'
printf 'fresh\n' > 'dir with space/new.txt'
ln -s keep.py link.py
mkdir -p pkg/__pycache__ node_modules/dep .pytest_cache
echo junk > pkg/__pycache__/m.cpython-311.pyc
echo junk > node_modules/dep/index.js
echo junk > .pytest_cache/x
echo log > ignored.log
git -c user.name=a -c user.email=a@b.invalid commit -q -am 'agent commit' || true
printf 'committed by agent\n' > committed.txt
git add committed.txt
git -c user.name=a -c user.email=a@b.invalid commit -q -m 'agent adds file'
printf 'after the commit\n' >> keep.py
"""


async def test_round_trip_of_every_kind_of_change(
    backend: LocalBackend, source_repo: tuple[Path, str]
) -> None:
    repo, base = source_repo
    spec = SandboxSpec(workspace=GitWorkspace(repo, base))
    async with await backend.create(spec) as agent_box:
        work = await agent_box.exec(AGENT_WORK)
        assert work.ok, work.stderr
        index_before = await agent_box.exec("sha256sum .git/index; git status --porcelain")
        diff = await capture_diff(agent_box, repo, base)
        index_after = await agent_box.exec("sha256sum .git/index; git status --porcelain")
        assert index_before.stdout == index_after.stdout  # the agent's index is untouched
        expected = await agent_box.exec(
            f"rm -rf pkg/__pycache__ node_modules .pytest_cache ignored.log && {TREE_LISTING}"
        )
    assert diff.base == base
    assert diff.left_out == ()
    assert b"GIT binary patch" in diff.patch
    assert b"rename from old_name.txt" in diff.patch
    assert b"new mode 100755" in diff.patch
    assert b"new file mode 120000" in diff.patch  # link.py, as a link
    assert set(diff.changed_paths) == {
        "edit.py",
        "gone.txt",
        "old_name.txt",
        "new_name.txt",
        "script.sh",
        "new.bin",
        "dir with space/new.txt",
        "link.py",
        "committed.txt",
        "keep.py",
    }
    assert "later.txt" not in diff.changed_paths  # a commit after base is not the agent's

    async with await backend.create(spec) as grader_box:
        await apply_diff(grader_box, diff.patch)
        actual = await grader_box.exec(TREE_LISTING)
    assert actual.stdout == expected.stdout
    assert "new_name.txt 644" in actual.stdout
    assert "script.sh 755" in actual.stdout


async def test_no_change_gives_an_empty_patch(
    backend: LocalBackend, source_repo: tuple[Path, str]
) -> None:
    repo, base = source_repo
    async with await backend.create(SandboxSpec(workspace=GitWorkspace(repo, base))) as box:
        await box.exec("mkdir -p a/__pycache__ && echo x > a/__pycache__/c.pyc")
        diff = await capture_diff(box, repo, base)
        assert diff.empty
        assert (diff.patch, diff.changed_paths, diff.left_out) == (b"", (), ())
        await apply_diff(box, diff.patch)  # no-op


async def test_hostile_git_config_cannot_bend_the_patch(
    backend: LocalBackend, source_repo: tuple[Path, str]
) -> None:
    repo, base = source_repo
    async with await backend.create(SandboxSpec(workspace=GitWorkspace(repo, base))) as box:
        await box.exec(
            "git config diff.noprefix true && git config color.ui always && "
            "git config core.fileMode false && git config core.fsmonitor 'touch /tmp/pwned' && "
            "printf 'y = 3\\n' >> edit.py"
        )
        diff = await capture_diff(box, repo, base)
        assert b"diff --git a/edit.py b/edit.py" in diff.patch
        assert b"+y = 3\n" in diff.patch
        assert b"\x1b[" not in diff.patch
        assert diff.changed_paths == ("edit.py",)
        assert (await box.exec("test -e /tmp/pwned")).exit_code == 1


async def test_capture_fails_loudly_without_a_repository(
    backend: LocalBackend, source_repo: tuple[Path, str], tmp_path: Path
) -> None:
    repo, base = source_repo
    async with await backend.create(SandboxSpec()) as box:
        # A workspace not from git: there is no read-only repository inside to list against.
        with pytest.raises(UnsupportedSpecError, match="mounted read-only"):
            await capture_diff(box, repo, base)
    async with await backend.create(SandboxSpec(workspace=GitWorkspace(repo, base))) as box:
        with pytest.raises(CheckoutError, match="does not exist") as missing:
            await capture_diff(box, tmp_path / "no-such-repository", base)
        assert isinstance(missing.value, SandboxError)
    with pytest.raises(ValueError, match="hex commit"):
        await capture_diff(box, repo, "HEAD")


async def test_capture_fails_loudly_for_a_base_the_repository_lacks(
    backend: LocalBackend, source_repo: tuple[Path, str]
) -> None:
    repo, base = source_repo
    async with await backend.create(SandboxSpec(workspace=GitWorkspace(repo, base))) as box:
        with pytest.raises(SandboxCommandError, match="diff capture failed"):
            await capture_diff(box, repo, "0123456789abcdef" * 2 + "01234567")


@pytest.mark.parametrize(
    "header",
    [
        b"diff --git a/.git/hooks/pre-commit b/.git/hooks/pre-commit",
        b"rename to sub/.GIT/config",
        b"diff --git a/../escape b/../escape",
    ],
)
def test_patches_into_git_dir_or_outside_are_refused(header: bytes) -> None:
    with pytest.raises(UnsafePatchError):
        check_patch_paths(b"some text\n" + header + b"\n")


def test_ordinary_patch_paths_are_accepted() -> None:
    check_patch_paths(b"diff --git a/src/.gitignore b/src/.gitignore\nrename to a/git/b\n")


async def test_a_patch_that_does_not_apply_raises(
    backend: LocalBackend, source_repo: tuple[Path, str]
) -> None:
    repo, base = source_repo
    bogus = (
        b"diff --git a/edit.py b/edit.py\n--- a/edit.py\n+++ b/edit.py\n@@ -1 +1 @@\n-nope\n+x\n"
    )
    async with await backend.create(SandboxSpec(workspace=GitWorkspace(repo, base))) as box:
        with pytest.raises(SandboxCommandError, match="git apply failed"):
            await apply_diff(box, bogus)
        assert (await box.read_text("edit.py")) == "x = 1\n"
