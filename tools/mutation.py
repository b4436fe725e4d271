"""Mutation testing: would the tests notice a broken core?

    uv run tools/mutation.py                                  # both targets, every mutant
    uv run tools/mutation.py --targets core                   # trajectory-tree's core only
    uv run tools/mutation.py --targets bridge --modules check.py,bridge.py
    uv run tools/mutation.py --targets core --list            # the mutants, none run
    uv run tools/mutation.py --targets core --only 12,40      # re-run two of them
    uv run tools/mutation.py --targets core --modules _canonical.py \\
        --tests packages/trajectory-tree/tests/test_canonical_numbers.py

Run by hand, never in CI: a full run takes ~30-40 min per target on 2 cores (see the "Mutation
score" section of tools/bench/README.md for the last figures and how to cut a run down).

An AST mutator (standard library ``ast`` only). Each target module is parsed and every mutation
point enumerated: comparison operators negated or moved across their boundary (``<`` -> ``>=``,
``<`` -> ``<=``), ``and``/``or`` swapped, ``not`` removed, boolean, int and float constants
changed (``True`` <-> ``False``, 0 <-> 1, n -> n + 1), arithmetic swapped (``+`` <-> ``-``,
``*`` <-> ``//`` or ``/``, ``**`` -> ``*``, unary ``-`` removed), ``return X`` replaced by a
neutral value of the function's return type, an ``if`` (or conditional expression, or
comprehension filter) negated, a slice bound off by one, and a statement deleted where that is
safe (a call, an augmented assignment, an assignment to an attribute, an item or a name already
bound, ``raise``, ``del``, ``break``, ``continue``). Not mutated: annotations, decorators,
docstrings, f-strings (the wording of messages), assertions and ``zip(strict=)``, ``__all__``
and ``__slots__``, and lines marked ``pragma: no cover``. Each mutant is the module's source
with only the mutated expression or statement rewritten (line numbers and comments kept); a
mutant whose syntax tree equals the original's or another mutant's is dropped.

The working tree is never written to (others work in it): the repository is copied once (every
file git tracks or would track, as it is in the working tree, or as of ``--rev``) into a
temporary directory, and that snapshot once more per worker (at most 2). A worker writes a
mutant into its copy and runs the target's tests there, with the copy's ``src`` directories
first on ``PYTHONPATH`` (checked: the package is imported from the copy), its own pytest cache,
temporary directories and hypothesis database, a fixed hypothesis seed and no bytecode. Test
files run fastest first (timed on the unmutated copy) with ``-x``, so most mutants die within
seconds. A failing test, a failed collection or a crash kills the mutant, and so does a run
over the timeout (a hang). The copies are removed on exit, Ctrl-C and ``kill`` included.

A survivor that cannot be killed because it changes nothing observable is listed in
:data:`EQUIVALENT` with the reason; the score is killed / (mutants - equivalent - errors).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import copy
import hashlib
import importlib.util
import io
import json
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from xml.etree import ElementTree

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

ROOT = Path(__file__).resolve().parent.parent
MAX_WORKERS = 2
"""The machine has 2 cores, shared: more test runs at once only slow each other down."""


@dataclass(frozen=True)
class Target:
    """A package, the modules of it to mutate, and the tests that must notice.

    Paths are relative to the repository's root (the snapshot's, when running)."""

    package: str
    """The import package's directory."""
    modules: tuple[str, ...]
    """Paths relative to ``package``."""
    tests: tuple[str, ...]
    """Test files or directories (a directory's ``test_*.py`` files)."""


TARGETS: dict[str, Target] = {
    # Routing and recording (_tree), linearization, canonical equality (numbers included),
    # messages, the renderer contract (_bridge: what the tree checks of a prompt), turns, the
    # summary and serialization; with every test of the package. Not core: _rewards (a policy
    # over samples), _render (the text view), __main__ (the command line).
    "core": Target(
        "packages/trajectory-tree/src/trajectory_tree",
        (
            "_tree.py",
            "_linearize.py",
            "_canonical.py",
            "_messages.py",
            "_summary.py",
            "_turns.py",
            "_bridge.py",
            "_serialize.py",
        ),
        ("packages/trajectory-tree/tests",),
    ),
    # The renderer that renders only a turn's new messages onto the recorded prefix, what it
    # learns from probe conversations, the closing scaffold, the loss labels of new messages and
    # the checks against a full render. The tests: the renderer's own (the package's whole suite
    # takes minutes, mostly servers and dialects that reach the renderer through these paths).
    "bridge": Target(
        "packages/protocol-adapters/src/protocol_adapters",
        (
            "_bridge/renderer.py",
            "_bridge/bridge.py",
            "_template/context.py",
            "_bridge/check.py",
        ),
        (
            "packages/protocol-adapters/tests/template/test_render_bridge.py",
            "packages/protocol-adapters/tests/template/test_template_traits.py",
            "packages/protocol-adapters/tests/template/test_render_bridge_property.py",
            "packages/protocol-adapters/tests/template/test_kept_output_notes.py",
        ),
    ),
}

_ALIASES = (
    "a memo of keys proven (by same_message) to be echoes of a node's message: without it, or"
    " with a different cap, the same echoes match, through same_message each time"
)
_STAMPS = (
    "recency stamps are only ever compared with each other, and all of them move by the same"
    " amount (a document holds them one higher, read back in the same order)"
)
_FAST_PATH = (
    "routing's fast path (a key hit) skipped: same_message then decides, and it agrees with"
    " key equality (test_messages_with_equal_keys_are_the_same_message)"
)
_APPEND = (
    "the audit leaves a template whose generation prompt rewrites earlier text to full renders"
    " (Verdict.FULL_RENDER_ONLY), so on a bridged turn it only adds text after the last message"
)
EQUIVALENT: dict[str, str] = {
    # "<module>::<function>::<line before> => <line after>" (source lines, stripped; " / " joins
    # the lines of a multi-line node): survivors that change nothing a caller can observe, each
    # with the reason. A key no mutant has any more is reported when its module is mutated.
    # -- core
    "_tree.py::<module>::_MAX_ALIASES = 4 => _MAX_ALIASES = 5": _ALIASES,
    "_tree.py::Node.matches::if len(self.aliases) < _MAX_ALIASES:"
    " => if (len(self.aliases) >= _MAX_ALIASES):": _ALIASES,
    "_tree.py::Node.matches::if len(self.aliases) < _MAX_ALIASES:"
    " => if (len(self.aliases) <= _MAX_ALIASES):": _ALIASES,
    "_tree.py::Node.matches::self.aliases.append(key) => pass": _ALIASES,
    "_tree.py::SessionTree.snapshot::twin.aliases = list(node.aliases) => pass": _ALIASES,
    "_tree.py::Node.matches::if (self.aliases and key in self.aliases) or own.key == key:"
    " => if ((self.aliases and key in self.aliases) and own.key == key):": _FAST_PATH,
    "_tree.py::SessionTree.route::and (only.message.key == key or (only.aliases and key in"
    " only.aliases)) => and ((only.message.key == key and (only.aliases and key in"
    " only.aliases)))": _FAST_PATH,
    '_tree.py::<module>::_SIGN_BYTE = 3 if sys.byteorder == "little" else 0'
    ' => _SIGN_BYTE = 3 if sys.byteorder == "little" else 1': (
        "the big-endian branch, never taken on a little-endian machine (this one, CI's)"
    ),
    "_tree.py::Node.__init__::self.touched = 0 => self.touched = 1": (
        "a new node's stamp is never read: the record that creates a node stamps it and its"
        " ancestors before anything compares stamps"
    ),
    "_tree.py::SessionTree.__init__::self._clock = 0 => self._clock = 1": _STAMPS,
    "_serialize.py::_rebuild::clock = 0 => clock = 1": (
        "the clock of a loaded tree starts at its largest stamp; it differs only for a tree"
        " without stamps (empty, or all 0), where " + _STAMPS
    ),
    '_serialize.py::_rebuild::node.touched = int(entry.get("touched", 0))'
    ' => node.touched = int(entry.get("touched", 1))': (
        "a document without stamps gives every node the same one, whichever it is"
    ),
    "_tree.py::SessionTree._register_context::if route.anchor.id >= 0:"
    " => if (route.anchor.id > 0):": (
        "node 0 is the first context root; a route anchored there takes the other branch, where"
        " _find_context returns that same root and nothing is added"
    ),
    "_tree.py::SessionTree._register_context::if route.anchor.id >= 0:"
    " => if route.anchor.id >= 1:": (
        "the same as > 0: node 0 is a context root that _find_context returns as it is"
    ),
    "_tree.py::SessionTree.request_messages::return [n.message for n in"
    " self._nodes[turn.node].path()[1:-1] if n.message is not None] => return [n.message for n"
    " in self._nodes[turn.node].path()[0:-1] if n.message is not None]": (
        "path()[0] is the context root, whose message is None: the filter drops it either way"
    ),
    "_linearize.py::linearize::if kept is None and limit.mode is LengthMode.DROP:"
    " => if (kept is None or limit.mode is LengthMode.DROP):": (
        "under DROP every over-long sample is None, so only a TRUNCATE sample cut before its"
        " first trained token takes the other branch; it loses the same whole spans either way,"
        " and its turns, left unclaimed, lie past the cut in every sample that reaches them"
        " (a turn sits at the same offset in all of them): the same exclusions, listed later"
    ),
    "_messages.py::Message::key: tuple[str, ...] = field(init=False, repr=False, compare=False)"
    " => key: tuple[str, ...] = field(init=False, repr=True, compare=False)": (
        "the repr only (the key is never parsed from it)"
    ),
    "_messages.py::Message::key: tuple[str, ...] = field(init=False, repr=False, compare=False)"
    " => key: tuple[str, ...] = field(init=False, repr=False, compare=True)": (
        "the key is a function of compared fields, so comparing it as well changes no equality"
    ),
    '_messages.py::Message.__post_init__::"E" if self.is_error else "",'
    ' => "E" if (not (self.is_error)) else "",': (
        "the key marks errors the other way round: keys still differ exactly when is_error does"
    ),
    # -- bridge
    "_bridge/renderer.py::RendererConfig::context_cache_size: int = 16"
    " => context_cache_size: int = 17": (
        "the default size of the cache of probe results: a context pushed out is probed again,"
        " to the same results (test_the_probes_of_the_most_recently_used_contexts_are_kept holds"
        " a size given)"
    ),
    "_template/context.py::names_for::index = matched - 1 => index = matched - 0": (
        "the walk back starts at the first new message instead of the one before it: that"
        " message's calls are in names already and out of wanted, so it finds nothing there"
    ),
    "_bridge/bridge.py::_reasoning_kept::text = context.render(skeleton,"
    " add_generation_prompt=False, names=call_names(skeleton)) => text ="
    " context.render(skeleton, add_generation_prompt=True, names=call_names(skeleton))": (
        "the skeleton ends on the request's last message, never a reply (a request ending on a"
        " reply is rendered in full), and a generation prompt after it is an append: " + _APPEND
    ),
    "_template/context.py::TemplateContext.header::text = self.render_after(key[0],"
    " (probe,), gen=False) => text = self.render_after(key[0], (probe,), gen=True)": (
        "a generation prompt after the probe is an append, so the text before its content is"
        " the same: " + _APPEND
    ),
    "_template/context.py::Slot::leading: bool = False => leading: bool = True": (
        "Slot.of sets leading for every system message and base() reads it only for a system"
        " slot: the default changes only the cache keys of other slots"
    ),
    "_template/context.py::Slot::text: bool = True => text: bool = False": (
        "base() reads text only for an assistant slot with calls, and every such slot comes from"
        " Slot.of, which sets it: the default changes only cache keys"
    ),
    "_template/context.py::common_prefix_at::limit = min(len(piece), len(text) - start)"
    " => limit = min(len(piece), (len(text) + start))": (
        "a bound past the text's end only widens the binary search: a prefix longer than the"
        " text left never matches, so the same longest prefix is found"
    ),
    "_template/context.py::message_regions::if len(messages) == 1: => if len(messages) == 0:": (
        "one message's region is the whole text either way (the loop renders it once more, alone"
        " and without the generation prompt it was just rendered with, for an end it then"
        " replaces with the text's), and no caller passes no messages (_bridge labels only new"
        " ones)"
    ),
}


# -- mutation points -----------------------------------------------------------------------------

_NEGATED: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.GtE,
    ast.GtE: ast.Lt,
    ast.Gt: ast.LtE,
    ast.LtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
}
_BOUNDARY: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
}
_ARITHMETIC: dict[type[ast.operator], type[ast.operator]] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.FloorDiv,
    ast.FloorDiv: ast.Mult,
    ast.Div: ast.Mult,
    ast.Pow: ast.Mult,
}
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_DELETABLE = (ast.Expr, ast.AugAssign, ast.Raise, ast.Delete, ast.Break, ast.Continue)

Function = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass(frozen=True)
class Point:
    """One way to mutate one node: ``kind`` applied to the ``index``-th node of ``ast.walk``."""

    module: str
    index: int
    kind: str
    line: int
    function: str


@dataclass(frozen=True)
class Mutant:
    id: int
    point: Point
    source: str
    before: str
    after: str

    @property
    def key(self) -> str:
        """Stable across line shifts: what :data:`EQUIVALENT` is keyed by."""
        return f"{self.point.module}::{self.point.function}::{self.before} => {self.after}"

    @property
    def where(self) -> str:
        return f"{self.point.module}:{self.point.line}"


class _Module:
    """A parsed module with what the mutation rules need to know about each node."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.lines = source.splitlines(keepends=True)
        self.tree = ast.parse(source)
        self.nodes = list(ast.walk(self.tree))
        self.parents: dict[int, ast.AST] = {}
        for parent in self.nodes:
            for child in ast.iter_child_nodes(parent):
                self.parents[id(child)] = parent
        self.scope: dict[int, tuple[str, Function | None]] = {}
        self._assign_scopes(self.tree, "<module>", None)
        self.skipped: set[int] = set()
        self._mark_skipped()
        self.bound: dict[int, list[tuple[int, str]]] = {
            id(node): _bindings(node) for node in self.nodes if isinstance(node, _FUNCTIONS)
        }

    def _assign_scopes(self, node: ast.AST, name: str, function: Function | None) -> None:
        for child in ast.iter_child_nodes(node):
            self.scope[id(child)] = (name, function)
            if isinstance(child, _SCOPES):
                inner = child.name if name == "<module>" else f"{name}.{child.name}"
                inner_function = child if isinstance(child, _FUNCTIONS) else function
                self._assign_scopes(child, inner, inner_function)
            else:
                self._assign_scopes(child, name, function)

    def _mark_skipped(self) -> None:
        roots: list[ast.AST] = []
        for node in self.nodes:
            if isinstance(node, _FUNCTIONS):
                roots += node.decorator_list
                if node.returns is not None:
                    roots.append(node.returns)
                arguments = node.args
                every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
                every += [a for a in (arguments.vararg, arguments.kwarg) if a is not None]
                roots += [a.annotation for a in every if a.annotation is not None]
            elif isinstance(node, ast.ClassDef):
                roots += node.decorator_list
            elif isinstance(node, ast.AnnAssign):
                roots.append(node.annotation)
            elif _never_mutated(node):
                roots.append(node)
            if isinstance(node, ast.stmt) and "pragma: no cover" in self.lines[node.lineno - 1]:
                roots.append(node)
            if isinstance(node, (ast.Module, *_SCOPES)):
                body = node.body
                if (
                    body
                    and isinstance(body[0], ast.Expr)
                    and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str)
                ):
                    roots.append(body[0])
        for root in roots:
            self.skipped.update(id(n) for n in ast.walk(root))

    def function_name(self, node: ast.AST) -> str:
        return self.scope.get(id(node), ("<module>", None))[0]

    def enclosing_function(self, node: ast.AST) -> Function | None:
        return self.scope.get(id(node), ("<module>", None))[1]

    def line_of(self, node: ast.AST) -> int:
        """The node's first line, or its nearest ancestor's (a comprehension, an operator)."""
        while not isinstance(node, ast.Module):
            line = getattr(node, "lineno", 0)
            if line:
                return int(line)
            node = self.parents[id(node)]
        return 0

    def splice(self, node: ast.expr | ast.stmt, text: str) -> tuple[str, str, str]:
        """``(module source, lines before, lines after)`` with ``node``'s source replaced (its
        offsets count UTF-8 bytes)."""
        first, last = node.lineno - 1, (node.end_lineno or node.lineno) - 1
        head = self.lines[first].encode()[: node.col_offset].decode()
        tail = self.lines[last].encode()[node.end_col_offset :].decode()
        new = head + text + tail
        before = " / ".join(line.strip() for line in self.lines[first : last + 1])
        after = " / ".join(line.strip() for line in new.splitlines())
        source = "".join([*self.lines[:first], new, *self.lines[last + 1 :]])
        return source, before, after


def _never_mutated(node: ast.AST) -> bool:
    """Assertions (``zip(strict=)`` included), f-strings (the wording of messages),
    ``if TYPE_CHECKING``, ``__all__`` and ``__slots__``."""
    if isinstance(node, ast.Assert | ast.JoinedStr):
        return True
    if isinstance(node, ast.keyword):
        return node.arg == "strict"  # zip(strict=True) is an assertion too
    if isinstance(node, ast.If):
        return ast.unparse(node.test) == "TYPE_CHECKING"
    return isinstance(node, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id in {"__all__", "__slots__"} for t in node.targets
    )


def _bindings(function: Function) -> list[tuple[int, str]]:
    """``(line, name)`` of every name bound in ``function`` (arguments at its first line)."""
    arguments = function.args
    every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
    every += [a for a in (arguments.vararg, arguments.kwarg) if a is not None]
    found = [(function.lineno, a.arg) for a in every]
    found += [
        (node.lineno, node.id)
        for node in ast.walk(function)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)
    ]
    return found


def _target_names(target: ast.expr) -> Iterator[ast.expr]:
    if isinstance(target, ast.Tuple | ast.List):
        for element in target.elts:
            yield from _target_names(element)
    else:
        yield target


def _deletable_assignment(module: _Module, node: ast.Assign | ast.AnnAssign) -> bool:
    """An assignment whose deletion leaves every name it sets bound (so the mutant runs)."""
    function = module.enclosing_function(node)
    if function is None or node.value is None:
        return False
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    bound = module.bound[id(function)]
    for target in targets:
        for element in _target_names(target):
            if isinstance(element, ast.Attribute) and function.name == "__init__":
                return False  # the attribute's first assignment
            if isinstance(element, ast.Name) and not any(
                line < node.lineno and name == element.id for line, name in bound
            ):
                return False
            if not isinstance(element, ast.Name | ast.Attribute | ast.Subscript):
                return False
    return True


def _neutral(function: Function | None, value: ast.expr) -> str:
    """A neutral value of ``function``'s return type that ``value`` is not (or "")."""
    annotation = ast.unparse(function.returns) if function and function.returns else ""
    parts = [p.strip() for p in annotation.split("|")]
    head = annotation.split("[")[0].strip()
    choices: tuple[str, ...]
    if "None" in parts:
        choices = ("None",)
    elif head == "bool":
        choices = ("False", "True")
    elif head == "int":
        choices = ("0", "1")
    elif head == "float":
        choices = ("0.0", "1.0")
    elif head == "str":
        choices = ("''", "'mutant'")
    elif head in {"list", "Sequence"}:
        choices = ("[]",)
    elif head == "tuple":
        choices = ("()",)
    elif head in {"dict", "Mapping"}:
        choices = ("{}",)
    elif head in {"set", "frozenset"}:
        choices = ("set()",)
    elif head in {"Iterator", "Iterable"}:
        choices = ("iter(())",)
    else:
        choices = ("None",)
    current = ast.unparse(value)
    return next((c for c in choices if ast.unparse(ast.parse(c, mode="eval").body) != current), "")


def _kinds(module: _Module, node: ast.AST) -> list[str]:
    """The mutations that apply to ``node``."""
    if id(node) in module.skipped:
        return []
    kinds: list[str] = []
    if isinstance(node, ast.Compare):
        for position, op in enumerate(node.ops):
            kinds.append(f"negate-compare:{position}")
            if type(op) in _BOUNDARY:
                kinds.append(f"boundary-compare:{position}")
    elif isinstance(node, ast.BoolOp):
        kinds.append("swap-boolop")
    elif isinstance(node, ast.Constant) and isinstance(node.value, bool | int | float):
        kinds.append("constant")
    elif isinstance(node, ast.BinOp | ast.AugAssign) and type(node.op) in _ARITHMETIC:
        kinds.append("arithmetic")
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        kinds.append("remove-not")
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        kinds.append("remove-minus")
    elif isinstance(node, ast.Slice):
        if node.lower is not None:
            kinds.append("slice-lower")
        if node.upper is not None:
            kinds.append("slice-upper")
    elif isinstance(node, ast.comprehension):
        kinds += [f"negate-filter:{i}" for i, c in enumerate(node.ifs) if not _one_compare(c)]
    if isinstance(node, ast.If | ast.IfExp) and not _one_compare(node.test):
        kinds.append("negate-if")
    if (
        isinstance(node, ast.Return)
        and node.value is not None
        and _neutral(module.enclosing_function(node), node.value)
    ):
        kinds.append("neutral-return")
    if module.enclosing_function(node) is not None and (
        (isinstance(node, _DELETABLE) and not _inert(node))
        or (isinstance(node, ast.Assign | ast.AnnAssign) and _deletable_assignment(module, node))
    ):
        kinds.append("delete")
    return kinds


def _one_compare(test: ast.expr) -> bool:
    """A single comparison: negating it as a whole is the same mutant as negating its operator."""
    return isinstance(test, ast.Compare) and len(test.ops) == 1 and type(test.ops[0]) in _NEGATED


def _inert(node: ast.AST) -> bool:
    """A statement that is only a constant (a string used as a comment, ``...``)."""
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)


def _negated(expr: ast.expr) -> str:
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
        return f"({ast.unparse(expr.operand)})"
    return f"(not ({ast.unparse(expr)}))"


def _edit(module: _Module, node: ast.AST, kind: str) -> tuple[ast.expr | ast.stmt, str]:
    """The node whose source the mutation rewrites, and its new source."""
    name, _, arg = kind.partition(":")
    if name in {"negate-compare", "boundary-compare"}:
        assert isinstance(node, ast.Compare)
        new = copy.deepcopy(node)
        table = _NEGATED if name == "negate-compare" else _BOUNDARY
        new.ops[int(arg)] = table[type(node.ops[int(arg)])]()
        return node, f"({ast.unparse(new)})"
    if name == "swap-boolop":
        assert isinstance(node, ast.BoolOp)
        swapped = ast.BoolOp(ast.Or() if isinstance(node.op, ast.And) else ast.And(), node.values)
        return node, f"({ast.unparse(swapped)})"
    if name == "constant":
        assert isinstance(node, ast.Constant)
        value = node.value
        if isinstance(value, bool):
            return node, repr(not value)
        if isinstance(value, int):
            return node, repr({0: 1, 1: 0}.get(value, value + 1))
        assert isinstance(value, float)
        return node, repr({0.0: 1.0, 1.0: 0.0}.get(value, value + 1.0))
    if name == "arithmetic":
        assert isinstance(node, ast.BinOp | ast.AugAssign)
        changed = copy.copy(node)
        changed.op = _ARITHMETIC[type(node.op)]()
        if isinstance(changed, ast.AugAssign):
            return node, ast.unparse(changed)
        return node, f"({ast.unparse(changed)})"
    if name in {"remove-not", "remove-minus"}:
        assert isinstance(node, ast.UnaryOp)
        return node, f"({ast.unparse(node.operand)})"
    if name in {"slice-lower", "slice-upper"}:
        assert isinstance(node, ast.Slice)
        bound = node.lower if name == "slice-lower" else node.upper
        assert bound is not None
        sign = "+" if name == "slice-lower" else "-"
        return bound, f"({ast.unparse(bound)} {sign} 1)"
    if name == "negate-filter":
        assert isinstance(node, ast.comprehension)
        condition = node.ifs[int(arg)]
        return condition, _negated(condition)
    if name == "negate-if":
        assert isinstance(node, ast.If | ast.IfExp)
        return node.test, _negated(node.test)
    if name == "neutral-return":
        assert isinstance(node, ast.Return)
        assert node.value is not None
        return node.value, _neutral(module.enclosing_function(node), node.value)
    if name == "delete":
        assert isinstance(node, ast.stmt)
        return node, "pass"
    raise ValueError(kind)  # pragma: no cover - every kind _kinds returns is handled above


def enumerate_mutants(package: Path, modules: Sequence[str]) -> list[Mutant]:
    """Every distinct mutant of ``modules`` (relative to ``package``), in a stable order."""
    mutants: list[Mutant] = []
    for relative in modules:
        source = (package / relative).read_text()
        plan = _Module(source)
        seen = {ast.dump(plan.tree)}
        for index, node in enumerate(plan.nodes):
            for kind in _kinds(plan, node):
                replaced, text = _edit(plan, node, kind)
                mutated, before, after = plan.splice(replaced, text)
                try:
                    shape = ast.dump(ast.parse(mutated))
                except SyntaxError as error:  # pragma: no cover - a bug in _edit, not a mutant
                    raise SystemExit(f"{relative}:{plan.line_of(node)} {kind}: {error}") from None
                if shape in seen:
                    continue
                seen.add(shape)
                point = Point(relative, index, kind, plan.line_of(node), plan.function_name(node))
                mutants.append(Mutant(len(mutants), point, mutated, before, after))
    return mutants


def stratified_sample(mutants: Sequence[Mutant], size: int, seed: int) -> list[Mutant]:
    """``size`` mutants, each function's share in proportion to its mutants (at least one per
    function when ``size`` allows), drawn with ``seed``; all of them when ``size`` is 0."""
    if size <= 0 or size >= len(mutants):
        return list(mutants)
    groups: dict[str, list[Mutant]] = {}
    for mutant in mutants:
        groups.setdefault(f"{mutant.point.module}::{mutant.point.function}", []).append(mutant)
    names = sorted(groups)
    floor = 1 if size >= len(names) else 0
    quota = dict.fromkeys(names, floor)
    room = {n: len(groups[n]) - floor for n in names}
    left = size - floor * len(names)
    total = sum(room.values())
    exact = {n: left * room[n] / total for n in names}
    for name in names:
        quota[name] += int(exact[name])
    left -= sum(int(e) for e in exact.values())
    # largest remainder; a name whose share is fractional always has room for one more
    for name in sorted(names, key=lambda n: exact[n] - int(exact[n]), reverse=True)[:left]:
        quota[name] += 1
    # one generator per function: an edit elsewhere in a module leaves this function's draw alone
    chosen = [m for n in names for m in random.Random(f"{seed}:{n}").sample(groups[n], quota[n])]
    return sorted(chosen, key=lambda m: m.id)


# -- the repository's copies ---------------------------------------------------------------------


def snapshot(destination: Path, rev: str | None) -> str:
    """Copy the repository into ``destination``: the working tree's files git tracks or would
    track (untracked but not ignored), or the tree of commit ``rev``. Returns what was copied."""
    destination.mkdir(parents=True)
    if rev is not None:
        commit = _git("rev-parse", "--verify", f"{rev}^{{commit}}").decode().strip()
        with tarfile.open(fileobj=io.BytesIO(_git("archive", "--format=tar", commit))) as tar:
            tar.extractall(destination, filter="data")
        return f"commit {commit[:12]}"
    listed = _git("ls-files", "-z", "--cached", "--others", "--exclude-standard")
    names = sorted({name for name in listed.decode().split("\0") if name})
    for name in names:
        source = ROOT / name
        if not source.is_file():  # deleted in the working tree, or a submodule
            continue
        target = destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target, follow_symlinks=False)
    changed = _git("status", "--porcelain", "--untracked-files=normal").decode().splitlines()
    return f"working tree at {_git('rev-parse', '--short=12', 'HEAD').decode().strip()}" + (
        f" + {len(changed)} changed or untracked paths" if changed else ""
    )


def _git(*args: str) -> bytes:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, check=True).stdout


class Processes:
    """The test runs in progress, so an interrupt can end each one's process group."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: set[subprocess.Popen[str]] = set()
        self.stopping = False

    @contextlib.contextmanager
    def started(self, process: subprocess.Popen[str]) -> Iterator[None]:
        with self._lock:
            self._live.add(process)
            if self.stopping:  # started as the others were being ended
                _kill_group(process)
        try:
            yield
        finally:
            with self._lock:
                self._live.discard(process)

    def stop(self) -> None:
        with self._lock:
            self.stopping = True
            live = list(self._live)
        for process in live:
            _kill_group(process)


def _kill_group(process: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


@dataclass
class Sandbox:
    """One worker's copy of the repository; the target package is imported from it."""

    target: Target
    home: Path
    snapshot: Path
    repo: Path = field(init=False)
    env: dict[str, str] = field(init=False)

    def __post_init__(self) -> None:
        self.repo = self.home / "repo"
        shutil.copytree(self.snapshot, self.repo, symlinks=True)
        sources = sorted(
            str(project.parent / "src")
            for project in self.repo.glob("*/*/pyproject.toml")
            if (project.parent / "src").is_dir()
        )
        inherited = [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([*sources, *inherited]),
            "PYTHONDONTWRITEBYTECODE": "1",
            "HYPOTHESIS_STORAGE_DIRECTORY": str(self.home / "hypothesis"),
        }

    def module_path(self, relative: str) -> Path:
        return self.repo / self.target.package / relative

    @contextlib.contextmanager
    def mutated(self, mutant: Mutant) -> Iterator[None]:
        path = self.module_path(mutant.point.module)
        original = path.read_text()
        path.write_text(mutant.source)
        try:
            yield
        finally:
            path.write_text(original)

    def imported_from(self) -> str:
        """Where a fresh interpreter imports the package from (must be the copy)."""
        name = Path(self.target.package).name
        out = subprocess.run(
            [sys.executable, "-c", f"import {name}; print({name}.__file__)"],
            env=self.env,
            cwd=self.repo,
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout.strip()

    def test_files(self, tests: Sequence[str]) -> list[str]:
        """The test files of ``tests`` (a directory's ``test_*.py``), relative to the copy."""
        files: list[str] = []
        for test in tests:
            path = self.repo / test
            if not path.exists():
                raise SystemExit(f"no test file or directory {test} in the copy")
            found = sorted(path.glob("test_*.py")) if path.is_dir() else [path]
            files += [str(p.relative_to(self.repo)) for p in found]
        return files


@dataclass(frozen=True)
class RunSettings:
    timeout: float
    nice: int
    seed: int


def run_tests(
    sandbox: Sandbox,
    tests: Sequence[str],
    settings: RunSettings,
    processes: Processes,
    junit: Path | None = None,
) -> tuple[str, float, str, str]:
    """``(status, seconds, first failing test, output tail)`` of one pytest run."""
    shutil.rmtree(sandbox.home / "hypothesis", ignore_errors=True)  # no replay across mutants
    command = [
        sys.executable,
        "-m",
        "pytest",
        *tests,
        "-c",
        "pyproject.toml",
        "--rootdir=.",
        "-x",
        "--tb=no",
        "-rfE",
        "-p",
        "no:randomly",
        f"--basetemp={sandbox.home / 'basetemp'}",
    ]
    if importlib.util.find_spec("hypothesis") is not None:
        command.append(f"--hypothesis-seed={settings.seed}")
    if junit is not None:
        command += [f"--junitxml={junit}", "-o", "junit_family=xunit1"]
    if settings.nice:
        command = ["nice", "-n", str(settings.nice), *command]
    started = time.perf_counter()
    process = subprocess.Popen(
        command,
        cwd=sandbox.repo,
        env=sandbox.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: a timeout or Ctrl-C ends all of it
    )
    with processes.started(process):
        try:
            output, _ = process.communicate(timeout=settings.timeout)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            process.communicate()
            return "timeout", time.perf_counter() - started, "", ""
        except BaseException:
            _kill_group(process)
            raise
    if processes.stopping:
        raise KeyboardInterrupt
    seconds = time.perf_counter() - started
    killer = next(
        (line.split()[1] for line in output.splitlines() if line.startswith(("FAILED", "ERROR "))),
        "",
    )
    tail = "\n".join(output.strip().splitlines()[-5:])
    code = process.returncode
    if code == 0:
        return "survived", seconds, "", tail
    # 1: a test failed; 2: collection failed (the mutant broke an import); < 0: a crash
    if code in {1, 2} or code < 0:
        return "killed", seconds, killer or f"exit status {code}", tail
    return "error", seconds, killer, tail


def fastest_first(junit: Path, files: Sequence[str]) -> list[str]:
    """``files`` ordered by the time their tests took in a JUnit report (fastest first), so
    ``-x`` stops a mutant's run at the cheapest failing test file."""
    spent = dict.fromkeys(files, 0.0)
    for case in ElementTree.parse(junit).iter("testcase"):
        name = case.get("file", "")
        if name in spent:
            spent[name] += float(case.get("time", "0") or 0)
    return sorted(files, key=lambda f: spent[f])


# -- reporting -----------------------------------------------------------------------------------


@dataclass
class Outcome:
    mutant: Mutant
    status: str  # killed, timeout, survived, error; listed: not run
    seconds: float
    killer: str = ""
    detail: str = ""

    @property
    def killed(self) -> bool:
        return self.status in {"killed", "timeout"}

    @property
    def equivalent(self) -> bool:
        return self.status == "survived" and self.mutant.key in EQUIVALENT


@dataclass(frozen=True)
class Score:
    mutants: int
    killed: int
    timeouts: int
    survived: int
    equivalent: int
    errors: int

    @classmethod
    def of(cls, outcomes: Sequence[Outcome]) -> Score:
        equivalent = sum(1 for o in outcomes if o.equivalent)
        return cls(
            len(outcomes),
            sum(1 for o in outcomes if o.status == "killed"),
            sum(1 for o in outcomes if o.status == "timeout"),
            sum(1 for o in outcomes if o.status == "survived") - equivalent,
            equivalent,
            sum(1 for o in outcomes if o.status == "error"),
        )

    @property
    def scored(self) -> int:
        """The non-equivalent mutants that ran."""
        return self.mutants - self.equivalent - self.errors

    @property
    def score(self) -> float:
        return (self.killed + self.timeouts) / self.scored if self.scored else 1.0


def summary_table(name: str, outcomes: Sequence[Outcome], population: int) -> Table:
    """The score per module and in all."""
    table = Table(
        title=f"mutation score: {name} ({len(outcomes)} of {population} mutants run)",
        title_justify="left",
    )
    table.add_column("module")
    for column in ("mutants", "killed", "timed out", "survived", "equivalent", "errors"):
        table.add_column(column, justify="right")
    table.add_column("killed / non-equivalent", justify="right")
    modules = sorted({o.mutant.point.module for o in outcomes})
    rows = [(m, Score.of([o for o in outcomes if o.mutant.point.module == m])) for m in modules]
    rows.append(("all", Score.of(outcomes)))
    for module, score in rows:
        table.add_row(
            module,
            str(score.mutants),
            str(score.killed),
            str(score.timeouts),
            str(score.survived),
            str(score.equivalent),
            str(score.errors),
            f"{score.killed + score.timeouts} / {score.scored} = {score.score:.1%}",
            style=("bold " if module == "all" else "")
            + ("green" if score.score >= 0.95 else "red"),
            end_section=module == modules[-1],
        )
    return table


def survivor_table(outcomes: Sequence[Outcome]) -> Table:
    table = Table(title="survivors and errors", title_justify="left", show_lines=True)
    for column in ("#", "where", "function", "mutation", "status"):
        table.add_column(column)
    for outcome in outcomes:
        if outcome.killed:
            continue
        mutant = outcome.mutant
        status = outcome.status
        if outcome.equivalent:
            status = f"equivalent: {EQUIVALENT[mutant.key]}"
        elif status == "error":
            status = f"error: {outcome.detail}"
        table.add_row(
            str(mutant.id),
            mutant.where,
            mutant.point.function,
            Text(f"{mutant.before}\n=> {mutant.after}"),
            Text(status),
            style="yellow" if outcome.equivalent else "red",
        )
    return table


def mutant_table(mutants: Sequence[Mutant]) -> Table:
    table = Table(title="mutants", title_justify="left")
    for column in ("#", "where", "function", "kind", "mutation"):
        table.add_column(column)
    for mutant in mutants:
        table.add_row(
            str(mutant.id),
            mutant.where,
            mutant.point.function,
            mutant.point.kind,
            Text(f"{mutant.before} => {mutant.after}"),
        )
    return table


# -- command line --------------------------------------------------------------------------------


def _ids(text: str) -> set[int]:
    try:
        return {int(part) for part in text.split(",") if part.strip()}
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated mutant ids: {text!r}") from None


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def chosen_target(name: str, args: argparse.Namespace) -> Target:
    """The target narrowed to ``--modules`` and ``--tests``."""
    target = TARGETS[name]
    modules = target.modules
    if args.modules:
        unknown = [m for m in args.modules if m not in modules]
        if unknown:
            raise SystemExit(f"{name} has no modules {unknown}; its modules: {list(modules)}")
        modules = tuple(m for m in modules if m in args.modules)
    tests = target.tests
    if args.tests:
        tests = tuple(str(Path(t).resolve().relative_to(ROOT)) for t in args.tests)
    return Target(target.package, modules, tests)


def mutate_target(
    console: Console,
    name: str,
    args: argparse.Namespace,
    progress_factory: Callable[[], Progress],
) -> tuple[list[Outcome], list[Mutant]]:
    """The outcome of each chosen mutant of target ``name``, and every mutant of its modules."""
    target = chosen_target(name, args)
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix=f"mutation-{name}-") as tmp:
        home = Path(tmp)
        with console.status(f"{name}: copying the repository ..."):
            what = snapshot(home / "snapshot", args.rev)
        population = enumerate_mutants(home / "snapshot" / target.package, target.modules)
        chosen = stratified_sample(population, args.sample, args.seed)
        if args.only:
            chosen = [m for m in population if m.id in args.only]
        functions = {(m.point.module, m.point.function) for m in population}
        digest = hashlib.sha256()
        for relative in target.modules:
            digest.update((home / "snapshot" / target.package / relative).read_bytes())
        console.print(
            f"[bold]{name}[/]: {len(population)} distinct mutants in {len(functions)} functions "
            f"of {len(target.modules)} modules ({what}; sources {digest.hexdigest()[:12]}); "
            f"{len(chosen)} chosen" + (f" (sample, seed {args.seed})" if args.sample else "")
        )
        if args.list:
            console.print(mutant_table(chosen))
            return [Outcome(m, "listed", 0.0) for m in chosen], population
        workers = min(args.workers, max(1, len(chosen)))
        sandboxes = [
            Sandbox(target, home / f"worker-{n}", home / "snapshot") for n in range(workers)
        ]
        for sandbox in sandboxes:
            where = sandbox.imported_from()
            if not where.startswith(str(sandbox.repo)):
                raise SystemExit(f"the package is imported from {where}, not from the copy")
        processes = Processes()
        files = sandboxes[0].test_files(target.tests)
        baseline = RunSettings(1800.0, args.nice, args.seed)
        junit = home / "baseline.xml"
        with console.status(f"{name}: the tests on the unmutated copy ..."):
            status, seconds, killer, tail = run_tests(
                sandboxes[0], files, baseline, processes, junit
            )
        if status != "survived":
            console.print(tail)
            raise SystemExit(f"the tests fail without any mutant ({killer or status})")
        files = fastest_first(junit, files)
        settings = RunSettings(max(60.0, args.timeout_factor * seconds), args.nice, args.seed)
        console.print(
            f"  unmutated tests: {seconds:.1f} s ({len(files)} files); timeout per mutant "
            f"{settings.timeout:.0f} s; {workers} workers",
            style="dim",
        )
        free: queue.Queue[Sandbox] = queue.Queue()
        for sandbox in sandboxes:
            free.put(sandbox)

        def run(mutant: Mutant) -> Outcome:
            if processes.stopping:
                raise KeyboardInterrupt
            sandbox = free.get()
            try:
                with sandbox.mutated(mutant):
                    status, seconds, killer, tail = run_tests(sandbox, files, settings, processes)
            finally:
                free.put(sandbox)
            detail = tail.splitlines()[-1] if status == "error" and tail else ""
            return Outcome(mutant, status, seconds, killer, detail)

        started = time.perf_counter()
        with progress_factory() as progress, ThreadPoolExecutor(workers) as pool:
            task = progress.add_task(name, total=len(chosen), survived=0)
            futures: list[Future[Outcome]] = [pool.submit(run, m) for m in chosen]
            try:
                for future in as_completed(futures):
                    outcome = future.result()
                    outcomes.append(outcome)
                    mutant = outcome.mutant
                    if outcome.status in {"survived", "error"}:
                        label = "equivalent" if outcome.equivalent else outcome.status
                        progress.console.print(
                            Text(
                                f"  #{mutant.id} {label}: {mutant.where} "
                                f"{mutant.point.function}: {mutant.before} => {mutant.after}",
                                style="dim" if outcome.equivalent else "yellow",
                            )
                        )
                    survived = sum(1 for o in outcomes if o.status == "survived")
                    progress.update(
                        task, advance=1, survived=survived, description=f"{name} {mutant.where}"
                    )
                    if not console.is_terminal and len(outcomes) % 25 == 0:  # a log: no bar
                        console.print(
                            f"  {len(outcomes)}/{len(chosen)} run, {survived} survived, "
                            f"{time.perf_counter() - started:.0f} s",
                            style="dim",
                        )
            except BaseException:
                for future in futures:
                    future.cancel()
                processes.stop()
                raise
    return sorted(outcomes, key=lambda o: o.mutant.id), population


def _as_json(outcome: Outcome) -> dict[str, object]:
    mutant = outcome.mutant
    return {
        "id": mutant.id,
        "where": mutant.where,
        "function": mutant.point.function,
        "kind": mutant.point.kind,
        "before": mutant.before,
        "after": mutant.after,
        "status": outcome.status,
        "equivalent": EQUIVALENT.get(mutant.key) if outcome.equivalent else None,
        "killer": outcome.killer,
        "seconds": round(outcome.seconds, 2),
    }


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--targets",
        type=_names,
        default=list(TARGETS),
        help=f"comma-separated, of {', '.join(TARGETS)} (default: all)",
    )
    parser.add_argument(
        "--modules",
        type=_names,
        default=None,
        help="comma-separated modules of the target to mutate (default: all of them)",
    )
    parser.add_argument(
        "--tests", nargs="+", default=None, help="test files to run instead of the target's own"
    )
    parser.add_argument(
        "--sample", type=int, default=0, help="run this many mutants, stratified (default: all)"
    )
    parser.add_argument("--seed", type=int, default=7, help="sampling and hypothesis seed")
    parser.add_argument("--list", action="store_true", help="print the mutants, run none")
    parser.add_argument(
        "--only", type=_ids, default=None, help="run only these mutant ids (from --list)"
    )
    parser.add_argument(
        "--rev", default=None, help="mutate this commit's tree instead of the working tree"
    )
    parser.add_argument(
        "--workers",
        type=int,
        choices=range(1, MAX_WORKERS + 1),
        default=MAX_WORKERS,
        help=f"test runs at once (default and most: {MAX_WORKERS})",
    )
    parser.add_argument(
        "--timeout-factor",
        type=float,
        default=4.0,
        help="a mutant times out after this many times the unmutated run (at least 60 s)",
    )
    parser.add_argument("--nice", type=int, default=10, help="niceness of the test runs")
    parser.add_argument("--json", type=Path, default=None, help="also write the outcomes here")
    args = parser.parse_args(argv)
    unknown = [n for n in args.targets if n not in TARGETS]
    if unknown:
        parser.error(f"unknown targets {unknown}; expected some of {list(TARGETS)}")
    if (args.tests or args.modules) and len(args.targets) > 1:
        parser.error("--modules and --tests apply to one target at a time")
    # `kill` ends the run as Ctrl-C does: the test runs' process groups are killed and the
    # temporary copies removed (a background job started by a shell ignores SIGINT)
    signal.signal(signal.SIGTERM, _terminate)

    console = Console(width=max(shutil.get_terminal_size((160, 40)).columns, 160))
    console.print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} cpus, load average "
        f"{os.getloadavg()[0]:.2f}; nice {args.nice}",
        style="dim",
    )

    def progress() -> Progress:
        return Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("survived {task.fields[survived]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
        )

    report: dict[str, object] = {}
    for name in args.targets:
        started = time.perf_counter()
        outcomes, population = mutate_target(console, name, args, progress)
        report[name] = [_as_json(o) for o in outcomes]
        keys = {m.key for m in population}
        modules = {m.point.module for m in population}
        for key in EQUIVALENT:
            if key.split("::")[0] in modules and key not in keys:
                console.print(f"listed as equivalent, but no such mutant: {key}", style="red")
        if args.list or not outcomes:
            continue
        if any(not o.killed for o in outcomes):
            console.print(survivor_table(outcomes))
        console.print(summary_table(name, outcomes, len(population)))
        for outcome in outcomes:
            if outcome.killed and outcome.mutant.key in EQUIVALENT:
                console.print(f"listed as equivalent but killed: {outcome.mutant.key}", style="red")
        console.print(f"{name}: {time.perf_counter() - started:.0f} s", style="dim")
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
