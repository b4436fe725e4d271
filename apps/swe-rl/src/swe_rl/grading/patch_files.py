"""A `git diff --binary` split into one section per file, and the paths each section touches.

Grading drops whole files from the agent's patch (see protected.py), so it needs to know which
paths each `diff --git` section writes, for text, binary, mode-only, new, deleted and renamed
files alike, with git's C-style quoting of unusual names undone.
"""

from __future__ import annotations

from dataclasses import dataclass

_HEADER = b"diff --git "
_ESCAPES = {b"n": b"\n", b"t": b"\t", b'"': b'"', b"\\": b"\\", b"a": b"\a", b"b": b"\b"}
_ESCAPES.update({b"f": b"\f", b"r": b"\r", b"v": b"\v"})


@dataclass(frozen=True, slots=True)
class FileSection:
    text: bytes
    paths: frozenset[str]


def split_patch(patch: bytes) -> list[FileSection]:
    """The patch's file sections in order; text before the first header is dropped."""
    sections: list[bytes] = []
    for line in patch.splitlines(keepends=True):
        if line.startswith(_HEADER):
            sections.append(line)
        elif sections:
            sections[-1] += line
    return [FileSection(text, frozenset(_paths(text))) for text in sections]


def join_sections(sections: list[FileSection]) -> bytes:
    return b"".join(section.text for section in sections)


def _paths(section: bytes) -> set[str]:
    lines = section.split(b"\n")
    found: set[str] = set()
    for line in lines[1:]:
        for prefix, strip in (
            (b"--- ", b"a/"),
            (b"+++ ", b"b/"),
            (b"rename from ", b""),
            (b"rename to ", b""),
            (b"copy from ", b""),
            (b"copy to ", b""),
        ):
            if line.startswith(prefix):
                raw = _unquote(line[len(prefix) :].rstrip(b"\t"))
                if raw != b"/dev/null":
                    found.add(_decode(raw.removeprefix(strip)))
        if line.startswith((b"@@", b"GIT binary patch")):
            break
    if not found:  # binary or mode-only change: only the header names the file
        found.update(_header_paths(lines[0][len(_HEADER) :]))
    return found


def _header_paths(rest: bytes) -> set[str]:
    if rest.startswith(b'"'):
        first, _, tail = _take_quoted(rest)
        second = _take_quoted(tail.lstrip(b" "))[0] if tail.lstrip().startswith(b'"') else tail
        return {_decode(first.removeprefix(b"a/")), _decode(second.strip().removeprefix(b"b/"))}
    # "a/P b/P": the same path twice (a rename would have said so in its own lines).
    middle = (len(rest) - 1) // 2
    if rest[middle : middle + 1] == b" ":
        left, right = rest[:middle], rest[middle + 1 :]
        if left.removeprefix(b"a/") == right.removeprefix(b"b/"):
            return {_decode(left.removeprefix(b"a/"))}
    raise ValueError(f"cannot read the file name of a patch section: {rest[:200]!r}")


def _take_quoted(data: bytes) -> tuple[bytes, bytes, bytes]:
    """Split `"quoted" rest` into (unquoted, b'"', rest)."""
    index = 1
    while index < len(data):
        if data[index : index + 1] == b"\\":
            index += 2
            continue
        if data[index : index + 1] == b'"':
            return _unquote(data[: index + 1]), b'"', data[index + 1 :]
        index += 1
    raise ValueError(f"unterminated quoted name in a patch: {data[:200]!r}")


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


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", errors="surrogateescape")
