"""Which files of the agent's change grading refuses to apply, and why.

The task's tests are run against the agent's change to the code under test. Anything else a
change can do that makes failing code pass is refused, file by file, with the reason:

- **the task's tests**: files of the test patch, the files holding the wanted tests, test
  modules, anything in a test directory;
- **what the runner loads or reads by itself**: `conftest.py`, the configuration file the
  test run was given, runner configuration files by name, and a repository's own runner
  (SymPy's `bin/test` and runner module). The pytest and unittest
  runners take their configuration from the task, never from discovery in the repository
  (runners.py), so a config file the list does not name is harmless to them; the list
  guards tasks that bring their own command;
- **interpreter start-up and import hooks**: `*.pth`, `sitecustomize`/`usercustomize`, and
  package metadata (`*.dist-info`, `*.egg-info`, `*.egg-link`), which is where entry-point
  plugins are declared;
- **compiled or cached code**: `__pycache__`, `*.pyc`, native extension modules, which a
  reviewer cannot read and Python prefers over the source next to them;
- **shadowing**: a new module or package, in a directory that is not a regular package (so
  the directory may be on the import path), named like a module of the standard library,
  the runner, its plugin system or a plugin the task loads;
- **symlinks that may lead out**: a target that is absolute, climbs with `..`, enters `.git`
  or spans lines, and a symlink of the base moved or copied elsewhere (where its target
  means something else).

The rules are deliberately broad: an honest fix to a SWE task changes the code under test.
"""

from __future__ import annotations

import sys
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from swe_rl.grading.patch_files import SYMLINK_MODE, FileSection

TEST_DIRECTORIES = frozenset({b"test", b"tests", b"testing"})
RUNNER_LOADS = frozenset({b"conftest.py"})
RUNNER_CONFIG = frozenset(
    {
        b"pytest.ini",
        b".pytest.ini",
        b"pytest.toml",
        b".pytest.toml",
        b"tox.ini",
        b"setup.cfg",
        b"pyproject.toml",
        b"tox.toml",
        b"noxfile.py",
        b".coveragerc",
        b"Makefile",
        b"makefile",
        b"GNUmakefile",
    }
)
START_UP_MODULES = frozenset({"sitecustomize", "usercustomize"})
METADATA_SUFFIXES = (b".dist-info", b".egg-info", b".egg-link")
COMPILED_SUFFIXES = (b".pyc", b".pyo", b".so", b".pyd")
MODULE_SUFFIXES = (b".py", b".pyw", b".pyc", b".pyo", b".so", b".pyd")
#: The runner and what it is built from or loads plugins through: a module of one of these
#: names on the import path before the real one takes over the run.
RUNNER_MODULES = frozenset(
    {
        "pytest",
        "_pytest",
        "pluggy",
        "py",
        "iniconfig",
        "packaging",
        "exceptiongroup",
        "tomli",
        "pygments",
        "colorama",
        "importlib_metadata",
        "importlib_resources",
        "zipp",
        "pkg_resources",
        "setuptools",
        "_distutils_hack",
        "typing_extensions",
        "unittest_runner",
        "pytest_runner",
        "log_runner",
    }
)
#: Standard-library modules, including a few that newer Pythons dropped but older task
#: environments still import.
STANDARD_LIBRARY = frozenset(sys.stdlib_module_names) | {
    "asynchat",
    "asyncore",
    "distutils",
    "imp",
    "smtpd",
}


@dataclass(frozen=True, slots=True)
class ChangeRules:
    """The rules for one task: its test patch's files and the plugins its runner loads."""

    test_patch_paths: frozenset[bytes] = frozenset()
    test_files: frozenset[bytes] = frozenset()
    """Files that hold the wanted tests, whatever their names."""
    config_files: frozenset[bytes] = frozenset()
    """The configuration file the test run reads (pytest's `-c`)."""
    runner_files: frozenset[bytes] = frozenset()
    """The repository's own test runner (SymPy's `bin/test`, `sympy/utilities/runtests.py`)."""
    plugins: frozenset[str] = field(default_factory=frozenset)

    def refused(
        self, sections: Iterable[FileSection], base: Mapping[bytes, int]
    ) -> dict[bytes, str]:
        """Every path of a refused section, with the reason its section is refused. `base`
        maps each path of the base (test patch applied) to its git mode."""
        sections = list(sections)
        reasons = {id(s): self._reason(s, base) for s in sections}
        applied = [s for s in sections if reasons[id(s)] is None]
        packages = _package_dirs(base, applied)
        refused: dict[bytes, str] = {}
        for section in sections:
            reason = reasons[id(section)] or self._shadowed(section, packages)
            if reason is not None:
                for path in section.paths:
                    refused[path] = reason
        return refused

    def _reason(self, section: FileSection, base: Mapping[bytes, int]) -> str | None:
        """Why `section` may not be applied, shadowing aside (it needs the packages)."""
        for path in section.paths:
            reason = self._path_reason(path)
            if reason is not None:
                return reason
        moved = section.renamed_from or section.copied_from
        if moved is not None and base.get(moved) == SYMLINK_MODE:
            return "a symlink of the base moved or copied elsewhere"
        target = section.symlink_target
        if section.mode == SYMLINK_MODE and target is not None:
            return _symlink_reason(target)
        return None

    def _path_reason(self, path: bytes) -> str | None:
        parts = path.split(b"/")
        name = parts[-1]
        if path in self.test_patch_paths:
            return "a file of the task's test patch"
        if path in self.test_files:
            return "a file holding the task's tests"
        if path in self.config_files:
            return "the test run's configuration file"
        if path in self.runner_files:
            return "the repository's test runner"
        if any(part in TEST_DIRECTORIES for part in parts[:-1]):
            return "inside a test directory"
        if name.endswith(b".py") and (name.startswith(b"test_") or name.endswith(b"_test.py")):
            return "a test module"
        if name in RUNNER_LOADS:
            return "code the test runner loads by itself (conftest.py)"
        if name in RUNNER_CONFIG:
            return "test runner configuration"
        if name.endswith(b".pth") or any(_module_name(p) in START_UP_MODULES for p in parts):
            return "an interpreter start-up hook"
        if any(part.endswith(METADATA_SUFFIXES) for part in parts):
            return "package metadata (where entry-point plugins are declared)"
        if b"__pycache__" in parts or name.endswith(COMPILED_SUFFIXES) or b".so." in name:
            return "compiled or cached code"
        if any(part.lower() == b".git" for part in parts):
            return "inside .git"
        if path.startswith(b"/") or b".." in parts:
            return "outside the repository"
        return None

    def _shadowed(self, section: FileSection, packages: Collection[bytes]) -> str | None:
        """Why a new module written by `section` would shadow another, or None."""
        if not section.added or section.deleted:
            return None
        parts = section.path.split(b"/")
        if len(parts) >= 2 and parts[-1] == b"__init__.py":  # a new package: its directory
            directory, module = b"/".join(parts[:-2]), _module_name(parts[-2])
        elif parts[-1].endswith(MODULE_SUFFIXES):
            directory, module = b"/".join(parts[:-1]), _module_name(parts[-1])
        else:
            return None
        if module is None or directory in packages:
            return None  # inside a regular package it is `package.module`, never top level
        if module in STANDARD_LIBRARY:
            return f"would shadow the standard library's {module!r}"
        if module in RUNNER_MODULES:
            return f"would shadow the test runner's {module!r}"
        if module in {plugin.split(".")[0] for plugin in self.plugins}:
            return f"would shadow the test plugin {module!r}"
        return None


def _module_name(name: bytes) -> str | None:
    """The importable name of a file name (`json.cpython-311-x86_64-linux-gnu.so` -> json)."""
    stem = name.split(b".", 1)[0]
    try:
        text = stem.decode("ascii")
    except UnicodeDecodeError:
        return None
    return text if text.isidentifier() else None


def _package_dirs(base: Mapping[bytes, int], applied: Iterable[FileSection]) -> set[bytes]:
    """Directories holding an `__init__.py` once the applied sections are in."""
    inits = {path for path in base if path.endswith(b"/__init__.py")}
    for section in applied:
        if section.path.endswith(b"/__init__.py"):
            if section.deleted:
                inits.discard(section.path)
            else:
                inits.add(section.path)
        if section.renamed_from is not None:
            inits.discard(section.renamed_from)
    return {path[: -len(b"/__init__.py")] for path in inits}


def _symlink_reason(target: bytes) -> str | None:
    """A target is judged as written, never resolved: `..` anywhere could climb out through
    another link, so only plain paths down from the link's directory are kept."""
    parts = target.split(b"/")
    if target.startswith(b"/") or b".." in parts or b"\n" in target:
        return "a symlink pointing outside the repository"
    if any(part.lower() == b".git" for part in parts):
        return "a symlink pointing into .git"
    return None
