"""The project's checks, for the whole workspace or one package at a time.

    uv run tools/ci.py                      # lint, format, mypy --strict per package, tests
    uv run tools/ci.py --package sandbox    # the same, restricted to one package
    uv run tools/ci.py --wheels             # also build each library wheel and import it alone

Per-package runs are part of the design: each package must pass on its own.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NO_TESTS_COLLECTED = 5


def packages() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for pyproject in sorted(
        [*ROOT.glob("packages/*/pyproject.toml"), *ROOT.glob("apps/*/pyproject.toml")]
    ):
        name = tomllib.loads(pyproject.read_text())["project"]["name"]
        found[name] = pyproject.parent
    return found


def run(*cmd: str, cwd: Path = ROOT) -> None:
    print("+", " ".join(cmd), flush=True)
    result = subprocess.run(cmd, cwd=cwd, check=False)
    if result.returncode == NO_TESTS_COLLECTED and "pytest" in cmd:
        sys.exit(f"ci: pytest collected no tests in {' '.join(cmd)}: that is a failure")
    if result.returncode:
        sys.exit(f"ci: failed ({result.returncode}): {' '.join(cmd)}")


def source_dir(path: Path) -> Path:
    src = path / "src"
    return src if src.is_dir() else path


def check_wheels(chosen: dict[str, Path]) -> None:
    """Build every library wheel, then install each one alone into an empty venv and import it.

    Workspace dependencies (harness needs sandbox) come from the wheels just built, never from the
    workspace: a wheel that only works inside the monorepo fails here.
    """
    libraries = {n: p for n, p in packages().items() if p.parent.name == "packages"}
    with tempfile.TemporaryDirectory() as tmp:
        dist = Path(tmp) / "dist"
        for name in libraries:
            run("uv", "build", "--quiet", "--package", name, "--wheel", "--out-dir", str(dist))
        for name, path in chosen.items():
            if name not in libraries:
                continue
            wheel = next(dist.glob(f"{name.replace('-', '_')}-*.whl"))
            venv = Path(tmp) / f"venv-{name}"
            run("uv", "venv", "--quiet", str(venv))
            python = str(venv / "bin" / "python")
            run(
                "uv",
                "pip",
                "install",
                "--quiet",
                "--python",
                python,
                "--find-links",
                str(dist),
                str(wheel),
            )
            module = next(p.name for p in (path / "src").iterdir() if (p / "__init__.py").exists())
            run(python, "-c", f"import {module}; print('{name}', {module}.__version__, 'imports')")
            if name == "trajectory-tree":  # standard library only, and its demo ships inside
                listing = subprocess.run(
                    ["uv", "pip", "list", "--python", python, "--format", "freeze"],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout.split()
                if [line.split("==")[0] for line in listing] != ["trajectory-tree"]:
                    sys.exit(f"ci: trajectory-tree wheel pulled in dependencies: {listing}")
                run(str(venv / "bin" / "trajectory-tree"), "demo")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--package", help="check only this workspace member")
    parser.add_argument("--wheels", action="store_true", help="build and import each wheel alone")
    parser.add_argument("pytest_args", nargs="*", help="extra arguments for pytest")
    args = parser.parse_args()
    members = packages()
    if args.package and args.package not in members:
        sys.exit(f"ci: unknown package {args.package!r}; known: {', '.join(members)}")
    chosen = {args.package: members[args.package]} if args.package else members
    targets = [str(p) for p in chosen.values()]
    lint_targets = targets if args.package else [str(ROOT)]
    run("uv", "run", "ruff", "check", *lint_targets)
    run("uv", "run", "ruff", "format", "--check", *lint_targets)
    for name, path in chosen.items():
        print(f"-- mypy --strict {name}")
        run("uv", "run", "mypy", "--strict", str(source_dir(path)))
    if args.wheels:
        check_wheels(chosen)
    tests = targets if args.package else []
    run("uv", "run", "pytest", *tests, *args.pytest_args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
