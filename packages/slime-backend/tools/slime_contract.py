"""Extract the slime facts this package relies on into tests/data/slime_contract.json.

    uv run packages/slime-backend/tools/slime_contract.py PATH           # rewrite the data file
    uv run packages/slime-backend/tools/slime_contract.py PATH --check   # compare, exit 1 on drift

PATH is a slime work tree or a bare git directory (its HEAD is read). Extracted, by parsing the
source (slime imports torch, so it is never imported):

- ``flags``: every ``--flag`` registered by the modules that build ``train.py``'s parser
  (``add_argument`` and slime's ``reset_arg`` calls with a literal flag);
- ``sample_fields`` / ``sample_status``: the fields of ``slime.utils.types.Sample`` in order, and
  the values of ``Sample.Status``;
- ``advantage_estimators``: the choices of ``--advantage-estimator``;
- ``normalization``: what slime's built-in ``RolloutManager._post_process_rewards`` does: the
  estimators it subtracts the group mean for, those it also divides by the std for, and the
  epsilon added to the std;
- ``dynamic_filter_output``: the fields of ``DynamicFilterOutput``, what a
  ``--dynamic-sampling-filter-path`` function returns;
- ``flag_defaults``: the ``dest`` and ``default`` of each flag the existing file lists there (the
  flags the generate function checks on its first call; add a flag's key to extend it);
- ``rollout_sources``: the SHA-256 of each slime file the existing file lists there: slime's
  rollout code, which ``tests/slime_rollout.py`` runs from a checkout without a GPU (only with
  ``AGENT_RL_SLIME_CHECKOUT``; nothing of slime's is copied into this repository), after
  checking the checkout's files are the pinned ones.

``mounted`` is kept from the existing file: flags slime's parser takes from other packages
(Megatron-LM, sglang-router) that we emit, each with a file of the checkout that shows slime uses
it. The tool checks that each such file still contains the flag.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "slime_contract.json"
PARSER_FILES = ("slime/utils/arguments.py", "slime/backends/sglang_utils/arguments.py")
SAMPLE_FILE = "slime/utils/types.py"
ROLLOUT_FILE = "slime/ray/rollout.py"
FILTER_TYPES_FILE = "slime/rollout/filter_hub/base_types.py"


class Checkout:
    """Read files of a slime work tree, or of a bare repository's HEAD."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.bare = not (path / "train.py").is_file()

    def git(self, *args: str) -> str:
        where = ["--git-dir", str(self.path)] if self.bare else ["-C", str(self.path)]
        return subprocess.run(
            ["git", *where, *args], check=True, capture_output=True, text=True
        ).stdout

    def commit(self) -> str:
        return self.git("rev-parse", "HEAD").strip()

    def read(self, name: str) -> str:
        return self.git("show", f"HEAD:{name}") if self.bare else (self.path / name).read_text()


def parser_flags(source: str) -> set[str]:
    flags: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name not in ("add_argument", "reset_arg"):
            continue
        flags.update(
            arg.value
            for arg in node.args
            if isinstance(arg, ast.Constant)
            and isinstance(arg.value, str)
            and arg.value.startswith("--")
        )
    return flags


def sample_layout(source: str) -> tuple[list[str], list[str]]:
    """Field names of ``class Sample`` (annotated class attributes, in order) and Status values."""
    sample = next(
        n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "Sample"
    )
    fields = [
        n.target.id
        for n in sample.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    ]
    status = next(n for n in sample.body if isinstance(n, ast.ClassDef) and n.name == "Status")
    values = [
        str(n.value.value)
        for n in status.body
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
    ]
    return fields, values


def estimator_choices(source: str) -> list[str]:
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value == "--advantage-estimator"
        ):
            choices = next(k.value for k in node.keywords if k.arg == "choices")
            return [str(v) for v in ast.literal_eval(choices)]
    raise SystemExit("--advantage-estimator not found")


def builtin_normalization(source: str) -> dict[str, object]:
    """The estimator lists and the epsilon of ``_post_process_rewards``, in source order."""
    function = next(
        n
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.FunctionDef) and n.name == "_post_process_rewards"
    )
    lists: list[list[str]] = []
    epsilons: list[float] = []
    for node in ast.walk(function):
        if (
            isinstance(node, ast.Compare)
            and isinstance(node.left, ast.Attribute)
            and node.left.attr == "advantage_estimator"
        ):
            lists.append([str(v) for v in ast.literal_eval(node.comparators[0])])
        if (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, ast.Add)
            and isinstance(node.right, ast.Constant)
        ):
            epsilons.append(float(ast.literal_eval(node.right)))
    mean, std = lists
    (epsilon,) = epsilons
    return {"mean_estimators": mean, "std_estimators": std, "std_epsilon": epsilon}


def dataclass_fields(source: str, name: str) -> list[str]:
    """The annotated attributes of ``class name``, in order."""
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == name)
    return [
        n.target.id
        for n in cls.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    ]


def flag_defaults(sources: list[str], flags: Sequence[str]) -> dict[str, dict[str, object]]:
    """``dest`` and ``default`` of each of ``flags`` as argparse would set them (a store_true
    flag defaults to False). A default that is not a literal fails: the file holds literals."""
    found: dict[str, dict[str, object]] = {}
    for source in sources:
        for node in ast.walk(ast.parse(source)):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"
            ):
                continue
            names = [
                a.value
                for a in node.args
                if isinstance(a, ast.Constant) and isinstance(a.value, str)
            ]
            flag = next((n for n in names if n in flags), None)
            if flag is None:
                continue
            keywords = {k.arg: k.value for k in node.keywords if k.arg}
            action = keywords.get("action")
            store_true = isinstance(action, ast.Constant) and action.value == "store_true"
            default = ast.literal_eval(keywords["default"]) if "default" in keywords else None
            if store_true and "default" not in keywords:
                default = False
            dest = keywords.get("dest")
            found[flag] = {
                "dest": ast.literal_eval(dest) if dest is not None else flag[2:].replace("-", "_"),
                "default": default,
            }
    missing = sorted(set(flags) - set(found))
    if missing:
        raise SystemExit(f"not defined by slime's parser any more: {', '.join(missing)}")
    return dict(sorted(found.items()))


def rollout_sources(checkout: Checkout, names: Sequence[str]) -> dict[str, str]:
    return {
        name: hashlib.sha256(checkout.read(name).encode()).hexdigest() for name in sorted(names)
    }


def extract(
    checkout: Checkout,
    mounted: dict[str, dict[str, str]],
    described: Sequence[str] = (),
    sources: Sequence[str] = (),
) -> dict[str, object]:
    """The facts; ``described`` are the flags of ``flag_defaults``, ``sources`` the slime files
    of ``rollout_sources`` (both kept from the existing data file)."""
    flags: set[str] = set()
    for name in PARSER_FILES:
        flags |= parser_flags(checkout.read(name))
    for flag, entry in mounted.items():
        if flag in flags:
            raise SystemExit(f"{flag} is defined by slime itself now: move it out of 'mounted'")
        if flag not in checkout.read(entry["evidence"]):
            raise SystemExit(f"{flag}: no longer found in {entry['evidence']}")
    fields, status = sample_layout(checkout.read(SAMPLE_FILE))
    return {
        "slime_commit": checkout.commit(),
        "parser_files": list(PARSER_FILES),
        "flags": sorted(flags),
        "mounted": dict(sorted(mounted.items())),
        "sample_fields": fields,
        "sample_status": status,
        "advantage_estimators": estimator_choices(checkout.read(PARSER_FILES[0])),
        "normalization": builtin_normalization(checkout.read(ROLLOUT_FILE)),
        "dynamic_filter_output": dataclass_fields(
            checkout.read(FILTER_TYPES_FILE), "DynamicFilterOutput"
        ),
        "flag_defaults": flag_defaults([checkout.read(n) for n in PARSER_FILES], described),
        "rollout_sources": rollout_sources(checkout, sources),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkout", type=Path, help="slime work tree or bare git directory")
    parser.add_argument("--check", action="store_true", help="compare instead of rewriting")
    parser.add_argument("--data", type=Path, default=DATA, help="the data file")
    args = parser.parse_args()
    current = json.loads(args.data.read_text())
    checkout = Checkout(args.checkout)
    fresh = extract(
        checkout,
        current["mounted"],
        list(current.get("flag_defaults", {})),
        list(current.get("rollout_sources", {})),
    )
    text = json.dumps(fresh, indent=1) + "\n"
    if args.check:
        if fresh != current:
            changed = sorted(k for k in fresh if fresh[k] != current.get(k))
            print(f"slime contract drifted in: {', '.join(changed)}", file=sys.stderr)
            return 1
        print(f"slime contract matches {fresh['slime_commit']}")
        return 0
    args.data.write_text(text)
    print(f"wrote {args.data} from {fresh['slime_commit']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
