"""tools/release.py end to end, against a real package index on 127.0.0.1.

The index is pypiserver, started by the test with uploads behind an htpasswd account
(``__token__`` and a token), as PyPI takes API tokens. The release runs in a copy of this
repository with a git history of its own, so tags and version commits land there. A released
package is then installed by name and version with pip, from that index alone, into a fresh
virtual environment, and imported.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "pypi-test-token-for-the-local-index"


@dataclass(frozen=True)
class Index:
    upload_url: str
    simple_url: str
    packages: Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def index(tmp_path: Path) -> Iterator[Index]:
    packages = tmp_path / "index-packages"
    packages.mkdir()
    passwords = tmp_path / "htpasswd"
    with warnings.catch_warnings():  # passlib imports the crypt module Python 3.13 drops
        warnings.simplefilter("ignore", DeprecationWarning)
        from passlib.apache import HtpasswdFile  # type: ignore[import-untyped]  # no stubs
    accounts = HtpasswdFile(str(passwords), new=True)
    accounts.set_password("__token__", TOKEN)
    accounts.save()
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pypiserver",
            "run",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--passwords",
            str(passwords),
            "--authenticate",
            "update",
            "--disable-fallback",
            str(packages),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(url + "health", timeout=1).close()
                break
            except (urllib.error.URLError, ConnectionError):
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("pypiserver did not start") from None
                time.sleep(0.1)
        yield Index(upload_url=url, simple_url=url + "simple/", packages=packages)
    finally:
        server.terminate()
        server.wait(timeout=10)


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True)
    return done.stdout.strip()


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """The repository's files as they are now (ignored ones aside), in a history of their own."""
    repo = tmp_path / "repo"
    for name in git(ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard").split(
        "\0"
    ):
        source = ROOT / name
        if name and source.is_file():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, repo / name)
    if (ROOT / "uv.lock").is_file():  # made on each machine; a copy saves a resolution
        shutil.copy2(ROOT / "uv.lock", repo / "uv.lock")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.name", "release test")
    git(repo, "config", "user.email", "release@example.invalid")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "the repository as tested")
    return repo


def release(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(repo / "tools" / "release.py"), *args],
        cwd=repo,
        capture_output=True,
        text=True,
        check=False,
    )


def add_changelog_entry(repo: Path, folder: str, version: str) -> None:
    changelog = repo / "packages" / folder / "CHANGELOG.md"
    entry = f"## {version}\n\n- Released by the test.\n\n## "
    changelog.write_text(changelog.read_text().replace("## ", entry, 1))
    git(repo, "commit", "-qam", f"changelog: {folder} {version}")


def index_files(index: Index) -> list[str]:
    return sorted(p.name for p in index.packages.iterdir())


@pytest.mark.slow
def test_release_uploads_tags_and_pip_installs_by_name_and_version(
    checkout: Path, index: Index, tmp_path: Path
) -> None:
    add_changelog_entry(checkout, "trajectory-tree", "0.2.0")
    pyproject = checkout / "packages" / "trajectory-tree" / "pyproject.toml"

    dry = release(checkout, "trajectory-tree", "0.2.0")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    for check in (
        "version",
        "changelog",
        "bounds of dependents",
        "released dependencies",
        "alone: mypy --strict, tests",
        "build sdist and wheel",
        "metadata and contents",
    ):
        assert f"ok       {check}" in dry.stdout
    assert "would tag trajectory-tree-v0.2.0" in dry.stdout
    assert 'version = "0.1.0"' in pyproject.read_text()
    assert git(checkout, "tag") == ""
    assert index_files(index) == []

    config = tmp_path / "release.toml"  # outside the repository: a token never belongs in one
    config.write_text(f'[publish]\nrepository-url = "{index.upload_url}"\ntoken = "{TOKEN}"\n')
    published = release(checkout, "trajectory-tree", "0.2.0", "--publish", "--config", str(config))
    assert published.returncode == 0, published.stdout + published.stderr
    assert index_files(index) == [
        "agent_rl_trajectory_tree-0.2.0-py3-none-any.whl",
        "agent_rl_trajectory_tree-0.2.0.tar.gz",
    ]
    assert git(checkout, "tag") == "trajectory-tree-v0.2.0"
    assert git(checkout, "log", "-1", "--format=%s", "trajectory-tree-v0.2.0") == (
        "release: agent-rl-trajectory-tree 0.2.0"
    )
    assert 'version = "0.2.0"' in pyproject.read_text()
    assert git(checkout, "status", "--porcelain") == ""

    venv = tmp_path / "fresh-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--no-cache-dir",
            "--disable-pip-version-check",
            "--index-url",
            index.simple_url,
            "agent-rl-trajectory-tree==0.2.0",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert pip.returncode == 0, pip.stdout + pip.stderr
    imported = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import trajectory_tree as t; print(t.__version__, t.SessionTree.__name__)",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert imported.stdout.split() == ["0.2.0", "SessionTree"]
    demo = subprocess.run(
        [str(venv / "bin" / "trajectory-tree"), "demo"], capture_output=True, check=False
    )
    assert demo.returncode == 0, demo.stderr

    # The index really checks the token: the release got in because it sent the right one.
    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "twine",
            "upload",
            "--non-interactive",
            "--repository-url",
            index.upload_url,
            "-u",
            "__token__",
            "-p",
            "wrong-token",
            *map(str, (index.packages).iterdir()),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert refused.returncode != 0
    assert "403" in refused.stdout + refused.stderr or "401" in refused.stdout + refused.stderr


def test_release_refuses_before_uploading_what_breaks_the_rules(
    checkout: Path, index: Index
) -> None:
    """A dependent's bound that excludes the new version, a missing changelog entry, a member
    depending on an unreleased one, uncommitted changes: each stops a release, nothing is sent."""
    adapters = checkout / "packages" / "protocol-adapters" / "pyproject.toml"
    adapters.write_text(
        adapters.read_text().replace(
            '"agent-rl-trajectory-tree>=0.1.0"', '"agent-rl-trajectory-tree>=0.1.0,<0.2"'
        )
    )
    git(checkout, "commit", "-qam", "a bound that excludes 0.2")
    publish = ("--publish", "--repository-url", index.upload_url, "--token", TOKEN)

    tree = release(checkout, "trajectory-tree", "0.2.0", *publish)
    assert tree.returncode == 1
    assert "FAILED   changelog" in tree.stdout
    assert "no '## 0.2.0' entry in packages/trajectory-tree/CHANGELOG.md" in tree.stdout
    assert "FAILED   bounds of dependents" in tree.stdout
    assert "protocol-adapters requires agent-rl-trajectory-tree<0.2,>=0.1.0, not 0.2.0" in (
        tree.stdout
    )

    harness = release(checkout, "harness", "0.1.0", *publish)
    assert harness.returncode == 1
    assert "sandbox 0.1.0 is not released (no tag sandbox-v0.1.0): release it first" in (
        harness.stdout
    )

    (checkout / "packages" / "sandbox" / "src" / "sandbox" / "scratch.py").write_text("")
    sandbox = release(checkout, "sandbox", "0.1.0", *publish)
    assert sandbox.returncode == 1
    assert "FAILED   committed" in sandbox.stdout

    for result in (tree, harness, sandbox):
        assert "alone: mypy" not in result.stdout  # stopped before the slow steps
    assert index_files(index) == []
    assert git(checkout, "tag") == ""

    tokenless = release(checkout, "trajectory-tree", "0.1.0", "--publish")
    assert tokenless.returncode == 1
    assert "--publish needs --token or a config file" in tokenless.stderr

    app = release(checkout, "swe-rl", "0.1.0")
    assert app.returncode == 1
    assert "application: it is never released" in app.stderr


POLICY = """
import sys
sys.path.insert(0, sys.argv[1])
import release
member = release.find_member(sys.argv[2])
for check in (release.check_version, release.check_changelog, release.check_dependents):
    try:
        print("ok", check(member, sys.argv[3]))
    except release.ReleaseError as failure:
        print("FAILED", failure)
try:
    print("ok", release.check_dependencies(member))
except release.ReleaseError as failure:
    print("FAILED", failure)
"""


def policy(folder: str, version: str) -> list[str]:
    """The release policy's verdicts (version, changelog, dependents' bounds, released
    dependencies) on this repository as it is: the quick checks that decide whether VERSION may
    be released at all."""
    done = subprocess.run(
        [sys.executable, "-c", POLICY, str(ROOT / "tools"), folder, version],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.splitlines()


def test_the_readmes_release_example_passes_the_release_policy() -> None:
    """The dry run the README shows is one the policy admits as the repository stands (the
    member alone and its build are what the end-to-end test above runs)."""
    readme = (ROOT / "README.md").read_text()
    examples = re.findall(r"`uv run tools/release\.py (\S+) (\S+)`", readme)
    assert examples, "the README shows no release dry run"
    for folder, version in examples:
        verdicts = policy(folder, version)
        assert [line.split()[0] for line in verdicts] == ["ok"] * 4, verdicts


def test_a_version_without_a_changelog_entry_is_told_what_to_add() -> None:
    changelog = policy("trajectory-tree", "9.0.0")[1]
    assert changelog.startswith(
        "FAILED no '## 9.0.0' entry in packages/trajectory-tree/CHANGELOG.md (it lists 0.1.0): "
        "add a '## 9.0.0' heading above the others, with a line on what changed, and commit it"
    )
