"""Sandboxes on a task's own root file system (SandboxSpec.image): its files, tools and
configuration, read-only; the workspace where the image keeps the repository, writable; our
own init and file helpers running in any image, even one with no libc, Python or shell; and
nothing of the host reachable through the image's links."""

from __future__ import annotations

import hashlib
import os
import shlex
import sys
from pathlib import Path, PurePosixPath

import pytest

from sandbox import (
    ImageWorkspace,
    LocalBackend,
    ResourceLimits,
    RootfsImage,
    SandboxCommandError,
    SandboxSpec,
    UnsupportedSpecError,
    apply_diff,
    capture_diff,
)

from .conftest import git
from .image_roots import TESTBED_FILES, debian_root, static_root

PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def debian(**overrides: object) -> RootfsImage:
    config: dict[str, object] = {
        "env": {"PATH": PATH},
        "working_dir": PurePosixPath("/testbed"),
        **overrides,
    }
    return RootfsImage(debian_root(), **config)  # type: ignore[arg-type]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def test_commands_run_on_the_images_own_files(backend: LocalBackend) -> None:
    root = debian_root()
    python = Path(os.path.realpath(root / "usr/bin/python3"))
    # The host's own interpreter installation, where it is not under /usr, is not there.
    host_only = "" if sys.base_prefix.startswith("/usr") else sys.base_prefix
    unseen = f"; test ! -e {shlex.quote(host_only)}" if host_only else ""
    async with await backend.create(SandboxSpec(image=debian())) as box:
        found = await box.exec(
            'grep VERSION_CODENAME /etc/os-release; sha256sum "$(readlink -f /usr/bin/python3)";'
            f" python3 -c 'import sys; print(sys.prefix)'; git --version{unseen}"
        )
        assert found.exit_code == 0, found.stderr
        codename, digest, prefix, git_version = found.stdout.splitlines()
        assert codename == "VERSION_CODENAME=bookworm"
        assert digest.split()[0] == sha256(root / python.relative_to(root))
        assert prefix == "/usr"
        assert git_version.startswith("git version ")


async def test_the_image_is_read_only_and_left_as_it_was(backend: LocalBackend) -> None:
    root = debian_root()
    before = sorted(os.listdir(root / "usr/bin"))
    async with await backend.create(SandboxSpec(image=debian())) as box:
        for path in ("/usr/bin/planted", "/etc/planted", "/planted", "/testbed/planted"):
            written = await box.exec(f"echo x > {path}")
            assert written.exit_code != 0, path
            assert "Read-only file system" in written.stderr, written.stderr
        scratch = await box.exec("echo x > /tmp/ok && echo x > /var/tmp/ok && echo x > ~/ok")
        assert scratch.exit_code == 0, scratch.stderr
    assert sorted(os.listdir(root / "usr/bin")) == before
    assert not (root / "etc/planted").exists()
    assert not (root / "testbed/planted").exists()


async def test_the_workspace_is_the_images_directory_made_writable(
    backend: LocalBackend,
) -> None:
    root = debian_root()
    base = git(root / "testbed", "-c", "safe.directory=*", "rev-parse", "HEAD")
    spec = SandboxSpec(image=debian(), workspace=ImageWorkspace())
    async with await backend.create(spec) as box:
        assert box.workspace == "/testbed"
        state = await box.exec("pwd; git rev-parse HEAD; git status --porcelain; cat calc.py")
        assert state.exit_code == 0, state.stderr
        lines = state.stdout.splitlines()
        assert lines[:2] == ["/testbed", base]
        assert "\n".join(lines[2:]) + "\n" == TESTBED_FILES["calc.py"]
        await box.write_file("calc.py", "def add(a, b):\n    return a + b\n")
        commit = "git -c user.name=a -c user.email=a@b commit -qam fix"
        edited = await box.exec(f"git diff --stat && {commit}")
        assert edited.exit_code == 0, edited.stderr
        assert "calc.py | 2 +-" in edited.stdout
    assert (root / "testbed" / "calc.py").read_text() == TESTBED_FILES["calc.py"]
    assert git(root / "testbed", "-c", "safe.directory=*", "rev-parse", "HEAD") == base
    async with await backend.create(spec) as fresh:
        assert await fresh.read_text("calc.py") == TESTBED_FILES["calc.py"]


async def test_the_images_environment_and_user_are_honored(backend: LocalBackend) -> None:
    image = debian(env={"PATH": PATH, "TASK_MARK": "image", "SHADOWED": "image"}, user="nobody")
    spec = SandboxSpec(image=image, env={"SHADOWED": "spec"})
    async with await backend.create(spec) as box:
        seen = await box.exec('id -u; id -g; echo "$HOME $TASK_MARK $SHADOWED"; touch ~/x')
        assert seen.exit_code == 0, seen.stderr
        assert seen.stdout.splitlines() == ["65534", "65534", "/nonexistent image spec"]
    async with await backend.create(SandboxSpec(image=debian(user="1234:4321"))) as box:
        seen = await box.exec("id -u; id -g; echo $HOME")
        assert seen.stdout.splitlines() == ["1234", "4321", "/root"]


async def test_an_unknown_image_user_is_refused(backend: LocalBackend) -> None:
    with pytest.raises(UnsupportedSpecError, match="not in its /etc/passwd"):
        await backend.create(SandboxSpec(image=debian(user="nosuchuser")))


async def test_an_image_with_no_libc_python_or_shell_still_boots(
    backend: LocalBackend, tmp_path: Path
) -> None:
    """Init and the file helpers are ours (the host's interpreter through the host's loader),
    so they need nothing of the image; commands are the image's, so without a shell there."""
    root = static_root(tmp_path)
    spec = SandboxSpec(image=RootfsImage(root), workspace=ImageWorkspace(PurePosixPath("/testbed")))
    async with await backend.create(spec) as box:
        await box.write_file("note.txt", "written by our helper")
        assert await box.read_text("/testbed/note.txt") == "written by our helper"
        assert await box.read_text("/etc/marker") == "the image's own /etc\n"
        with pytest.raises(SandboxCommandError, match="cannot start /bin/bash"):
            await box.exec("echo hi")


async def test_a_workspace_reached_through_a_link_is_refused(
    backend: LocalBackend, tmp_path: Path
) -> None:
    root = static_root(tmp_path)
    (root / "testbed").rmdir()
    (root / "testbed").symlink_to("/etc")  # on the host: the host's /etc
    spec = SandboxSpec(image=RootfsImage(root), workspace=ImageWorkspace(PurePosixPath("/testbed")))
    with pytest.raises(UnsupportedSpecError, match="symbolic link"):
        await backend.create(spec)
    assert list((tmp_path / "state").iterdir()) == []


async def test_the_images_links_resolve_inside_never_on_the_host(
    backend: LocalBackend, tmp_path: Path
) -> None:
    root = static_root(tmp_path)
    (root / "hostetc").symlink_to("/etc")
    (root / "bin" / "shadow").symlink_to("/etc/shadow")
    async with await backend.create(SandboxSpec(image=RootfsImage(root))) as box:
        assert await box.read_text("/hostetc/marker") == "the image's own /etc\n"
        with pytest.raises(Exception, match="shadow"):
            await box.read_text("/bin/shadow")


async def test_a_fifo_in_the_images_workspace_is_left_out(
    backend: LocalBackend, tmp_path: Path
) -> None:
    root = static_root(tmp_path)
    (root / "testbed" / "kept.txt").write_text("kept")
    os.mkfifo(root / "testbed" / "pipe")
    (root / "testbed" / "sub").mkdir()
    (root / "testbed" / "sub" / "link").symlink_to("../kept.txt")
    spec = SandboxSpec(image=RootfsImage(root), workspace=ImageWorkspace(PurePosixPath("/testbed")))
    async with await backend.create(spec) as box:
        assert await box.read_text("kept.txt") == "kept"
        assert await box.read_text("sub/link") == "kept"
        with pytest.raises(Exception, match="pipe"):
            await box.read_text("pipe")


async def test_a_full_workspace_reports_its_limit_at_the_images_path(
    backend: LocalBackend,
) -> None:
    limits = ResourceLimits(workspace_bytes=8 << 20)
    spec = SandboxSpec(image=debian(), workspace=ImageWorkspace(), limits=limits)
    async with await backend.create(spec) as box:
        filled = await box.exec("head -c 16M /dev/zero > big; echo done")
        assert "workspace_bytes" in filled.limits_hit


async def test_the_agents_change_in_the_images_workspace_is_captured(
    backend: LocalBackend,
) -> None:
    """The change is read against the image's own repository (read-only, out of the agent's
    reach), whatever the agent did to the workspace's `.git`."""
    root = debian_root()
    base = git(root / "testbed", "-c", "safe.directory=*", "rev-parse", "HEAD")
    spec = SandboxSpec(image=debian(), workspace=ImageWorkspace())
    async with await backend.create(spec) as box:
        assert box.source_repository == root / "testbed"
        assert box.base_repository == "/run/sandbox/seed/.git"
        assert box.git_argv == ("git",)  # the image's own
        await box.write_file("calc.py", "def add(a, b):\n    return a + b\n")
        await box.write_file("new_test.py", "def test_add():\n    pass\n")
        wiped = await box.exec("rm -rf .git && git init -q && echo planted > .git/HEAD")
        assert wiped.exit_code == 0, wiped.stderr
        captured = await capture_diff(box, box.source_repository, base)
    assert set(captured.changed_paths) == {"calc.py", "new_test.py"}
    assert b"+    return a + b" in captured.patch


async def test_scratch_directories_are_writable_where_a_tasks_tests_expect_them(
    backend: LocalBackend,
) -> None:
    """Harbor's verifier reads /tests and writes /logs: on the image's read-only root they are
    directories of the sandbox's own, empty and sized, and the image is left as it was."""
    root = debian_root()
    limits = ResourceLimits(scratch_bytes=4 << 20)
    spec = SandboxSpec(
        image=debian(),
        scratch_dirs=(PurePosixPath("/logs"), PurePosixPath("/tests")),
        limits=limits,
    )
    async with await backend.create(spec) as box:
        wrote = await box.exec(
            "ls -A /logs /tests && mkdir /logs/verifier && echo 1 > /logs/verifier/reward.txt"
        )
        assert wrote.exit_code == 0, wrote.stderr
        assert wrote.stdout.split() == ["/logs:", "/tests:"]
        assert await box.read_text("/logs/verifier/reward.txt") == "1\n"
        filled = await box.exec("head -c 8M /dev/zero > /tests/big; echo done")
        assert "scratch_bytes" in filled.limits_hit
    assert not (root / "logs").exists()
    async with await backend.create(SandboxSpec(scratch_dirs=(PurePosixPath("/logs"),))) as box:
        assert (await box.exec("echo x > /logs/x && cat /logs/x")).stdout == "x\n"


def test_a_scratch_directory_must_be_absolute() -> None:
    with pytest.raises(ValueError, match="absolute"):
        SandboxSpec(scratch_dirs=(PurePosixPath("logs"),))


async def test_a_change_in_an_images_plain_directory_is_captured_against_it_as_it_was(
    backend: LocalBackend,
) -> None:
    """An image's working directory with no repository (a Dockerfile's COPY): its content as
    the image has it becomes the base (one commit, the same for every sandbox of the image),
    kept out of the workspace and of the agent's reach; the change is captured against it."""
    root = debian_root()
    spec = SandboxSpec(image=debian(working_dir=PurePosixPath("/app")), workspace=ImageWorkspace())
    bases = []
    for _ in range(2):
        async with await backend.create(spec) as box:
            source = box.source_repository
            assert source is not None
            assert box.base_repository == "/run/sandbox/base.git"
            base = git(source, "rev-parse", "HEAD")
            bases.append(base)
            listed = git(source, "ls-tree", "-r", "--name-only", base).split()
            assert sorted(listed) == [".gitignore", "calc.py", "data.txt", "link", "run.sh"]
            assert git(source, "ls-tree", base, "run.sh").startswith("100755 ")
            assert git(source, "ls-tree", base, "link").startswith("120000 ")
            seen = await box.exec("ls -A; echo x >> /run/sandbox/base.git/HEAD")
            assert seen.stdout.split() == [
                ".gitignore",
                "calc.py",
                "data.txt",
                "link",
                "old.log",
                "run.sh",
            ]
            assert seen.exit_code != 0
            assert (source / "HEAD").read_text() == "ref: refs/heads/base\n"
            changed = await box.exec(
                "sed -i 's/a - b/a + b/' calc.py && rm data.txt && echo new > new.txt"
                " && echo more >> old.log && git init -q && echo forged > .git/HEAD"
            )
            assert changed.exit_code == 0, changed.stderr
            captured = await capture_diff(box, source, base)
        assert set(captured.changed_paths) == {"calc.py", "data.txt", "new.txt"}
        assert b"+    return a + b" in captured.patch
        assert not source.exists(), "the base goes with the sandbox"
    assert bases[0] == bases[1]
    assert (root / "app" / "calc.py").read_text() == "def add(a, b):\n    return a - b\n"
    assert not (root / "app" / ".git").exists()


async def test_a_change_in_an_image_without_git_is_captured_with_the_hosts_git(
    backend: LocalBackend, tmp_path: Path
) -> None:
    """An image with no git (nor shell, libc or Python): the host's git is mounted and runs on
    the host's loader, for the capture only; the image's own programs are left alone."""
    root = static_root(tmp_path)
    (root / "testbed" / "kept.txt").write_text("as the image has it\n")
    spec = SandboxSpec(image=RootfsImage(root), workspace=ImageWorkspace(PurePosixPath("/testbed")))
    async with await backend.create(spec) as box:
        assert box.git_argv[-1] == "/run/sandbox/git-core/git"
        assert len(box.git_argv) > 1, "a dynamically linked git runs on the host's loader"
        source = box.source_repository
        assert source is not None
        await box.write_file("kept.txt", "changed\n")
        await box.write_file("new.txt", "new\n")
        captured = await capture_diff(box, source, git(source, "rev-parse", "HEAD"))
    assert set(captured.changed_paths) == {"kept.txt", "new.txt"}
    assert b"+changed" in captured.patch


ADD_FIX = b"""diff --git a/calc.py b/calc.py
--- a/calc.py
+++ b/calc.py
@@ -1,2 +1,2 @@
 def add(a, b):
-    return a - b
+    return a + b
"""


async def test_a_patch_is_applied_with_the_hosts_git_where_the_images_path_has_none(
    backend: LocalBackend,
) -> None:
    image = debian(env={"PATH": "/usr/local/bin"}, working_dir=PurePosixPath("/app"))
    async with await backend.create(SandboxSpec(image=image, workspace=ImageWorkspace())) as box:
        assert box.git_argv[-1] == "/run/sandbox/git-core/git"
        await apply_diff(box, ADD_FIX)
        assert await box.read_text("calc.py") == "def add(a, b):\n    return a + b\n"
        with pytest.raises(SandboxCommandError, match="git apply failed"):
            await apply_diff(box, ADD_FIX)
