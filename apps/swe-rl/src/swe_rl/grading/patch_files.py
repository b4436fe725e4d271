"""A `git diff --binary` split into one section per file, with what each section writes.

Grading drops whole files from the agent's patch (rules.py), so it must know, per
`diff --git` section, which path the section writes, whether that path is new, its mode and,
for a symlink, its target; for text, binary, mode-only, new, deleted, renamed and copied
files alike, with git's C-style quoting of unusual names undone. Paths stay bytes: a name
that is not UTF-8 is still a name git applies.

Splitting is linear in the patch (one scan for section starts, slices, and a look at each
section's header only), so a patch of megabytes costs milliseconds, never seconds; callers
run it in a thread all the same. `git_apply_paths` asks git itself which paths a patch writes:
the grader applies only patches on which the two agree.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

_HEADER = b"diff --git "
_ESCAPES = {b"n": b"\n", b"t": b"\t", b'"': b'"', b"\\": b"\\", b"a": b"\a", b"b": b"\b"}
_ESCAPES.update({b"f": b"\f", b"r": b"\r", b"v": b"\v"})
SYMLINK_MODE = 0o120000


class PatchError(ValueError):
    """The patch cannot be read as a git patch."""


@dataclass(frozen=True, slots=True)
class FileSection:
    """One `diff --git` section: its text and what it does to the tree."""

    text: bytes
    path: bytes
    """The path the section writes: the new name of a rename or copy, the deleted path."""
    renamed_from: bytes | None
    """A renamed file's old name, which the section removes. A section whose `---` and `+++`
    name different files is a rename to git, rename lines or not."""
    added: bool
    """`path` did not exist before (a new file, or the target of a rename or copy)."""
    deleted: bool
    mode: int | None
    """The mode `path` has afterwards (None: deleted, or unchanged and unsaid)."""
    symlink_target: bytes | None
    """What a symlink written by this section points to."""
    copied_from: bytes | None = None
    """A copied file's source, which the section keeps."""

    @property
    def paths(self) -> tuple[bytes, ...]:
        """Every path the section changes: `path`, and a renamed file's old name."""
        return (self.path,) if self.renamed_from is None else (self.path, self.renamed_from)


def split_patch(patch: bytes) -> list[FileSection]:
    """The patch's file sections in order; text before the first header is dropped."""
    starts = [0] if patch.startswith(_HEADER) else []
    position = 0
    while (found := patch.find(b"\n" + _HEADER, position)) >= 0:
        position = found + 1
        starts.append(position)
    if not starts:
        return []
    bounds = zip(starts, [*starts[1:], len(patch)], strict=True)
    return [_section(patch[start:end]) for start, end in bounds]


def join_sections(sections: Sequence[FileSection]) -> bytes:
    return b"".join(section.text for section in sections)


def display(path: bytes) -> str:
    """A path as text for logs and JSON: UTF-8 where it is, `\\xNN` escapes where not."""
    return path.decode("utf-8", errors="backslashreplace")


async def git_apply_paths(patch: bytes) -> list[bytes]:
    """The paths `git apply` would write, in order (`--numstat -z`: a rename or copy names
    its target); PatchError if git cannot read the patch. Runs git outside any repository."""
    with tempfile.TemporaryDirectory(prefix="agent-rl-numstat-") as empty:
        process = await asyncio.create_subprocess_exec(
            "git",
            "apply",
            "--numstat",
            "-z",
            "-",
            cwd=empty,
            env={
                "PATH": os.environ.get("PATH", os.defpath),
                "GIT_CONFIG_NOSYSTEM": "1",
                "GIT_CONFIG_GLOBAL": os.devnull,
                "HOME": os.devnull,
                "LC_ALL": "C",
            },
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await process.communicate(patch)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
            raise
    if process.returncode != 0:
        raise PatchError(f"git apply cannot read the patch: {err.decode(errors='replace')[:500]}")
    # Each record: ADDED TAB DELETED TAB PATH NUL.
    return [record.split(b"\t", 2)[2] for record in out.split(b"\0") if record]


def _header_lines(section: bytes) -> list[bytes]:
    """The lines of a section before its first hunk or binary patch."""
    lines = []
    for line in section.split(b"\n", 64)[1:64]:
        if line.startswith((b"@@", b"GIT binary patch", b"Binary files ")):
            break
        lines.append(line)
    return lines


def _section(text: bytes) -> FileSection:
    header = _header_lines(text)
    old = new = renamed_from = copied_from = None
    added = deleted = False
    mode: int | None = None
    for line in header:
        if line.startswith(b"--- "):
            old = _strip(_unquote(line[4:].rstrip(b"\t")), b"a/")
        elif line.startswith(b"+++ "):
            new = _strip(_unquote(line[4:].rstrip(b"\t")), b"b/")
        elif line.startswith(b"rename from "):
            renamed_from = _unquote(line[12:])
        elif line.startswith(b"copy from "):
            copied_from = _unquote(line[10:])
        elif line.startswith((b"rename to ", b"copy to ")):
            new = _unquote(line.split(b" ", 2)[2])
            added = True  # the target of a rename or copy is a new path
        elif line.startswith(b"new file mode "):
            added = True
            mode = _mode(line[14:])
        elif line.startswith(b"deleted file mode "):
            deleted = True
        elif line.startswith(b"new mode "):
            mode = _mode(line[9:])
        elif line.startswith(b"index ") and mode is None and b" " in line[6:]:
            mode = _mode(line.rsplit(b" ", 1)[1])
    if old is None and new is None:  # binary or mode-only: only the header names the file
        old = new = _header_path(text.split(b"\n", 1)[0][len(_HEADER) :])
    if old is not None and new is not None and old != new and not deleted and not added:
        renamed_from, added = old, True  # git applies differing names as a rename
    path = old if deleted else new
    if path is None or path == b"/dev/null":
        raise PatchError(f"a patch section names no file: {text[:200]!r}")
    target = _symlink_target(text) if mode == SYMLINK_MODE and not deleted else None
    return FileSection(
        text=text,
        path=path,
        renamed_from=renamed_from,
        copied_from=copied_from,
        added=added,
        deleted=deleted,
        mode=None if deleted else mode,
        symlink_target=target,
    )


def _strip(raw: bytes, prefix: bytes) -> bytes | None:
    if raw == b"/dev/null":
        return None
    return raw.removeprefix(prefix)


def _mode(raw: bytes) -> int | None:
    try:
        return int(raw.strip(), 8)
    except ValueError:
        return None


def _symlink_target(text: bytes) -> bytes | None:
    """The added lines of a symlink's hunk: a link's content is its target (which may hold a
    newline, so every added line counts)."""
    hunk = text.find(b"\n@@")
    if hunk < 0:
        return None
    added = [line[1:] for line in text[hunk + 1 :].split(b"\n")[1:] if line.startswith(b"+")]
    return b"\n".join(added) if added else None


def _header_path(rest: bytes) -> bytes:
    if rest.startswith(b'"'):
        first, tail = _take_quoted(rest)
        tail = tail.lstrip(b" ")
        second = _take_quoted(tail)[0] if tail.startswith(b'"') else tail
        if first.removeprefix(b"a/") == second.removeprefix(b"b/"):
            return first.removeprefix(b"a/")
    else:
        # "a/P b/P": the same path twice (a rename would have said so in its own lines).
        middle = (len(rest) - 1) // 2
        if rest[middle : middle + 1] == b" ":
            left, right = rest[:middle], rest[middle + 1 :]
            if left.removeprefix(b"a/") == right.removeprefix(b"b/"):
                return left.removeprefix(b"a/")
    raise PatchError(f"cannot read the file name of a patch section: {rest[:200]!r}")


def _take_quoted(data: bytes) -> tuple[bytes, bytes]:
    """Split `"quoted" rest` into (unquoted, rest)."""
    index = 1
    while index < len(data):
        if data[index : index + 1] == b"\\":
            index += 2
            continue
        if data[index : index + 1] == b'"':
            return _unquote(data[: index + 1]), data[index + 1 :]
        index += 1
    raise PatchError(f"unterminated quoted name in a patch: {data[:200]!r}")


def _unquote(raw: bytes) -> bytes:
    if not (raw.startswith(b'"') and raw.endswith(b'"') and len(raw) >= 2):
        return raw
    body, out, index = raw[1:-1], bytearray(), 0
    while index < len(body):
        char = body[index : index + 1]
        if char != b"\\":
            out += char
            index += 1
            continue
        code = body[index + 1 : index + 4]
        if len(code) == 3 and all(48 <= c <= 55 for c in code):  # \ooo octal byte
            out.append(int(code, 8))
            index += 4
        else:
            out += _ESCAPES.get(body[index + 1 : index + 2], body[index + 1 : index + 2])
            index += 2
    return bytes(out)
