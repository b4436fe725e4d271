"""Release one library: check it, build it, and (only with --publish) upload and tag it.

    uv run tools/release.py trajectory-tree 0.2.0            # dry run: every check, nothing changed
    uv run tools/release.py trajectory-tree 0.2.0 --publish --token pypi-...
    uv run tools/release.py trajectory-tree 0.2.0 --publish --config ~/.agent-rl-release.toml

The version lives in one place, the member's pyproject.toml (``__version__`` is read from the
installed metadata). In order:

1. policy: the version is new and PEP 440; CHANGELOG.md has a non-empty ``## VERSION`` entry;
   every member depending on this one has a lower bound that VERSION satisfies; every member
   this one depends on has a lower bound, satisfied by its current version, and that version is
   released (its tag exists and nothing under its src/ or pyproject.toml changed since); with
   --publish, the member has no uncommitted changes.
2. the member alone: ``tools/ci.py --package`` (ruff, declared imports, mypy --strict of src and
   tests, its tests, in an environment holding only it and its declarations).
3. build: sdist, then the wheel from the sdist, with VERSION, from a copy of the member.
4. metadata and contents: ``twine check --strict`` (the readme renders); LICENSE and py.typed in
   both files; no test files; name, version and licence in the metadata; a lower bound on every
   dependency.
5. with --publish only: upload (``twine``, user ``__token__``), write VERSION into pyproject.toml
   and commit it, tag ``MEMBER-vVERSION``.

A dry run goes through every step whatever fails; a real release stops at the first failure,
before anything is uploaded or tagged. The token comes from ``--token`` or from the
``[publish]`` table of a TOML ``--config`` file (``token``, ``repository-url``); it is never read
from the environment.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from email.parser import Parser
from pathlib import Path

from ci import ROOT, Member, find_member, members, normalize
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

PYPI_UPLOAD = "https://upload.pypi.org/legacy/"
LOWER_BOUND_OPERATORS = {">=", ">", "==", "~=", "==="}
TEST_FILE = re.compile(r"(^|/)(tests?/|conftest\.py$|test_[^/]*\.py$|[^/]*_test\.py$)")


class ReleaseError(Exception):
    """A check failed; the message says what to fix."""


@dataclass(frozen=True)
class PublishTarget:
    repository_url: str
    token: str


@dataclass
class Report:
    """The checks that ran, in order, with their outcome."""

    lines: list[tuple[str, str, str]] = field(default_factory=list)

    def check(self, name: str, step: Callable[[], str]) -> bool:
        print(f"-- {name}", flush=True)
        try:
            detail = step()
        except ReleaseError as failure:
            self.lines.append((name, "FAILED", str(failure)))
            print(f"release: {name}: FAILED: {failure}", file=sys.stderr, flush=True)
            return False
        self.lines.append((name, "ok", detail))
        return True

    def skip(self, name: str, why: str) -> None:
        self.lines.append((name, "skipped", why))

    @property
    def passed(self) -> bool:
        return all(outcome != "FAILED" for _, outcome, _ in self.lines)

    def print(self) -> None:
        print("\nrelease: checks")
        for name, outcome, detail in self.lines:
            print(f"  {outcome:<8} {name:<28} {detail}")


def git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode:
        raise ReleaseError(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def tag_name(member: Member, version: str) -> str:
    return f"{member.folder}-v{version}"


def tag_exists(tag: str) -> bool:
    return bool(git("tag", "--list", tag))


def lower_bound(specifier: SpecifierSet) -> str | None:
    bounds = [s.version for s in specifier if s.operator in LOWER_BOUND_OPERATORS]
    return max(bounds, key=Version) if bounds else None


# -- policy -------------------------------------------------------------------------------------


def check_version(member: Member, version: str) -> str:
    try:
        new = Version(version)
    except InvalidVersion:
        raise ReleaseError(f"{version!r} is not a PEP 440 version") from None
    if str(new) != version:
        raise ReleaseError(f"write the version in its normal form: {new}")
    if tag_exists(tag_name(member, version)):
        raise ReleaseError(f"{tag_name(member, version)} exists: {version} is already released")
    if new < Version(member.version):
        raise ReleaseError(f"{version} is before {member.version}, the version in pyproject")
    return (
        f"{member.version} -> {version}" if version != member.version else f"{version}, unreleased"
    )


def check_changelog(member: Member, version: str) -> str:
    changelog = member.path / "CHANGELOG.md"
    if not changelog.is_file():
        raise ReleaseError(f"{changelog.relative_to(ROOT)} is missing")
    heading = re.compile(rf"^## \[?{re.escape(version)}\]?(\s|$)")
    lines = changelog.read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if heading.match(line)), None)
    if start is None:
        released = [line[3:].strip() for line in lines if line.startswith("## ")]
        listed = f" (it lists {', '.join(released)})" if released else ""
        raise ReleaseError(
            f"no '## {version}' entry in {changelog.relative_to(ROOT)}{listed}: add a "
            f"'## {version}' heading above the others, with a line on what changed, and commit it"
        )
    body = []
    for line in lines[start + 1 :]:
        if line.startswith("## "):
            break
        if line.strip():
            body.append(line)
    if not body:
        raise ReleaseError(f"the '## {version}' entry of {changelog.relative_to(ROOT)} is empty")
    return f"{changelog.relative_to(ROOT)}: {len(body)} line(s) under '## {version}'"


def member_requirements(member: Member) -> Iterator[tuple[Member, Requirement]]:
    """The member's requirements on other members (runtime and extras)."""
    by_name = {normalize(m.name): m for m in members().values()}
    for text in member.requirements():
        requirement = Requirement(text)
        other = by_name.get(normalize(requirement.name))
        if other is not None and other.path != member.path:
            yield other, requirement


def check_dependents(member: Member, version: str) -> str:
    problems, names = [], []
    for dependent in members().values():
        for dependency, requirement in member_requirements(dependent):
            if dependency.path != member.path:
                continue
            names.append(dependent.folder)
            if lower_bound(requirement.specifier) is None:
                problems.append(f"{dependent.folder} requires {requirement} with no lower bound")
            elif not requirement.specifier.contains(version, prereleases=True):
                problems.append(f"{dependent.folder} requires {requirement}, not {version}")
    if problems:
        raise ReleaseError("; ".join(problems))
    return f"bounds of {', '.join(sorted(set(names)))} admit {version}" if names else "none"


def released(member: Member) -> bool:
    return tag_exists(tag_name(member, member.version))


def unreleased_changes(member: Member) -> list[str]:
    """Files of the member's code or metadata changed since its release tag."""
    paths = [str((member.path / p).relative_to(ROOT)) for p in ("src", "pyproject.toml")]
    since = tag_name(member, member.version)
    changed = git("diff", "--name-only", since, "--", *paths).splitlines()
    untracked = git("ls-files", "--others", "--exclude-standard", "--", *paths).splitlines()
    return changed + untracked


def check_dependencies(member: Member) -> str:
    problems, seen = [], []
    for dependency, requirement in member_requirements(member):
        seen.append(f"{dependency.folder} {dependency.version}")
        if lower_bound(requirement.specifier) is None:
            problems.append(f"{requirement} has no lower bound")
        elif not requirement.specifier.contains(dependency.version, prereleases=True):
            problems.append(f"{requirement} excludes {dependency.folder} {dependency.version}")
        elif not released(dependency):
            problems.append(
                f"{dependency.folder} {dependency.version} is not released "
                f"(no tag {tag_name(dependency, dependency.version)}): release it first"
            )
        elif changed := unreleased_changes(dependency):
            problems.append(
                f"{dependency.folder} changed since {tag_name(dependency, dependency.version)} "
                f"({', '.join(changed[:3])}): release it first"
            )
    if problems:
        raise ReleaseError("; ".join(problems))
    return f"released: {', '.join(seen)}" if seen else "no workspace dependencies"


def check_committed(member: Member) -> str:
    dirty = git("status", "--porcelain", "--", str(member.path.relative_to(ROOT)))
    if dirty:
        raise ReleaseError(f"uncommitted changes: {' '.join(dirty.split())[:200]}")
    return "nothing uncommitted under " + str(member.path.relative_to(ROOT))


# -- the member alone, the build, the artifacts -------------------------------------------------


def check_alone(member: Member) -> str:
    command = [sys.executable, str(ROOT / "tools" / "ci.py"), "--package", member.folder]
    if subprocess.run(command, cwd=ROOT, check=False).returncode:
        raise ReleaseError(f"{' '.join(command[1:])} failed (output above)")
    return "ruff, declared imports, mypy --strict src+tests, tests: in its own environment"


def with_version(pyproject: str, version: str) -> str:
    new, count = re.subn(r'(?m)^version = "[^"]*"$', f'version = "{version}"', pyproject, count=1)
    if count != 1:
        raise ReleaseError('pyproject.toml has no top-level line version = "..."')
    return new


def build(member: Member, version: str, out: Path) -> list[Path]:
    """The sdist, then the wheel built from it, from a copy of the member carrying VERSION."""
    copy = out.parent / "source" / member.folder
    shutil.copytree(
        member.path,
        copy,
        ignore=shutil.ignore_patterns("__pycache__", "*_cache", ".hypothesis", "dist", "build"),
    )
    pyproject = copy / "pyproject.toml"
    pyproject.write_text(with_version(pyproject.read_text(), version))
    command = ["uv", "build", "--quiet", "--no-sources", "--out-dir", str(out), str(copy)]
    if subprocess.run(command, check=False).returncode:
        raise ReleaseError(f"{' '.join(command)} failed")
    return sorted([*out.glob("*.tar.gz"), *out.glob("*.whl")])


def artifact_names(path: Path) -> list[str]:
    if path.suffix == ".whl":
        with zipfile.ZipFile(path) as wheel:
            return wheel.namelist()
    with tarfile.open(path) as sdist:
        return [name.split("/", 1)[1] for name in sdist.getnames() if "/" in name]


def artifact_metadata(path: Path) -> str:
    if path.suffix == ".whl":
        with zipfile.ZipFile(path) as wheel:
            name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
            return wheel.read(name).decode()
    with tarfile.open(path) as sdist:
        member = next(m for m in sdist.getmembers() if m.name.count("/") == 1 and
                      m.name.endswith("/PKG-INFO"))  # fmt: skip
        extracted = sdist.extractfile(member)
        assert extracted is not None
        return extracted.read().decode()


def check_artifact(member: Member, version: str, path: Path) -> list[str]:
    problems: list[str] = []
    names = artifact_names(path)
    module = member.import_names[0]
    licence = "dist-info/licenses/LICENSE" if path.suffix == ".whl" else "LICENSE"
    if not any(n == licence or n.endswith("." + licence) for n in names):
        problems.append("no LICENSE")
    if not any(n.endswith(f"{module}/py.typed") for n in names):
        problems.append(f"no {module}/py.typed")
    if tests := [n for n in names if TEST_FILE.search(n)]:
        problems.append(f"test files: {', '.join(tests[:3])}")
    metadata = Parser().parsestr(artifact_metadata(path))
    expected = {"Name": member.name, "Version": version, "License-Expression": "Apache-2.0"}
    problems += [
        f"{key}: {metadata.get(key)!r}, expected {value!r}"
        for key, value in expected.items()
        if metadata.get(key) != value
    ]
    for text in metadata.get_all("Requires-Dist") or []:
        requirement = Requirement(text)
        if lower_bound(requirement.specifier) is None:
            problems.append(f"no lower bound: Requires-Dist {text}")
    return [f"{path.name}: {p}" for p in problems]


def check_artifacts(member: Member, version: str, files: list[Path]) -> str:
    twine = [sys.executable, "-m", "twine", "--no-color", "check", "--strict", *map(str, files)]
    done = subprocess.run(twine, capture_output=True, text=True, check=False)
    if done.returncode:
        raise ReleaseError(f"twine check: {(done.stdout + done.stderr).strip()}")
    problems = [p for f in files for p in check_artifact(member, version, f)]
    if problems:
        raise ReleaseError("; ".join(problems))
    names = ", ".join(f.name for f in files)
    return f"{names}: readme renders, LICENSE, py.typed, no tests, lower bounds"


# -- publishing ---------------------------------------------------------------------------------


def publish_target(args: argparse.Namespace) -> PublishTarget:
    config: dict[str, str] = {}
    if args.config:
        config = tomllib.loads(Path(args.config).read_text()).get("publish", {})
    token = args.token or config.get("token")
    if not token:
        raise SystemExit("release: --publish needs --token or a config file with [publish] token")
    url = args.repository_url or config.get("repository-url") or PYPI_UPLOAD
    return PublishTarget(repository_url=url, token=token)


def upload(files: list[Path], target: PublishTarget) -> str:
    # twine would also read TWINE_* variables: the child gets none but the token given here.
    env = {k: v for k, v in os.environ.items() if not k.startswith("TWINE_")}
    env |= {"TWINE_USERNAME": "__token__", "TWINE_PASSWORD": target.token}
    command = [sys.executable, "-m", "twine", "--no-color", "upload", "--non-interactive",
               "--disable-progress-bar", "--repository-url", target.repository_url,
               *map(str, files)]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise ReleaseError(f"upload to {target.repository_url}: {done.stdout}{done.stderr}")
    return f"{len(files)} file(s) to {target.repository_url}"


def record_release(member: Member, version: str) -> str:
    """Write VERSION into pyproject.toml, commit that file alone, tag the commit."""
    pyproject = member.path / "pyproject.toml"
    relative = str(pyproject.relative_to(ROOT))
    if member.version != version:
        pyproject.write_text(with_version(pyproject.read_text(), version))
        git("commit", "--quiet", "-m", f"release: {member.name} {version}", "--", relative)
    tag = tag_name(member, version)
    git("tag", "-a", tag, "-m", f"{member.name} {version}")
    return f"{relative} at {version}, tag {tag} on {git('rev-parse', '--short', 'HEAD')}"


def release(member: Member, version: str, target: PublishTarget | None) -> Report:
    """Every check in order. A dry run goes through all of them and changes nothing; a real
    release stops at the first failure, before anything is uploaded or tagged."""
    report = Report()
    publishing = target is not None

    def go_on(passed: bool) -> bool:
        return passed or not publishing

    policy = [
        report.check("version", lambda: check_version(member, version)),
        report.check("changelog", lambda: check_changelog(member, version)),
        report.check("bounds of dependents", lambda: check_dependents(member, version)),
        report.check("released dependencies", lambda: check_dependencies(member)),
    ]
    if publishing:
        policy.append(report.check("committed", lambda: check_committed(member)))
    if not go_on(all(policy)) or not go_on(
        report.check("alone: mypy --strict, tests", lambda: check_alone(member))
    ):
        return report
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "dist"
        files: list[Path] = []

        def built() -> str:
            files.extend(build(member, version, out))
            return ", ".join(f.name for f in files)

        if not report.check("build sdist and wheel", built):
            return report
        contents = report.check(
            "metadata and contents", lambda: check_artifacts(member, version, files)
        )
        if target is None:
            report.skip("upload", "dry run (--publish uploads)")
            report.skip("tag", f"dry run: would tag {tag_name(member, version)}")
        elif contents and report.check("upload", lambda: upload(files, target)):
            report.check("version and tag", lambda: record_release(member, version))
    return report


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("package", help="a library member: folder or distribution name")
    parser.add_argument("version", help="the version to release (PEP 440)")
    parser.add_argument("--publish", action="store_true", help="upload, commit the version, tag")
    parser.add_argument("--token", help="the index's API token (user __token__)")
    parser.add_argument("--config", help="a TOML file with [publish] token and repository-url")
    parser.add_argument("--repository-url", help=f"the upload endpoint (default {PYPI_UPLOAD})")
    args = parser.parse_args()
    member = find_member(args.package)
    if not member.is_library:
        raise SystemExit(f"release: {member.name} is an application: it is never released")
    target = publish_target(args) if args.publish else None
    mode = "release" if target else "dry run"
    print(f"release: {member.name} {args.version} ({mode})", flush=True)
    report = release(member, args.version, target)
    report.print()
    print("release: passed" if report.passed else "release: FAILED")
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
