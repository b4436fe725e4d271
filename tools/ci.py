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


def check_wheel(name: str, path: Path) -> None:
    """Build ``name``'s wheel, install it into an empty venv, import it."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "dist"
        run("uv", "build", "--package", name, "--wheel", "--out-dir", str(out))
        wheel = next(out.glob("*.whl"))
        venv = Path(tmp) / "venv"
        run("uv", "venv", "--quiet", str(venv))
        python = str(venv / "bin" / "python")
        run("uv", "pip", "install", "--quiet", "--python", python, str(wheel))
        module = next(p.name for p in (path / "src").iterdir() if (p / "__init__.py").exists())
        run(
            python, "-c", f"import {module}; print('{name}', {module}.__version__, 'imports alone')"
        )


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
        for name, path in chosen.items():
            if path.parent.name == "packages":
                check_wheel(name, path)
    tests = targets if args.package else []
    run("uv", "run", "pytest", *tests, *args.pytest_args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
