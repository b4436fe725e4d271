"""The repository stands alone: no file refers to notes or paths outside it.

Facts the project relies on are written down in its own docs (for the agent CLIs,
packages/harness/docs/clients.md); a reference to a document that only exists on some machine,
or to an absolute path there, is a dead end for every other reader.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Notes kept outside the repository, and absolute or relative paths that lead out of it.
OUTSIDE = re.compile(r"\b(?:CLIENTS|ARCHITECTURE|PEERS)\.md\b|/work/|/root/|\.\./shared\b")


def tracked_files() -> list[Path]:
    listing = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    return [ROOT / name for name in listing.decode().split("\0") if name]


def test_no_file_refers_to_anything_outside_the_repository() -> None:
    files = tracked_files()
    assert len(files) > 100  # the listing really is the repository's
    hits = []
    for path in files:
        if path == Path(__file__).resolve():
            continue  # the patterns themselves
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError):  # binary, or deleted in the work tree
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert hits == []
