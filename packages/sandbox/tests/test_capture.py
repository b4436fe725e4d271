"""Attacks on `capture_diff` from inside the agent's own sandbox, made before the capture.

Each test plays the agent: it does something hostile in its workspace, home or `.git`, then
captures its change and checks the exact result (patch, changed paths, notes), and where it
helps applies the patch to a fresh checkout and compares the trees file by file. Trees are
listed with `run_python` (no shell, so no rc file of the agent's bends the listing).

Tests marked xfail(strict=True) are src bugs found by these attacks: each asserts what the
capture promises, and starts passing (failing the suite, as strict) once the bug is fixed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import shlex
import time
import zlib
from pathlib import Path

import pytest
from machine_load import slowdown

from sandbox import (
    CapturedDiff,
    CaptureLimits,
    ChangeTooLargeError,
    GitWorkspace,
    LocalBackend,
    ResourceLimits,
    Sandbox,
    SandboxError,
    SandboxSpec,
    capture_diff,
)
from sandbox._git_diff import apply_diff
from sandbox._local._bwrap import SANDBOX_HOME

from .conftest import git

Tree = dict[bytes, tuple[str, str]]

# Lists a tree inside without following any symlink: path -> (mode, sha256 or link target),
# leaving out the top-level .git and the paths named in argv[2:].
LISTING = r"""
import hashlib, json, os, stat, sys
root = os.fsencode(sys.argv[1])
skip = {os.fsencode(arg) for arg in sys.argv[2:]}
found = []
def walk(relative):
    for name in sorted(os.listdir(root + b"/" + relative if relative else root)):
        path = relative + b"/" + name if relative else name
        if path == b".git" or path in skip:
            continue
        full = root + b"/" + path
        status = os.lstat(full)
        if stat.S_ISDIR(status.st_mode):
            walk(path)
        elif stat.S_ISLNK(status.st_mode):
            found.append([path.hex(), "120000", os.readlink(full).hex()])
        elif stat.S_ISREG(status.st_mode):
            with open(full, "rb") as stream:
                digest = hashlib.sha256(stream.read()).hexdigest()
            found.append([path.hex(), "100755" if status.st_mode & 0o100 else "100644", digest])
        else:
            found.append([path.hex(), "other", ""])
walk(b"")
print(json.dumps(found))
"""

HONEST_EDIT = "printf 'x = 2\\n' > edit.py"


async def tree_of(box: Sandbox, *skip: str) -> Tree:
    result = await box.run_python(LISTING, [box.workspace, *skip], timeout=60)
    assert result.ok, result.stderr
    return {bytes.fromhex(path): (mode, what) for path, mode, what in json.loads(result.stdout)}


async def applied(backend: LocalBackend, spec: SandboxSpec, diff: CapturedDiff) -> Tree:
    """The tree of a fresh checkout of the spec's workspace with the patch applied."""
    async with await backend.create(spec) as grader:
        await apply_diff(grader, diff.patch)
        return await tree_of(grader)


async def agent(box: Sandbox, script: str) -> str:
    """Run the agent's `script` (it must succeed); its stdout."""
    result = await box.exec(script, timeout=60)
    assert result.ok, result.stderr
    return result.stdout


async def exists(box: Sandbox, *paths: str) -> list[str]:
    """Which of `paths` exist inside (asked without a shell)."""
    script = "import os, sys\nprint('\\n'.join(p for p in sys.argv[1:] if os.path.lexists(p)))"
    result = await box.run_python(script, paths, timeout=30)
    assert result.ok, result.stderr
    return result.stdout.decode().split()


def blob_id(data: bytes) -> bytes:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest().encode()


def workspace_of(source: tuple[Path, str]) -> SandboxSpec:
    return SandboxSpec(workspace=GitWorkspace(*source))


@pytest.fixture
def tree_repo(tmp_path: Path) -> tuple[Path, str]:
    """A repository with directories (some named like system ones); (path, base commit)."""
    repo = tmp_path / "tree"
    files = {
        "edit.py": "x = 1\n",
        "etc/passwd": "tracked passwd\n",
        "etc/hostname": "tracked hostname\n",
        "proc/status": "tracked status\n",
        "pkg/mod.py": "m = 1\n",
        "pkg/sub/deep.py": "d = 1\n",
    }
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    return repo, git(repo, "rev-parse", "HEAD")


# -- processes --------------------------------------------------------------------------------

DAEMONS = r"""
setsid bash -c 'while :; do echo evil >> /workspace/evil.txt; sleep 0.01; done' \
    > /dev/null 2>&1 < /dev/null &
nohup bash -c 'while :; do echo nohup >> /workspace/nohup.txt; sleep 0.01; done' \
    > /dev/null 2>&1 &
printf 'x = 2\n' > edit.py
"""
SIZES = "import os\nfor f in ('evil.txt', 'nohup.txt'): print(os.path.getsize('/workspace/' + f))"


async def test_daemons_left_behind_are_dead_before_the_snapshot(
    backend: LocalBackend, source_repo: tuple[Path, str]
) -> None:
    repo, base = source_repo
    spec = workspace_of(source_repo)
    async with await backend.create(spec) as box:
        await agent(box, DAEMONS)
        for _ in range(200):  # until both have been appending a while
            if min(map(int, (await box.run_python(SIZES)).stdout.split())) >= 50:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the daemons never wrote")

        diff = await capture_diff(box, repo, base)

        sizes = (await box.run_python(SIZES)).stdout
        await asyncio.sleep(0.3)
        assert (await box.run_python(SIZES)).stdout == sizes  # nothing appends any more
        left = await agent(box, "ps -e -o args=")
        assert "while" not in left, left
        assert "sleep" not in left, left
        evil = await box.read_text("evil.txt")
        assert evil == "evil\n" * evil.count("\n")
        tree = await tree_of(box)
    assert diff.changed_paths == ("edit.py", "evil.txt", "nohup.txt")
    assert await applied(backend, spec, diff) == tree  # the patch is the files as they stayed


# -- the agent's shell and environment ----------------------------------------------------------

HIJACK = r"""set -e
mkdir -p $HOME/bin
printf '#!/bin/sh\necho "$0 $*" >> /tmp/fake-ran\n' > $HOME/bin/git
chmod +x $HOME/bin/git
cp $HOME/bin/git $HOME/bin/python3
cp $HOME/bin/git $HOME/bin/python
echo 'export PATH=$HOME/bin:$PATH' > $HOME/.profile
cat > $HOME/.bash_profile <<'EOF'
. $HOME/.profile
git() { echo "git() $*" >> /tmp/fake-ran; }
export -f git
export GIT_DIR=/nonexistent GIT_WORK_TREE=/ GIT_INDEX_FILE=/tmp/evil-index
export GIT_CONFIG_PARAMETERS="'core.fsmonitor=echo fsmonitor >> /tmp/fake-ran'"
EOF
cp $HOME/.bash_profile $HOME/.bashrc
"""


async def test_rc_files_and_a_fake_git_cannot_bend_the_capture(
    backend: LocalBackend, source_repo: tuple[Path, str]
) -> None:
    repo, base = source_repo
    spec = workspace_of(source_repo)
    async with await backend.create(spec) as box:
        await agent(box, HIJACK)
        bait = await agent(box, f"{HONEST_EDIT}; type -t git; command -v python3; git diff")
        assert bait.split() == [
            "function",
            f"{SANDBOX_HOME}/bin/python3",
        ]  # the agent's shells are bent
        for system_dir in ("/etc/profile.d", "/usr/local/bin", "/usr/bin"):
            assert (await box.exec(f"touch {system_dir}/git")).exit_code != 0
        assert await exists(box, "/tmp/fake-ran") == ["/tmp/fake-ran"]
        await box.run_python("import os; os.remove('/tmp/fake-ran')")

        diff = await capture_diff(box, repo, base)

        assert await exists(box, "/tmp/fake-ran", "/tmp/evil-index") == []
        tree = await tree_of(box)
    assert diff.changed_paths == ("edit.py",)
    assert b"-x = 1\n+x = 2\n" in diff.patch
    assert await applied(backend, spec, diff) == tree


# -- the agent's .git -------------------------------------------------------------------------


async def test_a_removed_git_directory_changes_nothing(
    backend: LocalBackend, source_repo: tuple[Path, str]
) -> None:
    repo, base = source_repo
    spec = workspace_of(source_repo)
    async with await backend.create(spec) as box:
        await agent(box, f"rm -rf .git && {HONEST_EDIT} && echo new > new.txt && rm gone.txt")
        diff = await capture_diff(box, repo, base)
        tree = await tree_of(box)
    assert diff.changed_paths == ("edit.py", "gone.txt", "new.txt")
    assert diff.left_out == ()
    assert await applied(backend, spec, diff) == tree


CORRUPT = r"""set -e
git config core.fsmonitor 'echo fsmonitor >> /tmp/ran; false'
git config filter.evil.clean 'sh -c "echo clean >> /tmp/ran; tr a-z A-Z"'
git config filter.evil.smudge 'sh -c "echo smudge >> /tmp/ran; tr a-z A-Z"'
git config filter.evil.process 'sh -c "echo process >> /tmp/ran"'
git config filter.evil.required true
git config diff.external 'sh -c "echo external >> /tmp/ran"'
git config core.hooksPath .git/hooks
echo '* filter=evil diff=evil' > .git/info/attributes
echo '*' > .git/info/exclude
printf '#!/bin/sh\necho hook >> /tmp/ran\n' > .git/hooks/post-index-change
chmod +x .git/hooks/post-index-change
echo 0000000000000000000000000000000000000000 > .git/HEAD
"""


async def test_a_corrupted_git_directory_runs_nothing_and_changes_nothing(
    backend: LocalBackend, source_repo: tuple[Path, str]
) -> None:
    repo, base = source_repo
    spec = workspace_of(source_repo)
    tree_id = git(repo, "rev-parse", f"{base}^{{tree}}")
    keep = git(repo, "rev-parse", f"{base}:keep.py")
    async with await backend.create(spec) as box:
        await agent(box, f"{HONEST_EDIT} && echo new > new.txt")
        # A replacement for the base tree: keep.py alone (so edit.py would look added).
        forged = await agent(box, f"printf '100644 blob {keep}\\tkeep.py\\n' | git mktree")
        await agent(box, f"git replace -f {tree_id} {forged.strip()}")
        assert await agent(box, f"git ls-tree --name-only {base}") == "keep.py\n"  # believed
        await agent(box, CORRUPT)
        await agent(box, f"git status > /dev/null 2>&1; git diff {base} > /dev/null 2>&1; true")
        assert await exists(box, "/tmp/ran") == ["/tmp/ran"]  # the agent's git runs them
        # And a forged loose object under the base tree's own id (git finds the mismatch).
        body = b"100644 keep.py\0" + bytes.fromhex(keep)
        forged_object = zlib.compress(b"tree %d\0" % len(body) + body)
        await box.write_file(f".git/objects/{tree_id[:2]}/{tree_id[2:]}", forged_object)
        await box.run_python("import os; os.remove('/tmp/ran')")

        diff = await capture_diff(box, repo, base)

        assert await exists(box, "/tmp/ran") == []
        tree = await tree_of(box)
    assert diff.changed_paths == ("edit.py", "new.txt")
    assert diff.left_out == ()
    assert b"-x = 1\n+x = 2\n" in diff.patch
    assert b"+new\n" in diff.patch
    assert await applied(backend, spec, diff) == tree


ATTRIBUTES = r"""set -e
printf '* working-tree-encoding=UTF-16\n* filter=evil\n* text eol=crlf\n' > .gitattributes
git config filter.evil.clean 'tr a-z A-Z'
git config filter.evil.smudge 'tr a-z A-Z'
printf 'a\nb\r\nc\303\251' > edit.py
printf 'line one\r\nline two\n' > crlf.txt
"""


async def test_gitattributes_cannot_convert_the_captured_bytes(
    backend: LocalBackend, source_repo: tuple[Path, str]
) -> None:
    repo, base = source_repo
    spec = workspace_of(source_repo)
    async with await backend.create(spec) as box:
        await agent(box, ATTRIBUTES)
        diff = await capture_diff(box, repo, base)
        tree = await tree_of(box)
    assert diff.changed_paths == (".gitattributes", "crlf.txt", "edit.py")
    # The blobs of the patch are the workspace's raw bytes: no filter, no encoding, no EOL.
    assert b".." + blob_id(b"a\nb\r\nc\xc3\xa9") + b" 100644\n" in diff.patch
    assert b"+c\xc3\xa9\n\\ No newline at end of file\n" in diff.patch
    assert b"\0" not in diff.patch  # nothing re-encoded as UTF-16
    assert b"\n+" + b"line one\r\n" in diff.patch
    assert blob_id(b"line one\r\nline two\n") in diff.patch
    grader = await applied(backend, spec, diff)
    assert grader == tree
    assert grader[b"edit.py"][1] == hashlib.sha256(b"a\nb\r\nc\xc3\xa9").hexdigest()


# -- what the workspace holds -----------------------------------------------------------------


ODD_NAMES = r"""set -e
printf x > "$(printf 'bad\377.txt')"
mkdir "$(printf 'dir\376')" && printf y > "$(printf 'dir\376/f')"
printf z > "$(printf 'new\nline')"
printf q > '"quoted"'
printf d > ./-dash
printf b > 'back\slash'
printf t > ' lead and trail '
"""


async def test_file_names_that_are_not_utf8_or_odd_round_trip(
    backend: LocalBackend, source_repo: tuple[Path, str]
) -> None:
    repo, base = source_repo
    spec = workspace_of(source_repo)
    async with await backend.create(spec) as box:
        await agent(box, f"{HONEST_EDIT}\n{ODD_NAMES}")
        diff = await capture_diff(box, repo, base)
        tree = await tree_of(box)
    assert set(diff.changed_paths) == {
        "bad\udcff.txt",
        "dir\udcfe/f",
        "new\nline",
        '"quoted"',
        "-dash",
        "back\\slash",
        " lead and trail ",
        "edit.py",
    }
    assert b"bad\xff.txt" in tree
    assert await applied(backend, spec, diff) == tree


NESTED = r"""set -e
mkdir fresh && cd fresh && git init -q && echo x > f && cd ..
mkdir committed && cd committed && git init -q && echo y > g && git add g
git -c user.name=a -c user.email=a@b.invalid commit -q -m c && cd ..
"""


async def test_nested_repositories_are_noted_not_captured(
    backend: LocalBackend, source_repo: tuple[Path, str]
) -> None:
    repo, base = source_repo
    spec = workspace_of(source_repo)
    async with await backend.create(spec) as box:
        await agent(box, f"{NESTED}\n{HONEST_EDIT}")
        diff = await capture_diff(box, repo, base)
        tree = await tree_of(box, "fresh", "committed")
    assert diff.changed_paths == ("edit.py",)
    assert diff.left_out == (
        ("committed", "a nested git repository"),
        ("fresh", "a nested git repository"),
    )
    assert await applied(backend, spec, diff) == tree


SPECIAL_FILES = r"""set -e
mkfifo pipe
python3 -c "import socket; socket.socket(socket.AF_UNIX).bind('sock')"
ln -s /dev/zero zero
ln -s pipe to-pipe
ln -sf /dev/zero edit.py
rm gone.txt && mkfifo gone.txt
test -p pipe && test -S sock && test -p gone.txt
"""


async def test_fifos_sockets_and_device_links_are_never_opened(
    backend: LocalBackend, source_repo: tuple[Path, str]
) -> None:
    repo, base = source_repo
    spec = workspace_of(source_repo)
    async with await backend.create(spec) as box:
        await agent(box, SPECIAL_FILES)
        started = time.monotonic()
        diff = await capture_diff(box, repo, base, timeout=30)
        assert time.monotonic() - started < 10 * slowdown()
        tree = await tree_of(box, "pipe", "sock", "gone.txt")
    assert diff.changed_paths == ("edit.py", "gone.txt", "to-pipe", "zero")
    assert diff.left_out == (("gone.txt", "not a regular file or symlink"),)
    assert b"diff --git a/zero b/zero\nnew file mode 120000\n" in diff.patch
    assert b"diff --git a/to-pipe b/to-pipe\nnew file mode 120000\n" in diff.patch
    assert b"+/dev/zero\n\\ No newline at end of file\n" in diff.patch
    assert b"deleted file mode 100644" in diff.patch  # gone.txt, a FIFO now
    grader = await applied(backend, spec, diff)
    assert grader == tree
    assert grader[b"zero"] == ("120000", b"/dev/zero".hex())


LINKS_OUT = r"""set -e
rm -rf etc && ln -s /etc etc
rm -rf proc && ln -s /proc/self proc
rm -rf pkg/sub && ln -s ../../../../../etc pkg/sub
ln -sf /etc/passwd edit.py
cat etc/passwd proc/status > /dev/null   # they do lead out
"""


async def test_tracked_directories_replaced_by_links_out_read_nothing_outside(
    backend: LocalBackend, tree_repo: tuple[Path, str]
) -> None:
    repo, base = tree_repo
    spec = workspace_of(tree_repo)
    async with await backend.create(spec) as box:
        await agent(box, LINKS_OUT)
        passwd_inside = await box.read_file("etc/passwd")
        diff = await capture_diff(box, repo, base)
        tree = await tree_of(box)
    assert diff.changed_paths == (
        "edit.py",
        "etc",
        "etc/hostname",
        "etc/passwd",
        "pkg/sub",
        "pkg/sub/deep.py",
        "proc",
        "proc/status",
    )
    assert diff.left_out == ()
    first_line = passwd_inside.split(b"\n", 1)[0]
    assert first_line
    assert first_line not in diff.patch
    assert b"Name:" not in diff.patch  # /proc/self/status
    assert diff.patch.count(b"new file mode 120000") == 4
    assert diff.patch.count(b"deleted file mode 100644") == 5  # edit.py and the four under links
    assert b"-tracked passwd\n" in diff.patch
    assert await applied(backend, spec, diff) == tree


async def test_what_the_agent_made_unreadable_is_read_all_the_same(
    backend: LocalBackend, source_repo: tuple[Path, str]
) -> None:
    """The agent owns every file: locking one is no change, and never makes it vanish."""
    repo, base = source_repo
    spec = workspace_of(source_repo)
    async with await backend.create(spec) as box:
        await agent(box, f"{HONEST_EDIT}; printf s > locked.py; chmod 000 locked.py keep.py")
        assert (await box.exec("cat keep.py")).exit_code != 0  # not even root reads it inside
        diff = await capture_diff(box, repo, base)
    assert diff.changed_paths == ("edit.py", "locked.py")
    assert diff.left_out == ()
    assert b"+s\n" in diff.patch or b"+s\n\\ No newline" in diff.patch


@pytest.mark.parametrize("locked", ["pkg/sub", "pkg", "."])
async def test_an_unreadable_tracked_directory_is_read_never_deleted(
    backend: LocalBackend, tree_repo: tuple[Path, str], locked: str
) -> None:
    repo, base = tree_repo
    async with await backend.create(workspace_of(tree_repo)) as box:
        await agent(box, f"{HONEST_EDIT}; echo new > pkg/sub/new.py; chmod 000 {locked}")
        assert (await box.exec("cat /workspace/pkg/sub/deep.py", cwd="/")).exit_code != 0
        diff = await capture_diff(box, repo, base)
    assert diff.changed_paths == ("edit.py", "pkg/sub/new.py")
    assert diff.left_out == ()


async def test_an_unreadable_untracked_directory_is_captured(
    backend: LocalBackend, source_repo: tuple[Path, str]
) -> None:
    repo, base = source_repo
    async with await backend.create(workspace_of(source_repo)) as box:
        await agent(
            box,
            f"{HONEST_EDIT}; mkdir -p secret/deeper; echo x > secret/deeper/f; "
            "chmod 000 secret/deeper secret",
        )
        diff = await capture_diff(box, repo, base)
    assert diff.changed_paths == ("edit.py", "secret/deeper/f")


# -- limits -----------------------------------------------------------------------------------


async def test_a_change_over_max_bytes_is_too_large(
    backend: LocalBackend, source_repo: tuple[Path, str]
) -> None:
    repo, base = source_repo
    async with await backend.create(workspace_of(source_repo)) as box:
        await agent(box, "head -c 5000 /dev/urandom > data.bin")
        exact = len("data.bin") + 5000  # a record's path counts too
        diff = await capture_diff(box, repo, base, limits=CaptureLimits(max_bytes=exact))
        assert diff.changed_paths == ("data.bin",)
        with pytest.raises(ChangeTooLargeError, match="too large"):
            await capture_diff(box, repo, base, limits=CaptureLimits(max_bytes=exact - 1))
        await agent(box, "head -c 2M /dev/urandom > data.bin")
        with pytest.raises(ChangeTooLargeError):
            await capture_diff(box, repo, base, limits=CaptureLimits(max_bytes=1 << 20))
        assert isinstance(ChangeTooLargeError("x"), SandboxError)


async def test_more_files_than_max_files_is_too_large(
    backend: LocalBackend, source_repo: tuple[Path, str]
) -> None:
    repo, base = source_repo
    async with await backend.create(workspace_of(source_repo)) as box:
        await agent(box, "rm gone.txt; for i in $(seq 9); do echo $i > new$i.txt; done")
        diff = await capture_diff(box, repo, base, limits=CaptureLimits(max_files=10))
        assert len(diff.changed_paths) == 10  # a deletion counts as a file
        with pytest.raises(ChangeTooLargeError, match="files"):
            await capture_diff(box, repo, base, limits=CaptureLimits(max_files=9))


@pytest.mark.parametrize("change", ["", "head -c 500K /dev/urandom > a.bin"])
async def test_an_unchanged_large_tracked_file_is_no_change(
    backend: LocalBackend, tmp_path: Path, change: str
) -> None:
    repo = tmp_path / "large"
    repo.mkdir()
    (repo / "a.bin").write_bytes(b"small\n")
    (repo / "z.bin").write_bytes(bytes(range(256)) * 2400)  # 600 KiB, never changed
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    base = git(repo, "rev-parse", "HEAD")
    limits = CaptureLimits(max_bytes=550 << 10 if change else 500 << 10)
    async with await backend.create(SandboxSpec(workspace=GitWorkspace(repo, base))) as box:
        await agent(box, change or "true")
        diff = await capture_diff(box, repo, base, limits=limits)
    assert diff.changed_paths == (("a.bin",) if change else ())


FILL = r"""
{HONEST_EDIT}
for dir in /tmp /var/tmp $HOME /dev/shm /run; do
    head -c 100M /dev/zero > $dir/fill 2> /dev/null
done
head -c 100M /dev/zero > ignored.log 2> /dev/null   # .gitignore hides it
for dir in /tmp /var/tmp $HOME /dev/shm /run /workspace; do
    printf 'more than a page %04096d' 0 > $dir/one-more 2> /dev/null && echo "room in $dir"
    rm -f $dir/one-more
done
true
"""


async def test_full_file_systems_do_not_stop_the_capture(
    backend: LocalBackend, source_repo: tuple[Path, str]
) -> None:
    repo, base = source_repo
    limits = ResourceLimits(workspace_bytes=16 << 20, scratch_bytes=16 << 20)
    spec = SandboxSpec(workspace=GitWorkspace(repo, base), limits=limits)
    async with await backend.create(spec) as box:
        assert await agent(box, FILL.replace("{HONEST_EDIT}", HONEST_EDIT)) == ""  # all full
        diff = await capture_diff(box, repo, base)
    assert diff.changed_paths == ("edit.py",)
    assert b"-x = 1\n+x = 2\n" in diff.patch


# -- history ----------------------------------------------------------------------------------

COMMITS = r"""set -e
export GIT_AUTHOR_NAME=a GIT_AUTHOR_EMAIL=a@b.invalid GIT_COMMITTER_NAME=a
export GIT_COMMITTER_EMAIL=a@b.invalid
printf 'x = 2\n' > edit.py && git commit -q -am one
printf 'c\n' > committed.txt && git add committed.txt && git rm -q gone.txt && git commit -q -m two
printf 'u\n' > uncommitted.txt
"""


async def test_agent_commits_count_as_their_content(
    backend: LocalBackend, source_repo: tuple[Path, str]
) -> None:
    repo, base = source_repo
    spec = workspace_of(source_repo)
    async with await backend.create(spec) as box:
        await agent(box, COMMITS)
        diff = await capture_diff(box, repo, base)
        tree = await tree_of(box)
        await agent(box, f"git reset -q --hard {base} && git clean -fdq")  # all undone
        undone = await capture_diff(box, repo, base)
    assert diff.changed_paths == ("committed.txt", "edit.py", "gone.txt", "uncommitted.txt")
    assert await applied(backend, spec, diff) == tree
    assert (undone.patch, undone.changed_paths) == (b"", ())


@pytest.mark.parametrize(
    "work",
    # No ref of the source is mounted, but its objects are: a later commit by its id.
    ["printf 'mine\\n' > later.txt", "git reset -q --hard {later}"],
)
async def test_a_file_the_task_repository_tracks_after_base_is_captured(
    backend: LocalBackend, source_repo: tuple[Path, str], work: str
) -> None:
    repo, base = source_repo
    spec = workspace_of(source_repo)
    async with await backend.create(spec) as box:
        await agent(box, work.format(later=git(repo, "rev-parse", "main")))
        diff = await capture_diff(box, repo, base)
        tree = await tree_of(box)
    assert diff.changed_paths == ("later.txt",)
    assert await applied(backend, spec, diff) == tree


# -- the task repository ----------------------------------------------------------------------

# Moves the lowest movable directory above the task's git directory (the read-only mount
# itself cannot be moved; a directory holding it can) and plants a repository of the agent's
# in its place: a partial clone whose lazy fetch runs the agent's command.
SWAP_GIT_DIR = r"""set -e
gitdir=$1
dir=$(dirname "$gitdir")
until mv "$dir" "$dir.moved" 2> /dev/null; do
    dir=$(dirname "$dir")
    [ "$dir" != / ] || { echo "nothing could be moved"; exit 0; }
done
real="$dir.moved${gitdir#"$dir"}"
git init -q --bare "$gitdir"
cd "$gitdir"
git config core.repositoryformatversion 1
git config extensions.partialClone origin
git config remote.origin.url "$real"
git config remote.origin.promisor true
git config remote.origin.uploadpack \
    'echo ran >> /tmp/agent-ran; setsid sleep 4321 < /dev/null > /dev/null 2>&1 & git-upload-pack'
echo "swapped $dir"
"""


async def test_the_task_repository_cannot_be_swapped(
    backend: LocalBackend, source_repo: tuple[Path, str]
) -> None:
    repo, base = source_repo
    git_dir = git(repo, "rev-parse", "--path-format=absolute", "--git-common-dir")
    async with await backend.create(workspace_of(source_repo)) as box:
        swap = await agent(box, f"{HONEST_EDIT}\nbash -c {shlex.quote(SWAP_GIT_DIR)} - {git_dir}")
        diff: CapturedDiff | None = None
        with contextlib.suppress(SandboxError):
            diff = await capture_diff(box, repo, base)
        ran = await exists(box, "/tmp/agent-ran")
        running = await agent(box, "ps -e -o args= | grep -c '^sleep 4321' || true")
    assert (ran, running.strip()) == ([], "0"), swap
    assert diff is not None
    assert diff.changed_paths == ("edit.py",)
