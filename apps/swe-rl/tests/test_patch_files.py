"""split_patch on real `git diff` output: per section, the path it writes and what it does there,
as `git apply` itself reads the same patch; crafted patches on which the two disagree; and a
guard against splitting that grows faster than the patch."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import pytest

from swe_rl.grading.patch_files import (
    SYMLINK_MODE,
    FileSection,
    PatchError,
    display,
    git_apply_paths,
    join_sections,
    split_patch,
)
from swe_rl.grading.rules import ChangeRules

from .patch_repos import (
    Chmod,
    Delete,
    Link,
    Move,
    Op,
    Symlink,
    Tree,
    Write,
    git,
    make_patch,
    make_repo,
)

FILE = 0o100644
EXECUTABLE = 0o100755
LINES = b"".join(b"line %d of a file long enough for rename detection\n" % i for i in range(40))
OTHER_LINES = b"".join(b"entry %d of another file\n" % i for i in range(40))
BINARY = b"\x00\x01\x02\x03 binary \xff\xfe\x00"
OLD_ID, NEW_ID, NO_ID = b"1" * 40, b"2" * 40, b"0" * 40


class Expected(NamedTuple):
    path: bytes
    renamed_from: bytes | None = None
    added: bool = False
    deleted: bool = False
    mode: int | None = None
    symlink_target: bytes | None = None


def described(section: FileSection) -> Expected:
    return Expected(
        section.path,
        section.renamed_from,
        section.added,
        section.deleted,
        section.mode,
        section.symlink_target,
    )


@dataclass(frozen=True)
class Case:
    id: str
    base: Tree
    change: Sequence[Op]
    expected: Sequence[Expected]
    diff_args: tuple[str, ...] = ()
    quote_path: bool = True


CASES = [
    Case(
        "text edit",
        {b"edit.txt": b"a\nb\nc\n"},
        [Write(b"edit.txt", b"a\nB\nc\n")],
        [Expected(b"edit.txt", mode=FILE)],
    ),
    Case(
        "new file",
        {b"keep.txt": b"k\n"},
        [Write(b"pkg/new.py", b"x = 1\n")],
        [Expected(b"pkg/new.py", added=True, mode=FILE)],
    ),
    Case(
        "new empty file (no hunk: only the header names it)",
        {b"keep.txt": b"k\n"},
        [Write(b"pkg/empty.py", b"")],
        [Expected(b"pkg/empty.py", added=True, mode=FILE)],
    ),
    Case(
        "new executable file",
        {b"keep.txt": b"k\n"},
        [Write(b"run.sh", b"#!/bin/sh\n"), Chmod(b"run.sh", 0o755)],
        [Expected(b"run.sh", added=True, mode=EXECUTABLE)],
    ),
    Case(
        "deletion",
        {b"gone.txt": b"bye\n", b"keep.txt": b"k\n"},
        [Delete(b"gone.txt")],
        [Expected(b"gone.txt", deleted=True)],
    ),
    Case(
        "deletion of an empty file",
        {b"empty.txt": b"", b"keep.txt": b"k\n"},
        [Delete(b"empty.txt")],
        [Expected(b"empty.txt", deleted=True)],
    ),
    Case(
        "rename without edits",
        {b"old/name.txt": LINES},
        [Move(b"old/name.txt", b"new/name.txt")],
        [Expected(b"new/name.txt", renamed_from=b"old/name.txt", added=True)],
    ),
    Case(
        "rename with edits",
        {b"old.txt": LINES},
        [Move(b"old.txt", b"new.txt"), Write(b"new.txt", LINES + b"one more\n")],
        [Expected(b"new.txt", renamed_from=b"old.txt", added=True, mode=FILE)],
    ),
    Case(
        "rename with a mode change",
        {b"old.sh": LINES},
        [Move(b"old.sh", b"new.sh"), Chmod(b"new.sh", 0o755)],
        [Expected(b"new.sh", renamed_from=b"old.sh", added=True, mode=EXECUTABLE)],
    ),
    Case(
        "copy (-C --find-copies-harder)",
        {b"orig.txt": LINES},
        [Write(b"copy.txt", LINES)],
        [Expected(b"copy.txt", added=True)],
        diff_args=("-C", "--find-copies-harder"),
    ),
    Case(
        "copy with edits, source edited too",
        {b"orig.txt": LINES},
        [Write(b"copy.txt", LINES + b"copy\n"), Write(b"orig.txt", LINES + b"orig\n")],
        [Expected(b"copy.txt", added=True, mode=FILE), Expected(b"orig.txt", mode=FILE)],
        diff_args=("-C",),
    ),
    Case(
        "mode-only change",
        {b"run.sh": b"#!/bin/sh\n"},
        [Chmod(b"run.sh", 0o755)],
        [Expected(b"run.sh", mode=EXECUTABLE)],
    ),
    Case(
        "mode and content change",
        {b"run.sh": b"#!/bin/sh\n"},
        [Write(b"run.sh", b"#!/bin/sh\nexit 0\n"), Chmod(b"run.sh", 0o755)],
        [Expected(b"run.sh", mode=EXECUTABLE)],
    ),
    Case(
        "binary edit",
        {b"data.bin": BINARY},
        [Write(b"data.bin", BINARY + b"\x00more")],
        [Expected(b"data.bin", mode=FILE)],
    ),
    Case(
        "new binary file",
        {b"keep.txt": b"k\n"},
        [Write(b"assets/new.bin", BINARY)],
        [Expected(b"assets/new.bin", added=True, mode=FILE)],
    ),
    Case(
        "deleted binary file",
        {b"data.bin": BINARY, b"keep.txt": b"k\n"},
        [Delete(b"data.bin")],
        [Expected(b"data.bin", deleted=True)],
    ),
    Case(
        "symlink creation",
        {b"helpers/text.py": b"x = 1\n"},
        [Symlink(b"link.py", b"helpers/text.py")],
        [Expected(b"link.py", added=True, mode=SYMLINK_MODE, symlink_target=b"helpers/text.py")],
    ),
    Case(
        "symlink creation in a directory, relative target",
        {b"helpers/text.py": b"x = 1\n"},
        [Symlink(b"pkg/link.py", b"../helpers/text.py")],
        [
            Expected(
                b"pkg/link.py", added=True, mode=SYMLINK_MODE, symlink_target=b"../helpers/text.py"
            )
        ],
    ),
    Case(
        "symlink retargeted",
        {b"a.py": b"a\n", b"b.py": b"b\n", b"link.py": Link(b"a.py")},
        [Delete(b"link.py"), Symlink(b"link.py", b"b.py")],
        [Expected(b"link.py", mode=SYMLINK_MODE, symlink_target=b"b.py")],
    ),
    Case(
        "symlink deleted",
        {b"a.py": b"a\n", b"link.py": Link(b"a.py")},
        [Delete(b"link.py")],
        [Expected(b"link.py", deleted=True)],
    ),
    Case(
        "a file replaced by a symlink: a deletion, then a new symlink",
        {b"a.py": b"a\n", b"mod.py": b"m\n"},
        [Delete(b"mod.py"), Symlink(b"mod.py", b"a.py")],
        [
            Expected(b"mod.py", deleted=True),
            Expected(b"mod.py", added=True, mode=SYMLINK_MODE, symlink_target=b"a.py"),
        ],
    ),
    Case(
        "symlink renamed without edits (its mode and target are unsaid)",
        {b"a.py": b"a\n", b"sub/link.py": Link(b"../a.py")},
        [Move(b"sub/link.py", b"other/link.py")],
        [Expected(b"other/link.py", renamed_from=b"sub/link.py", added=True)],
    ),
    Case(
        "name with spaces: edit (--- and +++ end in a tab)",
        {b"with space.txt": b"a\n"},
        [Write(b"with space.txt", b"b\n")],
        [Expected(b"with space.txt", mode=FILE)],
    ),
    Case(
        "name with spaces: new file in a directory with spaces",
        {b"keep.txt": b"k\n"},
        [Write(b"dir with space/new file.py", b"x\n")],
        [Expected(b"dir with space/new file.py", added=True, mode=FILE)],
    ),
    Case(
        "name with spaces: mode-only change",
        {b"my script.sh": b"#!/bin/sh\n"},
        [Chmod(b"my script.sh", 0o755)],
        [Expected(b"my script.sh", mode=EXECUTABLE)],
    ),
    Case(
        "non-UTF-8 name, quoted: new file",
        {b"keep.txt": b"k\n"},
        [Write(b"caf\xe9.py", b"x\n")],
        [Expected(b"caf\xe9.py", added=True, mode=FILE)],
    ),
    Case(
        "non-UTF-8 name, quoted: new empty file (only the header names it)",
        {b"keep.txt": b"k\n"},
        [Write(b"\xff\xfe dir/e\xe9.txt", b"")],
        [Expected(b"\xff\xfe dir/e\xe9.txt", added=True, mode=FILE)],
    ),
    Case(
        "non-UTF-8 name, quoted: binary edit",
        {b"caf\xe9.bin": BINARY},
        [Write(b"caf\xe9.bin", BINARY + b"x")],
        [Expected(b"caf\xe9.bin", mode=FILE)],
    ),
    Case(
        "non-UTF-8 name, quoted: rename",
        {b"caf\xe9.txt": LINES},
        [Move(b"caf\xe9.txt", b"na\xefve.txt")],
        [Expected(b"na\xefve.txt", renamed_from=b"caf\xe9.txt", added=True)],
    ),
    Case(
        "non-UTF-8 name, core.quotePath=false: new file",
        {b"keep.txt": b"k\n"},
        [Write(b"caf\xe9.py", b"x\n")],
        [Expected(b"caf\xe9.py", added=True, mode=FILE)],
        quote_path=False,
    ),
    Case(
        "non-UTF-8 name, core.quotePath=false: mode-only change",
        {b"caf\xe9.sh": b"#!/bin/sh\n"},
        [Chmod(b"caf\xe9.sh", 0o755)],
        [Expected(b"caf\xe9.sh", mode=EXECUTABLE)],
        quote_path=False,
    ),
    Case(
        "name with a newline: new file",
        {b"keep.txt": b"k\n"},
        [Write(b"new\nline.py", b"x\n")],
        [Expected(b"new\nline.py", added=True, mode=FILE)],
    ),
    Case(
        "name with a newline: deletion",
        {b"new\nline.py": b"x\n", b"keep.txt": b"k\n"},
        [Delete(b"new\nline.py")],
        [Expected(b"new\nline.py", deleted=True)],
    ),
    Case(
        "name with a tab: edit",
        {b"tab\there.txt": b"a\n"},
        [Write(b"tab\there.txt", b"b\n")],
        [Expected(b"tab\there.txt", mode=FILE)],
    ),
    Case(
        "name with a tab: new empty file",
        {b"keep.txt": b"k\n"},
        [Write(b"tab\there.txt", b"")],
        [Expected(b"tab\there.txt", added=True, mode=FILE)],
    ),
    Case(
        "name with quotes and a backslash: new file",
        {b"keep.txt": b"k\n"},
        [Write(b'q"uo\\te.txt', b"x\n")],
        [Expected(b'q"uo\\te.txt', added=True, mode=FILE)],
    ),
    Case(
        'name containing " b/": new file',
        {b"keep.txt": b"k\n"},
        [Write(b"x b/y.py", b"x\n")],
        [Expected(b"x b/y.py", added=True, mode=FILE)],
    ),
    Case(
        'name containing " b/": new empty file (only the header names it)',
        {b"keep.txt": b"k\n"},
        [Write(b"x b/empty.py", b"")],
        [Expected(b"x b/empty.py", added=True, mode=FILE)],
    ),
    Case(
        'name containing " b/": mode-only change (only the header names it)',
        {b"a b/b.sh": b"#!/bin/sh\n"},
        [Chmod(b"a b/b.sh", 0o755)],
        [Expected(b"a b/b.sh", mode=EXECUTABLE)],
    ),
    Case(
        'name containing " b/": binary edit (only the header names it)',
        {b"x b/y.bin": BINARY},
        [Write(b"x b/y.bin", BINARY * 2)],
        [Expected(b"x b/y.bin", mode=FILE)],
    ),
    Case(
        "several files in one patch, in git's order",
        {b"a.txt": b"a\n", b"gone.txt": OTHER_LINES, b"m.txt": LINES},
        [
            Write(b"a.txt", b"A\n"),
            Delete(b"gone.txt"),
            Move(b"m.txt", b"z/m.txt"),
            Write(b"b b/new.txt", b"n\n"),
            Symlink(b"link", b"a.txt"),
        ],
        [
            Expected(b"a.txt", mode=FILE),
            Expected(b"b b/new.txt", added=True, mode=FILE),
            Expected(b"gone.txt", deleted=True),
            Expected(b"link", added=True, mode=SYMLINK_MODE, symlink_target=b"a.txt"),
            Expected(b"z/m.txt", renamed_from=b"m.txt", added=True),
        ],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
async def test_split_patch_reads_what_each_section_writes(case: Case, tmp_path: Path) -> None:
    patch = make_patch(
        tmp_path / "repo",
        case.base,
        case.change,
        diff_args=case.diff_args,
        quote_path=case.quote_path,
    )
    sections = split_patch(patch)
    assert [described(section) for section in sections] == list(case.expected), patch
    assert await git_apply_paths(patch) == [section.path for section in sections]
    assert join_sections(sections) == patch
    assert all(section.text.startswith(b"diff --git ") for section in sections)


async def test_the_cases_are_what_they_say(tmp_path: Path) -> None:
    """The headers the tricky cases above rely on are really in git's output."""
    copy = make_patch(
        tmp_path / "copy",
        {b"orig.txt": LINES},
        [Write(b"copy.txt", LINES)],
        diff_args=("-C", "--find-copies-harder"),
    )
    assert b"\ncopy from orig.txt\ncopy to copy.txt\n" in copy
    quoted = make_patch(tmp_path / "quoted", {}, [Write(b"caf\xe9.py", b"x\n")])
    assert quoted.startswith(b'diff --git "a/caf\\351.py" "b/caf\\351.py"\n')
    raw = make_patch(tmp_path / "raw", {}, [Write(b"caf\xe9.py", b"x\n")], quote_path=False)
    assert raw.startswith(b"diff --git a/caf\xe9.py b/caf\xe9.py\n")
    newline = make_patch(tmp_path / "newline", {}, [Write(b"a\nb", b"")])
    assert newline.startswith(b'diff --git "a/a\\nb" "b/a\\nb"\n')
    spaced = make_patch(tmp_path / "spaced", {b"a b/c": b"1\n"}, [Write(b"a b/c", b"2\n")])
    assert b"\n--- a/a b/c\t\n+++ b/a b/c\t\n" in spaced


# -- crafted patches: where git and the split disagree, or git refuses --------------------------

EDIT_X = (
    b"diff --git a/x.py b/x.py\n"
    b"index " + OLD_ID + b".." + NEW_ID + b" 100644\n"
    b"--- a/x.py\n"
    b"+++ b/x.py\n"
    b"@@ -1 +1 @@\n"
    b"-a\n"
    b"+b\n"
)
TRADITIONAL_CONFTEST = b"--- a/conftest.py\n+++ b/conftest.py\n@@ -1 +1 @@\n-c\n+import evil\n"


async def test_a_traditional_diff_after_a_hunk_is_applied_by_git_but_not_named_by_the_split() -> (
    None
):
    patch = EDIT_X + TRADITIONAL_CONFTEST
    sections = split_patch(patch)
    assert [section.path for section in sections] == [b"x.py"]
    assert sections[0].text == patch  # the trailing diff rides inside x.py's section
    assert await git_apply_paths(patch) == [b"x.py", b"conftest.py"]


async def test_a_traditional_diff_before_the_first_header_is_dropped_by_the_split() -> None:
    patch = TRADITIONAL_CONFTEST + EDIT_X
    assert [section.path for section in split_patch(patch)] == [b"x.py"]
    assert await git_apply_paths(patch) == [b"conftest.py", b"x.py"]


async def test_a_header_that_contradicts_its_file_lines_is_refused_by_git() -> None:
    patch = (
        b"diff --git a/x.py b/x.py\n"
        b"new file mode 100644\n"
        b"index " + NO_ID + b".." + NEW_ID + b"\n"
        b"--- /dev/null\n"
        b"+++ b/conftest.py\n"
        b"@@ -0,0 +1 @@\n"
        b"+import evil\n"
    )
    with pytest.raises(PatchError, match="inconsistent new filename"):
        await git_apply_paths(patch)


# A header naming one file whose ---/+++ lines name two others, without rename lines: git
# does not refuse it; it reads `---`, writes `+++` and removes the `---` file (a rename).
RENAME_IN_DISGUISE = (
    b"diff --git a/helpers/x.py b/helpers/x.py\n"
    b"index " + OLD_ID + b".." + NEW_ID + b" 100644\n"
    b"--- a/helpers/x.py\n"
    b"+++ b/statistics.py\n"
    b"@@ -1 +1 @@\n"
    b"-x = 1\n"
    b"+x = 2\n"
)


async def test_git_applies_differing_file_lines_as_a_rename(tmp_path: Path) -> None:
    """What the test below guards against: git accepts the patch and moves the file."""
    repo = make_repo(tmp_path / "repo", {b"helpers/x.py": b"x = 1\n"})
    (tmp_path / "change.patch").write_bytes(RENAME_IN_DISGUISE)
    git(repo, "apply", str(tmp_path / "change.patch"))
    assert not (repo / "helpers" / "x.py").exists()
    assert (repo / "statistics.py").read_bytes() == b"x = 2\n"
    assert await git_apply_paths(RENAME_IN_DISGUISE) == [b"statistics.py"]


def test_differing_file_lines_are_read_as_the_rename_git_applies() -> None:
    try:
        sections = split_patch(RENAME_IN_DISGUISE)
    except PatchError:
        return  # refusing such a section as unreadable fixes it too
    (section,) = sections
    assert described(section) == Expected(
        b"statistics.py", renamed_from=b"helpers/x.py", added=True, mode=FILE
    )


def test_a_symlink_target_with_a_newline_is_read_whole(tmp_path: Path) -> None:
    target = b"d\n/../../etc/passwd"
    patch = make_patch(tmp_path / "repo", {b"a.py": b"a\n"}, [Symlink(b"link", target)])
    assert b"\n+d\n+/../../etc/passwd\n" in patch
    try:
        sections = split_patch(patch)
    except PatchError:
        return  # refusing such a patch as unreadable fixes it too
    (section,) = sections
    assert section.symlink_target == target
    assert b"link" in ChangeRules().refused(sections, {b"a.py": 0o100644})


async def test_text_before_the_first_header_is_dropped() -> None:
    preamble = b"From 0000 Mon Sep 17 00:00:00 2001\nSubject: [PATCH] fix\n\nA message.\n\n"
    sections = split_patch(preamble + EDIT_X)
    assert [section.text for section in sections] == [EDIT_X]
    assert join_sections(sections) == EDIT_X
    assert await git_apply_paths(preamble + EDIT_X) == [b"x.py"]


@pytest.mark.parametrize("patch", [b"", b"\n", b"no diff here\n"])
async def test_a_patch_without_sections_splits_into_nothing(patch: bytes) -> None:
    assert split_patch(patch) == []
    with pytest.raises(PatchError, match="No valid patches"):
        await git_apply_paths(patch)


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        (b"diff --git garbage\n", "cannot read the file name"),
        (b"diff --git a/x.py b/y.py\n", "cannot read the file name"),
        (b'diff --git "a/x.py b/x.py\n', "unterminated quoted name"),
        (
            b"diff --git a/x.py b/x.py\ndeleted file mode 100644\n--- /dev/null\n+++ b/x.py\n",
            "names no file",
        ),
    ],
)
def test_a_section_without_a_readable_name_is_a_patch_error(patch: bytes, message: str) -> None:
    with pytest.raises(PatchError, match=message):
        split_patch(patch)


def test_display_escapes_bytes_that_are_not_utf8() -> None:
    assert display(b"caf\xe9.py") == "caf\\xe9.py"
    assert display(b"dir/\xff\xfe") == "dir/\\xff\\xfe"
    assert display("café/naïve.py".encode()) == "café/naïve.py"


# -- cost linear in the patch ------------------------------------------------------------------

SMALL_SECTION = (
    b"diff --git a/pkg/f%d.py b/pkg/f%d.py\n"
    b"index " + OLD_ID + b".." + NEW_ID + b" 100644\n"
    b"--- a/pkg/f%d.py\n"
    b"+++ b/pkg/f%d.py\n"
    b"@@ -1 +1 @@\n"
    b"-old line\n"
    b"+new line\n"
)


def many_sections(size: int) -> bytes:
    sections: list[bytes] = []
    total = 0
    while total < size:
        index = len(sections)
        sections.append(SMALL_SECTION % (index, index, index, index))
        total += len(sections[-1])
    return b"".join(sections)


def one_huge_section(size: int) -> bytes:
    line = b"+" + b"x" * 62 + b"\n"
    count = size // len(line)
    head = (
        b"diff --git a/big.py b/big.py\nnew file mode 100644\n"
        b"index " + NO_ID + b".." + OLD_ID + b"\n"
        b"--- /dev/null\n+++ b/big.py\n@@ -0,0 +1,%d @@\n" % count
    )
    return head + line * count


def best_time(patch: bytes, expected_sections: int) -> float:
    """The least CPU time of three splits: this thread's own, which a busy machine's other work
    does not add to (its wall time would count every wait for a CPU)."""
    best = float("inf")
    for _ in range(3):
        start = time.thread_time()
        sections = split_patch(patch)
        best = min(best, time.thread_time() - start)
        assert len(sections) == expected_sections
    return best


@pytest.mark.parametrize(
    "make", [many_sections, one_huge_section], ids=["many small sections", "one huge section"]
)
def test_splitting_time_grows_linearly(make: Callable[[int], bytes]) -> None:
    """Not a speed target: a guard against cost that grows with the square of the patch (the
    old split took 14 s for 1.5 MB). The smaller sizes are timed first, so a quadratic split
    fails before it is handed 16 MB."""
    previous = None
    for megabytes in (1, 4, 16):
        patch = make(megabytes << 20)
        elapsed = best_time(patch, patch.count(b"diff --git "))
        if previous is not None:
            assert elapsed < 10 * previous + 0.05, (megabytes, elapsed, previous)
        previous = elapsed
