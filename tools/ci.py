"""The project's checks: every workspace member alone, then what crosses members.

    uv run tools/ci.py                      # everything CI runs (see below), with a timing table
    uv run tools/ci.py --package sandbox    # one member alone (folder or distribution name)
    uv run tools/ci.py --cross              # only the cross-package tests (tests/)
    uv run tools/ci.py --wheels             # only: build each library wheel, install it alone

A member is checked alone in an environment of its own (``.cache/ci-envs/<member>``) that holds
only the member, its declared dependencies and its ``test`` dependency group, synced exactly by
uv from the workspace lock. There: ruff; every import of its src and tests is declared (a module
that another dependency happens to pull in does not count); ``mypy --strict`` of src and tests
against that environment; its tests. A dependency the member forgets fails here, not on a user's
machine. The full run adds ruff over the whole repository, the wheels, and the root ``tests/``
(several members at once) in the shared workspace environment.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENVS = ROOT / ".cache" / "ci-envs"
# Test-support modules shared by several members' tests (``machine_load``), imported by plain
# name: the root pytest settings put this folder on the path (``pythonpath``), mypy gets MYPYPATH.
SHARED_TEST_SUPPORT = ROOT / "tests" / "support"
NO_TESTS_COLLECTED = 5
# ruff, mypy and the cross-package pytest come from the environment running this script (the
# workspace's); each member's own tests run with its own environment's interpreter.
TOOL = (sys.executable, "-m")
_REQUIREMENT_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


class CheckFailed(Exception):
    """One check of one member failed; the message says which command."""


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    match = _REQUIREMENT_NAME.match(requirement)
    if match is None:
        raise ValueError(f"not a requirement: {requirement!r}")
    return normalize(match.group(1))


@dataclass(frozen=True)
class Member:
    """A workspace member as its pyproject.toml declares it."""

    path: Path
    name: str
    version: str
    dependencies: tuple[str, ...]
    extras: Mapping[str, list[str]]
    groups: Mapping[str, list[str]]
    import_names: tuple[str, ...]

    @property
    def folder(self) -> str:
        return self.path.name

    @property
    def is_library(self) -> bool:
        """Libraries live under packages/ and are released; apps/ are checked, never released."""
        return self.path.parent.name == "packages"

    def requirements(self, *, groups: Iterable[str] = ()) -> list[str]:
        """Runtime requirements, every extra's, and those of the named dependency groups."""
        reqs = [*self.dependencies, *(r for extra in self.extras.values() for r in extra)]
        for group in groups:
            reqs += [r for r in self.groups.get(group, []) if isinstance(r, str)]
        return reqs


def load_member(path: Path) -> Member:
    data = tomllib.loads((path / "pyproject.toml").read_text())
    project = data["project"]
    targets = data.get("tool", {}).get("hatch", {}).get("build", {}).get("targets", {})
    return Member(
        path=path,
        name=project["name"],
        version=project["version"],
        dependencies=tuple(project.get("dependencies", [])),
        extras=project.get("optional-dependencies", {}),
        groups=data.get("dependency-groups", {}),
        import_names=tuple(Path(p).name for p in targets.get("wheel", {}).get("packages", [])),
    )


def members() -> dict[str, Member]:
    """Every member by folder name, libraries first, in dependency-friendly folder order."""
    found = [*sorted(ROOT.glob("packages/*/pyproject.toml")), *ROOT.glob("apps/*/pyproject.toml")]
    return {m.folder: m for m in (load_member(p.parent) for p in found)}


def find_member(name: str) -> Member:
    """A member by folder name (``sandbox``) or distribution name (``agent-rl-sandbox``)."""
    known = members()
    for member in known.values():
        if normalize(name) in (member.folder, normalize(member.name)):
            return member
    raise SystemExit(f"ci: unknown package {name!r}; known: {', '.join(known)}")


def run(*cmd: str, cwd: Path = ROOT, env: Mapping[str, str] | None = None) -> None:
    print("+", " ".join(cmd), flush=True)
    environment = None if env is None else {**os.environ, **env}
    result = subprocess.run(cmd, cwd=cwd, env=environment, check=False)
    if result.returncode == NO_TESTS_COLLECTED and "pytest" in cmd:
        raise CheckFailed(f"pytest collected no tests in {' '.join(cmd)}: that is a failure")
    if result.returncode:
        raise CheckFailed(f"failed ({result.returncode}): {' '.join(cmd)}")


# -- one member alone ---------------------------------------------------------------------------


def member_environment(member: Member) -> Path:
    """Sync the member's own environment exactly: the member, its dependencies, its test group.

    Nothing else stays in it (``--exact``), so an import that only the shared workspace
    environment could satisfy fails in this one.
    """
    env = ENVS / member.folder
    run(
        "uv",
        "sync",
        "--quiet",
        "--exact",
        "--package",
        member.name,
        "--group",
        "test",
        env={"UV_PROJECT_ENVIRONMENT": str(env)},
    )
    return env


def imported_modules(files: Iterable[Path]) -> dict[str, set[Path]]:
    """Top-level modules imported by absolute imports, except those guarded by ImportError."""
    found: dict[str, set[Path]] = {}
    for file in files:
        tree = ast.parse(file.read_text(), filename=str(file))
        guarded = {
            id(node)
            for handler_owner in ast.walk(tree)
            if isinstance(handler_owner, ast.Try) and _catches_import_error(handler_owner)
            for statement in handler_owner.body
            for node in ast.walk(statement)
        }
        for node in ast.walk(tree):
            if id(node) in guarded:
                continue
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], set()).add(file)
    return found


def _catches_import_error(node: ast.Try) -> bool:
    caught = {"ImportError", "ModuleNotFoundError"}
    for handler in node.handlers:
        types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        if any(isinstance(t, ast.Name) and t.id in caught for t in types):
            return True
    return False


def installed_distributions(python: Path) -> dict[str, list[str]]:
    """Top-level module -> distributions providing it, as the member's environment sees it."""
    code = "import importlib.metadata as m, json; print(json.dumps(m.packages_distributions()))"
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    provided: dict[str, list[str]] = json.loads(out.stdout)
    for member in members().values():  # editable installs do not list their modules
        for module in member.import_names:
            provided.setdefault(module, []).append(member.name)
    return provided


def undeclared_imports(member: Member, python: Path) -> list[str]:
    """Imports of src (and of tests) that no declared requirement of the member provides."""
    provided = installed_distributions(python)
    own = set(member.import_names)
    tests = member.path / "tests"
    helpers = {p.stem for p in [*tests.rglob("*.py"), *SHARED_TEST_SUPPORT.glob("*.py")]}
    helpers.add("tests")
    problems: list[str] = []
    scopes = [
        ("src", member.path / "src", member.requirements(), own),
        ("tests", tests, member.requirements(groups=["test"]), own | helpers),
    ]
    for scope, directory, requirements, local in scopes:
        declared = {requirement_name(r) for r in requirements}
        for module, files in sorted(imported_modules(directory.rglob("*.py")).items()):
            if module in sys.stdlib_module_names or module in local:
                continue
            dists = {normalize(d) for d in provided.get(module, [])}
            where = ", ".join(sorted(str(f.relative_to(ROOT)) for f in files)[:3])
            if not dists:
                problems.append(f"{scope} imports {module!r}, which nothing installs ({where})")
            elif not dists & declared:
                problems.append(
                    f"{scope} imports {module!r} from {' or '.join(sorted(dists))}, which "
                    f"{member.name} does not declare ({where})"
                )
    return problems


def tests_base(member: Member) -> dict[str, str]:
    """Where mypy finds the tests' helper modules, as pytest does.

    Tests import their helpers either relatively (``from .conftest import``: ``tests`` is a
    package under the member folder) or by plain name (``from session_kit import``: the tests
    folder itself is on the path, put there by its conftest). The shared ones
    (``from machine_load import``) are on the path for every member, from the root pytest
    settings.
    """
    tests = (member.path / "tests").rglob("*.py")
    relative = any(
        isinstance(node, ast.ImportFrom) and node.level > 0
        for file in tests
        for node in ast.walk(ast.parse(file.read_text()))
    )
    own = [] if relative else ["tests"]
    return {"MYPYPATH": os.pathsep.join([*own, str(SHARED_TEST_SUPPORT)])}


@contextmanager
def phase(timings: dict[str, float], name: str) -> Iterator[None]:
    """Time one part of a check into ``timings``, whether it passes or not."""
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[name] = time.perf_counter() - start


def check_member(member: Member, timings: dict[str, float]) -> None:
    """Lint, declared imports, mypy --strict of src and tests, tests: all in the member's env."""
    with phase(timings, "ruff"):
        run(*TOOL, "ruff", "check", str(member.path))
        run(*TOOL, "ruff", "format", "--check", str(member.path))
    with phase(timings, "environment"):
        env = member_environment(member)
        python = env / "bin" / "python"
    with phase(timings, "imports"):
        print(f"-- declared imports of {member.name}", flush=True)
        problems = undeclared_imports(member, python)
        for problem in problems:
            print(f"ci: {problem}", file=sys.stderr)
        if problems:
            raise CheckFailed(f"{member.name}: {len(problems)} undeclared import(s)")
    with phase(timings, "mypy"):
        against = ["--python-executable", str(python), "--cache-dir", str(env / ".mypy_cache")]
        mypy = [*TOOL, "mypy", "--strict", "--config-file", str(ROOT / "pyproject.toml"), *against]
        run(*mypy, "src", cwd=member.path)
        run(*mypy, "--explicit-package-bases", "tests", cwd=member.path, env=tests_base(member))
    with phase(timings, "tests"):
        # The root pytest settings name pytest-asyncio's options; a member without async tests
        # rightly lacks the plugin, so that warning says nothing about the member.
        quiet = "ignore:Unknown config option:pytest.PytestConfigWarning"
        run(str(python), "-m", "pytest", "-W", quiet, str(member.path / "tests"))


# -- what crosses members -----------------------------------------------------------------------


def check_repository() -> None:
    """Ruff over everything, and each member's LICENSE the same as the repository's."""
    run(*TOOL, "ruff", "check", str(ROOT))
    run(*TOOL, "ruff", "format", "--check", str(ROOT))
    licence = (ROOT / "LICENSE").read_bytes()
    for member in members().values():
        if (member.path / "LICENSE").read_bytes() != licence:
            raise CheckFailed(f"{member.path / 'LICENSE'} differs from the repository's LICENSE")


def check_cross_package(pytest_args: list[str]) -> None:
    """The root tests exercise several members at once, in the shared workspace environment."""
    run(
        *TOOL,
        "mypy",
        "--strict",
        "--explicit-package-bases",
        "tests",
        env={"MYPYPATH": str(SHARED_TEST_SUPPORT)},
    )
    # The tools too; slime-backend's bench drives episodes with that package's test kit, and
    # record_demo_session.py the root tests' CLI session (so the repository is on the path).
    benches = sorted(f"bench/{path.name}" for path in (ROOT / "tools" / "bench").glob("*.py"))
    search = os.pathsep.join((str(ROOT / "packages" / "slime-backend" / "tests"), str(ROOT)))
    run(*TOOL, "mypy", "--strict", "--config-file", str(ROOT / "pyproject.toml"), "ci.py",
        "release.py", "pins.py", "record_demo_session.py", "render_walk.py", "template_parity.py",
        "mutation.py", *benches, cwd=ROOT / "tools",
        env={"MYPYPATH": search})  # fmt: skip
    run(*TOOL, "pytest", str(ROOT / "tests"), *pytest_args)


def check_wheels() -> None:
    """Build every library wheel, then install each one alone into an empty venv and import it.

    Workspace dependencies (harness needs sandbox) come from the wheels just built, never from the
    workspace: a wheel that only works inside the monorepo fails here.
    """
    libraries = [m for m in members().values() if m.is_library]
    with tempfile.TemporaryDirectory() as tmp:
        dist = Path(tmp) / "dist"
        for member in libraries:
            run("uv", "build", "--quiet", "--no-sources", "--wheel", "--out-dir", str(dist),
                str(member.path))  # fmt: skip
        for member in libraries:
            wheel = next(dist.glob(f"{member.name.replace('-', '_')}-*.whl"))
            venv = Path(tmp) / f"venv-{member.folder}"
            run("uv", "venv", "--quiet", str(venv))
            python = str(venv / "bin" / "python")
            run("uv", "pip", "install", "--quiet", "--python", python, "--find-links", str(dist),
                str(wheel))  # fmt: skip
            module = member.import_names[0]
            run(python, "-c", f"import {module}; print({member.name!r}, {module}.__version__)")
            if member.folder == "trajectory-tree":  # standard library only, its demo ships inside
                listing = subprocess.run(
                    ["uv", "pip", "list", "--python", python, "--format", "freeze"],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout.split()
                if [line.split("==")[0] for line in listing] != [member.name]:
                    raise CheckFailed(f"{member.name} wheel pulled in dependencies: {listing}")
                run(str(venv / "bin" / "trajectory-tree"), "demo")


Row = tuple[str, float, str]


def timed(label: str, rows: list[Row], step: Callable[[dict[str, float]], None]) -> bool:
    """Run one step, record its time and its parts' times in ``rows``; False if it failed."""
    print(f"\n== {label}", flush=True)
    parts: dict[str, float] = {}
    start = time.perf_counter()
    try:
        step(parts)
        outcome = ""
    except CheckFailed as failure:
        print(f"ci: {label}: {failure}", file=sys.stderr, flush=True)
        outcome = "FAILED  "
    detail = "  ".join(f"{name} {seconds:.0f}s" for name, seconds in parts.items())
    rows.append((label, time.perf_counter() - start, outcome + detail))
    return not outcome


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--package", help="check only this member, alone")
    what.add_argument("--cross", action="store_true", help="only the cross-package tests")
    what.add_argument("--wheels", action="store_true", help="only build and import each wheel")
    parser.add_argument("pytest_args", nargs="*", help="extra arguments for the cross tests")
    args = parser.parse_args()

    rows: list[Row] = []

    def cross(_: dict[str, float]) -> None:
        check_cross_package(args.pytest_args)

    if args.package:
        member = find_member(args.package)
        ok = timed(f"{member.name} alone", rows, partial(check_member, member))
    elif args.cross:
        ok = timed("cross-package tests", rows, cross)
    elif args.wheels:
        ok = timed("wheels", rows, lambda _: check_wheels())
    else:
        ok = timed("repository", rows, lambda _: check_repository())
        for member in members().values():
            ok = timed(f"{member.name} alone", rows, partial(check_member, member)) and ok
        ok = timed("wheels", rows, lambda _: check_wheels()) and ok
        ok = timed("cross-package tests", rows, cross) and ok
    print("\nci: timings")
    for label, seconds, detail in rows:
        print(f"  {label:<40} {seconds:7.1f} s  {detail}")
    print("ci: passed" if ok else "ci: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
