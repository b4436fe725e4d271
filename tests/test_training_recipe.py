"""docs/training.md, the GPU recipe, kept true on CPU.

Every shell block of the recipe names the test that runs it (``tested:``) or, for a command
that needs GPUs, the test that dry-runs it (``gpu only; dry run:``). Here: every block has
such a note naming a test that exists and whose module uses the command's own words (its
sub-command and flags); every `swe-rl` command parses with the real parser; the run files dry-run
into the `ray job submit` slime would get; the wheels build and install into an environment of
their own and import; and the commands for GPU nodes use only flags their tools define
(Ray's, by its own `--help`; SGLang's and slime's conversion tool's, pinned below from their
sources).
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from swe_rl.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "docs" / "training.md"
RUN_FILES = sorted((ROOT / "docs" / "training").glob("*.toml"))
NOTE = re.compile(r"<!-- (tested|gpu only; dry run): (\S+)::(\w+) -->")
SWE_RL = ("uv", "run", "apps/swe-rl")

# SGLang's server flags the recipe uses, as python/sglang/srt/server_args.py defines them
# (sgl-project/sglang at 469c63e5): the adapter needs nothing else of the server.
SGLANG_FLAGS = {"--model-path", "--host", "--port", "--tp-size", "--context-length"}
# slime's tools/convert_hf_to_torch_dist.py (THUDM/slime at 624b824a) parses Megatron's
# arguments plus these; the model's own come from scripts/models/<model>.sh (MODEL_ARGS).
SLIME_CONVERSION_FLAGS = {"--hf-checkpoint", "--save"}


@dataclass(frozen=True)
class Block:
    kind: str
    test_file: Path
    test_name: str
    lines: tuple[str, ...]

    def commands(self) -> Iterator[list[str]]:
        """Each command of the block as argv (continuation lines joined)."""
        text = "\n".join(self.lines).replace("\\\n", " ")
        for line in text.splitlines():
            for part in line.split("&&"):
                words = shlex.split(part)
                if words:
                    yield words


def blocks() -> list[Block]:
    found: list[Block] = []
    lines = RECIPE.read_text().splitlines()
    for index, line in enumerate(lines):
        if not line.startswith("```bash"):
            continue
        note = NOTE.fullmatch(lines[index - 1].strip()) if index else None
        assert note is not None, f"docs/training.md:{index + 1}: a block without its test note"
        end = lines.index("```", index + 1)
        kind, path, name = note.groups()
        found.append(Block(kind, ROOT / path, name, tuple(lines[index + 1 : end])))
    return found


def swe_rl_commands() -> list[list[str]]:
    return [
        words[len(SWE_RL) :]
        for block in blocks()
        for words in block.commands()
        if tuple(words[: len(SWE_RL)]) == SWE_RL
    ]


def test_every_block_names_a_test_that_runs_its_words() -> None:
    assert len(blocks()) >= 10
    for block in blocks():
        source = block.test_file.read_text()
        functions = {
            node.name
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        }
        assert block.test_name in functions, f"{block.test_file}: no {block.test_name}"
        if block.test_file == Path(__file__):
            continue
        for words in block.commands():
            verb = words[len(SWE_RL)] if tuple(words[: len(SWE_RL)]) == SWE_RL else words[0]
            for word in {verb, *(w for w in words if w.startswith("-"))}:
                assert word in source, f"{block.test_file.name} never uses {word!r} ({words})"


@pytest.mark.parametrize("words", swe_rl_commands(), ids=lambda w: " ".join(w[:2]))
def test_every_swe_rl_command_parses(words: list[str]) -> None:
    args = build_parser().parse_args(words)
    assert args.command == words[0]


def test_the_recipe_points_at_files_that_exist() -> None:
    for target in re.findall(r"\]\(([^)#]+)\)", RECIPE.read_text()):
        assert (RECIPE.parent / target).exists(), target
    for path in ("apps/swe-rl/docs/example-settings.toml",):
        assert path in RECIPE.read_text()
        assert (ROOT / path).is_file()


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`uv build --all-packages --wheel --out-dir DIR`, the recipe's command, run once."""
    (words,) = [
        w for b in blocks() for w in b.commands() if w[:2] == ["uv", "build"] and "--wheel" in w
    ]
    out = tmp_path_factory.mktemp("wheels")
    argv = [*words[: words.index("--out-dir") + 1], str(out)]
    done = subprocess.run(
        [_uv(), *argv[1:]], cwd=ROOT, capture_output=True, text=True, check=False, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def _uv() -> str:
    """The uv running us (`uv run` names itself in $UV), else the one on the PATH."""
    found = os.environ.get("UV") or shutil.which("uv")
    assert found, "the recipe's commands need uv (pip install uv)"
    return found


@pytest.mark.slow
def test_the_wheels_build_and_install_beside_another_environment(
    wheels: Path, tmp_path: Path
) -> None:
    """What Ray's runtime environment does on every node, here by hand: the wheels (and their
    dependencies, from the index, as pinned) into an environment that had none of ours, whose
    generate function, hooks and package data then load."""
    names = sorted(p.name.split("-")[0] for p in wheels.glob("*.whl"))
    assert names == sorted(
        f"agent_rl_{m}"
        for m in (
            "harness",
            "protocol_adapters",
            "sandbox",
            "slime_backend",
            "swe_rl",
            "trajectory_tree",
        )
    )
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["uv"]
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("\n".join(config["constraint-dependencies"]) + "\n")
    venv = tmp_path / "node"
    run = [_uv(), "venv", "--quiet", "--python", sys.executable, str(venv)]
    assert subprocess.run(run, check=False, timeout=300).returncode == 0
    python = venv / "bin" / "python"
    install = [_uv(), "pip", "install", "--quiet", "--python", str(python)]
    install += ["--exclude-newer", config["exclude-newer"], "-c", str(constraints)]
    done = subprocess.run(
        [*install, *map(str, sorted(wheels.glob("*.whl")))],
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    probe = (
        "import importlib.resources as r, swe_rl.rollout, slime_backend.generate, "
        "slime_backend.gate_hook, slime_backend.reward_hook, sandbox, swe_rl.viewer\n"
        "assert r.files('sandbox').joinpath('_capture_walker.py').is_file()\n"
        "assert any(r.files('swe_rl.viewer').joinpath('assets').iterdir())\n"
        "print(swe_rl.rollout.__file__)"
    )
    imported = subprocess.run(
        [str(python), "-c", probe],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        cwd=tmp_path,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )
    assert imported.returncode == 0, imported.stderr[-3000:]
    assert imported.stdout.startswith(str(venv)), imported.stdout


@pytest.mark.slow
@pytest.mark.parametrize("run_file", RUN_FILES, ids=lambda p: p.name)
def test_the_run_files_dry_run(run_file: Path, wheels: Path, tmp_path: Path) -> None:
    """The recipe's run files, with the wheels where they were built: the dry run prints the
    custom config and a `ray job submit` whose runtime environment installs every wheel."""
    text = run_file.read_text()
    wheels_line = re.search(r'^wheels = "([^"]+)"', text, re.MULTILINE)
    assert wheels_line is not None, "the run file names its wheels"
    local = tmp_path / run_file.name
    local.write_text(text.replace(wheels_line.group(1), str(wheels)))
    shown = [
        w
        for b in blocks()
        for w in b.commands()
        if w[: len(SWE_RL) + 2] == [*SWE_RL, "train", str(run_file.relative_to(ROOT))]
    ]
    assert any("--dry-run" in w for w in shown), "the recipe dry-runs the run file"
    done = subprocess.run(
        [sys.executable, str(ROOT / "apps" / "swe-rl"), "train", str(local), "--dry-run"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    submit = done.stdout[done.stdout.index("ray job submit") :].replace("\\\n", " ")
    tokens = shlex.split(submit.splitlines()[0])
    runtime_env = json.loads(tokens[tokens.index("--runtime-env-json") + 1])
    installed = runtime_env["pip"]["packages"]
    assert sorted(installed) == sorted(str(p) for p in wheels.glob("*.whl"))
    assert "--custom-generate-function-path swe_rl.rollout.generate" in submit


def _ray_cli() -> str:
    ray = shutil.which("ray") or str(Path(sys.executable).parent / "ray")
    if not Path(ray).exists():
        pytest.skip("Ray's CLI is not installed (slime-backend's `ray` extra)")
    return ray


def test_the_ray_commands_are_ones_ray_accepts() -> None:
    ray_blocks = [w for b in blocks() for w in b.commands() if w[:2] == ["ray", "start"]]
    assert len(ray_blocks) == 2
    shown = subprocess.run(
        [_ray_cli(), "start", "--help"], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    for words in ray_blocks:
        for flag in (w for w in words if w.startswith("--")):
            assert flag in shown, f"ray start has no {flag}"
        assert "--node-ip-address" in words, "every node names its address"


def test_the_sglang_command_uses_flags_sglang_defines() -> None:
    (words,) = [w for b in blocks() for w in b.commands() if "sglang.launch_server" in w]
    flags = {w for w in words if w.startswith("--")}
    assert flags <= SGLANG_FLAGS, flags - SGLANG_FLAGS
    assert {"--model-path", "--port"} <= flags


def test_the_conversion_command_names_slimes_tool_and_flags() -> None:
    (words,) = [
        w for b in blocks() for w in b.commands() if "tools/convert_hf_to_torch_dist.py" in w
    ]
    flags = {w for w in words if w.startswith("--")}
    assert flags == SLIME_CONVERSION_FLAGS
    assert "${MODEL_ARGS[@]}" in words
    run_file = tomllib.loads(RUN_FILES[0].read_text())
    assert words[words.index("--save") + 1] == run_file["model"]["ref_load"]
    assert words[words.index("--hf-checkpoint") + 1] == run_file["model"]["hf_checkpoint"]
