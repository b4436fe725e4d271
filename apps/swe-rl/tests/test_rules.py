"""ChangeRules.refused: each class of file grading refuses, with its exact reason, next to a
look-alike it lets through."""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from swe_rl.grading.patch_files import SYMLINK_MODE, FileSection, split_patch
from swe_rl.grading.rules import ChangeRules

from .patch_repos import Delete, Link, Move, Symlink, Tree, Write, git, make_patch, make_repo

FILE = 0o100644

TEST_PATCH = "a file of the task's test patch"
TEST_FILE = "a file holding the task's tests"
CONFIG_FILE = "the test run's configuration file"
TEST_DIRECTORY = "inside a test directory"
TEST_MODULE = "a test module"
CONFTEST = "code the test runner loads by itself (conftest.py)"
RUNNER_CONFIG = "test runner configuration"
START_UP = "an interpreter start-up hook"
METADATA = "package metadata (where entry-point plugins are declared)"
COMPILED = "compiled or cached code"
IN_GIT = "inside .git"
OUTSIDE = "outside the repository"
LINK_OUTSIDE = "a symlink pointing outside the repository"
LINK_INTO_GIT = "a symlink pointing into .git"


def modes(base: Collection[bytes] | Tree) -> dict[bytes, int]:
    """The base as `ChangeRules.refused` takes it: each path with its git mode."""
    if isinstance(base, Mapping):
        return {p: SYMLINK_MODE if isinstance(c, Link) else FILE for p, c in base.items()}
    return dict.fromkeys(base, FILE)


def stdlib(module: str) -> str:
    return f"would shadow the standard library's {module!r}"


def runner_module(module: str) -> str:
    return f"would shadow the test runner's {module!r}"


def plugin(module: str) -> str:
    return f"would shadow the test plugin {module!r}"


def new(path: bytes, mode: int = FILE) -> FileSection:
    return FileSection(b"", path, None, True, False, mode, None)


def modified(path: bytes) -> FileSection:
    return FileSection(b"", path, None, False, False, FILE, None)


def deleted(path: bytes) -> FileSection:
    return FileSection(b"", path, None, False, True, None, None)


def renamed(old: bytes, path: bytes) -> FileSection:
    return FileSection(b"", path, old, True, False, None, None)


def link(path: bytes, target: bytes, *, added: bool = True) -> FileSection:
    return FileSection(b"", path, None, added, False, SYMLINK_MODE, target)


@dataclass(frozen=True)
class Case:
    id: str
    sections: Sequence[FileSection]
    expected: Mapping[bytes, str]
    base: Collection[bytes] = ()
    rules: ChangeRules = field(default_factory=ChangeRules)


CASES = [
    # -- the task's tests --------------------------------------------------------------------
    Case("tests/ directory", [modified(b"tests/x.py")], {b"tests/x.py": TEST_DIRECTORY}),
    Case(
        "nested test/ directory",
        [new(b"pkg/test/data.json")],
        {b"pkg/test/data.json": TEST_DIRECTORY},
    ),
    Case(
        "testing/ directory",
        [modified(b"src/testing/util.py")],
        {b"src/testing/util.py": TEST_DIRECTORY},
    ),
    Case("mytests/ is not a test directory", [modified(b"mytests/x.py")], {}),
    Case("a file named tests is not a directory", [modified(b"pkg/tests")], {}),
    Case("test_*.py", [modified(b"pkg/test_calc.py")], {b"pkg/test_calc.py": TEST_MODULE}),
    Case("*_test.py", [new(b"pkg/calc_test.py")], {b"pkg/calc_test.py": TEST_MODULE}),
    Case("test_*.txt is not a test module", [modified(b"pkg/test_data.txt")], {}),
    Case(
        "testing.py / contest.py are not test modules",
        [modified(b"pkg/testing.py"), modified(b"pkg/contest.py")],
        {},
    ),
    Case(
        "deleting a test module",
        [deleted(b"pkg/test_calc.py")],
        {b"pkg/test_calc.py": TEST_MODULE},
    ),
    Case(
        "renaming a test file away: both names refused",
        [renamed(b"tests/test_calc.py", b"helpers/calc.py")],
        {b"helpers/calc.py": TEST_DIRECTORY, b"tests/test_calc.py": TEST_DIRECTORY},
        base=[b"helpers/__init__.py"],
    ),
    Case(
        "renaming a file into a test directory",
        [renamed(b"helpers/calc.py", b"tests/calc.py")],
        {b"helpers/calc.py": TEST_DIRECTORY, b"tests/calc.py": TEST_DIRECTORY},
    ),
    Case(
        "the test patch's files",
        [modified(b"docs/fixture.txt"), modified(b"docs/other.txt")],
        {b"docs/fixture.txt": TEST_PATCH},
        rules=ChangeRules(test_patch_paths=frozenset({b"docs/fixture.txt"})),
    ),
    Case(
        "the wanted tests' files, whatever their names",
        [modified(b"pkg/checks.py"), modified(b"pkg/checks2.py")],
        {b"pkg/checks.py": TEST_FILE},
        rules=ChangeRules(test_files=frozenset({b"pkg/checks.py"})),
    ),
    Case(
        "the test run's configuration file, whatever its name",
        [modified(b"ci/custom.ini"), modified(b"ci/other.ini")],
        {b"ci/custom.ini": CONFIG_FILE},
        rules=ChangeRules(config_files=frozenset({b"ci/custom.ini"})),
    ),
    Case(
        "the test patch's reason wins over the test directory's",
        [modified(b"tests/test_calc.py")],
        {b"tests/test_calc.py": TEST_PATCH},
        rules=ChangeRules(
            test_patch_paths=frozenset({b"tests/test_calc.py"}),
            test_files=frozenset({b"tests/test_calc.py"}),
        ),
    ),
    # -- what the runner loads or reads by itself ---------------------------------------------
    Case("conftest.py at the root", [new(b"conftest.py")], {b"conftest.py": CONFTEST}),
    Case(
        "conftest.py anywhere",
        [modified(b"src/pkg/conftest.py")],
        {b"src/pkg/conftest.py": CONFTEST},
    ),
    Case("conftest_utils.py is not conftest", [new(b"pkg/conftest_utils.py")], {}),
    Case(
        "pytest.ini by name, anywhere",
        [new(b"docs/pytest.ini")],
        {b"docs/pytest.ini": RUNNER_CONFIG},
    ),
    Case(
        "every runner configuration name",
        [
            modified(b"pyproject.toml"),
            modified(b"setup.cfg"),
            new(b"tox.ini"),
            new(b".pytest.ini"),
            new(b"pytest.toml"),
            new(b"sub/.pytest.toml"),
            new(b"noxfile.py"),
            new(b".coveragerc"),
            modified(b"Makefile"),
        ],
        {
            b"pyproject.toml": RUNNER_CONFIG,
            b"setup.cfg": RUNNER_CONFIG,
            b"tox.ini": RUNNER_CONFIG,
            b".pytest.ini": RUNNER_CONFIG,
            b"pytest.toml": RUNNER_CONFIG,
            b"sub/.pytest.toml": RUNNER_CONFIG,
            b"noxfile.py": RUNNER_CONFIG,
            b".coveragerc": RUNNER_CONFIG,
            b"Makefile": RUNNER_CONFIG,
        },
    ),
    Case(
        "look-alikes of configuration names",
        [new(b"docs/pytest.ini.txt"), modified(b"pkg/setup.py"), new(b"pkg/tox_helpers.py")],
        {},
    ),
    # -- interpreter start-up and import hooks ------------------------------------------------
    Case("*.pth anywhere", [new(b"pkg/evil.pth")], {b"pkg/evil.pth": START_UP}),
    Case(
        "src/sitecustomize.py", [new(b"src/sitecustomize.py")], {b"src/sitecustomize.py": START_UP}
    ),
    Case("usercustomize.py", [modified(b"usercustomize.py")], {b"usercustomize.py": START_UP}),
    Case(
        "a compiled sitecustomize",
        [new(b"sitecustomize.cpython-311-x86_64-linux-gnu.so")],
        {b"sitecustomize.cpython-311-x86_64-linux-gnu.so": START_UP},
    ),
    Case("mysitecustomize.py is no hook", [new(b"mysitecustomize.py"), new(b"pth.py")], {}),
    Case("x.egg-info/PKG-INFO", [new(b"x.egg-info/PKG-INFO")], {b"x.egg-info/PKG-INFO": METADATA}),
    Case(
        "*.dist-info/entry_points.txt",
        [new(b"lib/x-1.0.dist-info/entry_points.txt")],
        {b"lib/x-1.0.dist-info/entry_points.txt": METADATA},
    ),
    Case("*.egg-link", [new(b"x.egg-link")], {b"x.egg-link": METADATA}),
    Case("look-alikes of metadata", [new(b"docs/egg-info.md"), new(b"pkg/dist_info.py")], {}),
    # -- compiled or cached code --------------------------------------------------------------
    Case(
        "an extension module named like the standard library",
        [new(b"json.cpython-311-x86_64-linux-gnu.so")],
        {b"json.cpython-311-x86_64-linux-gnu.so": COMPILED},
    ),
    Case(
        "compiled files of every kind",
        [
            new(b"pkg/mod.pyc"),
            new(b"pkg/mod.pyo"),
            new(b"pkg/mod.pyd"),
            new(b"pkg/mod.abi3.so"),
            new(b"pkg/libhelper.so.1"),
            new(b"pkg/__pycache__/notes.txt"),
        ],
        {
            b"pkg/mod.pyc": COMPILED,
            b"pkg/mod.pyo": COMPILED,
            b"pkg/mod.pyd": COMPILED,
            b"pkg/mod.abi3.so": COMPILED,
            b"pkg/libhelper.so.1": COMPILED,
            b"pkg/__pycache__/notes.txt": COMPILED,
        },
        base=[b"pkg/__init__.py"],
    ),
    Case(
        "look-alikes of compiled code",
        [new(b"pkg/pyc.py"), new(b"pkg/sobering.py"), new(b"pkg/pycache/x.py")],
        {},
        base=[b"pkg/__init__.py", b"pkg/pycache/__init__.py"],
    ),
    # -- .git and outside the repository (never in git's own output) --------------------------
    Case("inside .git", [new(b".git/hooks/pre-commit")], {b".git/hooks/pre-commit": IN_GIT}),
    Case("inside a nested .GIT", [new(b"sub/.GIT/config")], {b"sub/.GIT/config": IN_GIT}),
    Case("look-alikes of .git", [modified(b".gitignore"), new(b".github/ci.yml")], {}),
    Case(
        "absolute and .. paths",
        [new(b"/etc/x"), new(b"pkg/../../x")],
        {b"/etc/x": OUTSIDE, b"pkg/../../x": OUTSIDE},
    ),
    # -- shadowing ----------------------------------------------------------------------------
    Case(
        "helpers/statistics.py in a package of the base",
        [new(b"helpers/statistics.py")],
        {},
        base=[b"helpers/__init__.py"],
    ),
    Case(
        "helpers/statistics.py in a package the change adds",
        [new(b"helpers/__init__.py"), new(b"helpers/statistics.py")],
        {},
    ),
    Case(
        "helpers/statistics.py in a directory that is not a package",
        [new(b"helpers/statistics.py")],
        {b"helpers/statistics.py": stdlib("statistics")},
        base=[b"helpers/text.py", b"other/__init__.py", b"helpers/sub/__init__.py"],
    ),
    Case(
        "a package the change deletes no longer counts",
        [deleted(b"helpers/__init__.py"), new(b"helpers/statistics.py")],
        {b"helpers/statistics.py": stdlib("statistics")},
        base=[b"helpers/__init__.py"],
    ),
    Case(
        "a package the change renames away no longer counts",
        [renamed(b"helpers/__init__.py", b"helpers/core.py"), new(b"helpers/statistics.py")],
        {b"helpers/statistics.py": stdlib("statistics")},
        base=[b"helpers/__init__.py"],
    ),
    Case(
        "a root __init__.py does not make the root a package",
        [new(b"json.py")],
        {b"json.py": stdlib("json")},
        base=[b"__init__.py"],
    ),
    Case("a new root json.py", [new(b"json.py")], {b"json.py": stdlib("json")}),
    Case(
        "a modified root json.py of the base: only new files shadow",
        [modified(b"json.py")],
        {},
        base=[b"json.py"],
    ),
    Case(
        "a new package named like the standard library",
        [new(b"src/json/__init__.py")],
        {b"src/json/__init__.py": stdlib("json")},
    ),
    Case(
        "a module renamed to a shadowing name",
        [renamed(b"helpers/calc.py", b"statistics.py")],
        {b"statistics.py": stdlib("statistics"), b"helpers/calc.py": stdlib("statistics")},
        base=[b"helpers/__init__.py"],
    ),
    Case("a .pyw module", [new(b"random.pyw")], {b"random.pyw": stdlib("random")}),
    Case(
        "a module newer Pythons dropped",
        [new(b"distutils.py"), new(b"imp.py")],
        {b"distutils.py": stdlib("distutils"), b"imp.py": stdlib("imp")},
    ),
    Case("pytest.py", [new(b"pytest.py")], {b"pytest.py": runner_module("pytest")}),
    Case(
        "a package named _pytest",
        [new(b"_pytest/__init__.py")],
        {b"_pytest/__init__.py": runner_module("_pytest")},
    ),
    Case(
        "pluggy.py in a non-package directory",
        [new(b"lib/pluggy.py")],
        {b"lib/pluggy.py": runner_module("pluggy")},
    ),
    Case(
        "our own runners' names",
        [new(b"pytest_runner.py"), new(b"unittest_runner.py")],
        {
            b"pytest_runner.py": runner_module("pytest_runner"),
            b"unittest_runner.py": runner_module("unittest_runner"),
        },
    ),
    Case(
        "a plugin the task loads",
        [new(b"pytest_asyncio/__init__.py"), new(b"lib/myplugin.py")],
        {
            b"pytest_asyncio/__init__.py": plugin("pytest_asyncio"),
            b"lib/myplugin.py": plugin("myplugin"),
        },
        rules=ChangeRules(plugins=frozenset({"pytest_asyncio", "myplugin"})),
    ),
    Case(
        "a plugin's name is free when the task loads no such plugin",
        [new(b"pytest_asyncio/__init__.py"), new(b"myplugin.py")],
        {},
    ),
    Case(
        "a plugin's name inside a package",
        [new(b"pkg/myplugin.py")],
        {},
        base=[b"pkg/__init__.py"],
        rules=ChangeRules(plugins=frozenset({"myplugin"})),
    ),
    Case(
        "names that are no module or shadow nothing",
        [new(b"statistics.txt"), new(b"calc.py"), new(b"caf\xe9.py"), new(b"my-json.py")],
        {},
    ),
    # -- symlinks -----------------------------------------------------------------------------
    Case(
        "a symlink with an absolute target",
        [link(b"data", b"/etc/passwd")],
        {b"data": LINK_OUTSIDE},
    ),
    Case(
        "a symlink with a ../.. target",
        [link(b"pkg/data", b"../../secret")],
        {b"pkg/data": LINK_OUTSIDE},
    ),
    Case(
        "a symlink whose target climbs out and back",
        [link(b"pkg/data", b"../../repo/x")],
        {b"pkg/data": LINK_OUTSIDE},
    ),
    Case("a symlink into .git", [link(b"cfg", b".git/config")], {b"cfg": LINK_INTO_GIT}),
    Case("a symlink to .git itself", [link(b"g", b".GIT")], {b"g": LINK_INTO_GIT}),
    Case(
        "a modified symlink pointing outside",
        [link(b"data", b"/etc/passwd", added=False)],
        {b"data": LINK_OUTSIDE},
    ),
    Case(
        "symlinks that stay inside, written as plain paths down",
        [link(b"text.py", b"helpers/text.py"), link(b"pkg/a/b", b"./helpers/./x/text.py")],
        {},
        base=[b"pkg/__init__.py", b"pkg/a/__init__.py"],
    ),
    Case(
        "symlinks that climb with `..`, even to a place inside",
        [
            link(b"pkg/text.py", b"../helpers/text.py"),
            link(b"pkg/root", b".."),
            link(b"pkg/a/b", b"../../helpers/./x/../text.py"),
        ],
        {b"pkg/text.py": LINK_OUTSIDE, b"pkg/root": LINK_OUTSIDE, b"pkg/a/b": LINK_OUTSIDE},
        base=[b"pkg/__init__.py", b"pkg/a/__init__.py"],
    ),
    Case(
        "a symlink named like the standard library is a new module",
        [link(b"json.py", b"helpers/text.py")],
        {b"json.py": stdlib("json")},
    ),
    # -- several at once ----------------------------------------------------------------------
    Case(
        "only the refused sections of a change",
        [
            modified(b"calc.py"),
            new(b"conftest.py"),
            new(b"helpers/__init__.py"),
            new(b"helpers/statistics.py"),
            deleted(b"tests/test_calc.py"),
        ],
        {b"conftest.py": CONFTEST, b"tests/test_calc.py": TEST_DIRECTORY},
        base=[b"calc.py", b"tests/test_calc.py"],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_refused(case: Case) -> None:
    assert case.rules.refused(case.sections, modes(case.base)) == dict(case.expected)


def test_refused_works_on_a_real_patch(tmp_path: Path) -> None:
    base = {b"calc.py": b"x = 1\n", b"tests/test_calc.py": b"def test(): pass\n"}
    patch = make_patch(
        tmp_path / "repo",
        base,
        [
            Write(b"calc.py", b"x = 2\n"),
            Write(b"tests/test_calc.py", b"def test(): assert True\n"),
            Write(b"statistics.py", b"fmean = max\n"),
            Write(b"helpers/__init__.py", b""),
            Write(b"helpers/json.py", b""),
        ],
    )
    refused = ChangeRules().refused(split_patch(patch), modes(base))
    assert refused == {
        b"statistics.py": stdlib("statistics"),
        b"tests/test_calc.py": TEST_DIRECTORY,
    }


def test_a_symlink_moved_and_retargeted_out_of_the_repository_is_refused(
    tmp_path: Path,
) -> None:
    base: Tree = {b"README": b"r\n", b"a/b/link": Link(b"../../README")}
    patch = make_patch(
        tmp_path / "repo",
        base,
        [Move(b"a/b/link", b"link"), Delete(b"link"), Symlink(b"link", b"../README")],
    )
    refused = ChangeRules().refused(split_patch(patch), modes(base))
    assert refused[b"link"] == LINK_OUTSIDE


# -- found by attacking the rules ------------------------------------------------------------


def test_a_refused_init_does_not_make_a_package() -> None:
    sections = [link(b"pkg/__init__.py", b"/etc/passwd"), new(b"pkg/statistics.py")]
    refused = ChangeRules().refused(sections, modes([b"pkg/test_calc.py"]))
    assert refused[b"pkg/__init__.py"] == LINK_OUTSIDE
    assert b"pkg/statistics.py" in refused


def test_a_dotted_plugin_is_shadowed_by_its_top_level_package() -> None:
    rules = ChangeRules(plugins=frozenset({"xdist.plugin"}))
    sections = [new(b"xdist/__init__.py"), new(b"xdist/plugin.py")]
    assert b"xdist/__init__.py" in rules.refused(sections, modes([]))


@pytest.mark.parametrize("path", [b"sitecustomize/__init__.py", b"src/usercustomize/__init__.py"])
def test_a_start_up_hook_package_is_refused(path: bytes) -> None:
    assert path in ChangeRules().refused([new(path)], modes([]))


@pytest.mark.parametrize("name", [b"GNUmakefile", b"makefile", b"tox.toml"])
def test_every_file_a_runner_reads_for_configuration_is_refused(name: bytes) -> None:
    assert name in ChangeRules().refused([new(name)], modes([b"Makefile", b"tox.ini"]))


def test_a_lexical_check_misses_a_symlink_through_a_symlink(tmp_path: Path) -> None:
    """What the test below guards against: sub/d -> .. and sub/e -> d/../etc/hostname, each
    inside the repository when read as text, really make sub/e point outside it."""
    repo = tmp_path / "repo"
    (repo / "sub").mkdir(parents=True)
    os.symlink("..", repo / "sub" / "d")
    os.symlink("d/../etc/hostname", repo / "sub" / "e")
    resolved = Path(os.path.realpath(repo / "sub" / "e"))
    assert not resolved.is_relative_to(repo.resolve())
    assert resolved == tmp_path.resolve() / "etc" / "hostname"


def test_a_symlink_through_another_symlink_out_of_the_repository_is_refused() -> None:
    sections = [link(b"sub/d", b".."), link(b"sub/e", b"d/../etc/hostname")]
    # Refusing sub/d alone is not enough: the base may hold such a link already.
    assert b"sub/e" in ChangeRules().refused(sections, modes([b"sub/f.py"]))


def test_a_relocated_symlink_points_where_its_target_says_from_its_new_place(
    tmp_path: Path,
) -> None:
    """What the test below guards against: git applies a 100% rename of a link by moving it, so
    its relative target then resolves from the new directory: outside the repository."""
    base: Tree = {b"README": b"r\n", b"a/b/link": Link(b"../../README")}
    patch = make_patch(tmp_path / "work", base, [Move(b"a/b/link", b"link")])
    repo = make_repo(tmp_path / "fresh", base)
    (tmp_path / "change.patch").write_bytes(patch)
    git(repo, "apply", str(tmp_path / "change.patch"))
    assert os.readlink(repo / "link") == "../../README"
    assert not Path(os.path.realpath(repo / "link")).is_relative_to(repo.resolve())


def test_a_relocated_symlink_leaving_the_repository_is_refused(tmp_path: Path) -> None:
    base: Tree = {b"README": b"r\n", b"a/b/link": Link(b"../../README")}
    patch = make_patch(tmp_path / "repo", base, [Move(b"a/b/link", b"link")])
    assert b"link" in ChangeRules().refused(split_patch(patch), modes(base))


def test_a_repository_runner_is_refused_where_it_is_not_in_a_test_directory() -> None:
    """SymPy's runner (`bin/test`, `sympy/utilities/runtests.py` in older releases) reports the
    results a SWE-bench parser reads: a change to it could report passes it never ran."""
    rules = ChangeRules(runner_files=frozenset({b"bin/test", b"sympy/utilities/runtests.py"}))
    sections = [modified(b"bin/test"), modified(b"sympy/utilities/runtests.py")]
    assert rules.refused(sections, {}) == {
        b"bin/test": "the repository's test runner",
        b"sympy/utilities/runtests.py": "the repository's test runner",
    }
    assert ChangeRules().refused(sections, {}) == {}
