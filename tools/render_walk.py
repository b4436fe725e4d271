"""How far a reader travels to follow one turn's prompt through the renderer.

    uv run tools/render_walk.py

Structure, measured: a newcomer reading how a turn's prompt is made opens the file of each
function the turn runs, in the order it runs them. This traces one bridged turn of a coding
agent (a tool result after a reply with a call, the real Qwen3 vocabulary and template, the
sampled check off and on) through ``Renderer.render`` and prints, per turn:

- **files**: distinct protocol-adapters source files the turn's code runs in;
- **opened**: distinct functions the reader opens in another file than their caller's (a
  function called twice is read once);
- **calls across**: calls from a function in one of those files into a function in another;
- **calls back**: those of them into a file the walk had already left (what makes code hard to
  read: the reader keeps several files open and jumps back and forth between them);
- **hops / returns**: the same counted on every move, returns from a call included (the reader
  also goes back to the caller's file to read on);
- the files themselves, in first-visit order.

Frames outside the package (the tree, the tokenizer, jinja, the standard library) are not
counted: the walk stays in whichever package file called them.
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from rich.console import Console
from rich.table import Table

import protocol_adapters
from protocol_adapters import (
    QwenTokenizerConfig,
    Renderer,
    RendererConfig,
    load_qwen3_vocabulary,
    qwen3_template,
)
from trajectory_tree import (
    Completion,
    FinishReason,
    Message,
    Prompt,
    SessionTree,
    Text,
    ToolCall,
    ToolSpec,
)

PACKAGE = Path(protocol_adapters.__file__).parent
TOOLS = (
    ToolSpec(
        "bash",
        "Run a shell command.",
        json.dumps({"type": "object", "properties": {"command": {"type": "string"}}}),
    ),
)


@dataclass(frozen=True)
class Walk:
    files: list[str]
    """In first-visit order, relative to the package."""
    opened: int
    calls_across: int
    calls_back: int
    hops: int
    returns: int


def _package_file(frame: FrameType | None) -> str | None:
    """The package file of the innermost package frame at or above ``frame``."""
    while frame is not None:
        path = Path(frame.f_code.co_filename)
        if path.is_relative_to(PACKAGE):
            return str(path.relative_to(PACKAGE))
        frame = frame.f_back
    return None


def trace(renderer: Renderer, tree: SessionTree, prompt: Prompt) -> Walk:
    """The walk of ``renderer.render`` over ``prompt``'s route (routing itself not traced)."""
    route = tree.route(prompt)
    stays: list[str] = []
    calls: list[str] = []
    opened: set[tuple[str, int]] = set()

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            here = _package_file(frame)
            if here is not None and (not calls or calls[-1] != here):
                calls.append(here)
            if here is not None and here != _package_file(frame.f_back):
                opened.add((here, frame.f_code.co_firstlineno))
        elif event == "return":
            here = _package_file(frame.f_back)
        else:
            return
        if here is not None and (not stays or stays[-1] != here):
            stays.append(here)

    sys.setprofile(profile)
    try:
        renderer.render(route)
    finally:
        sys.setprofile(None)
    files = list(dict.fromkeys(stays))
    return Walk(files, len(opened), len(calls) - 1, _back(calls), len(stays) - 1, _back(stays))


def _back(sequence: list[str]) -> int:
    """Entries naming a file that appeared before (consecutive entries always differ)."""
    return sum(1 for i, file in enumerate(sequence) if file in sequence[:i])


def session(renderer: Renderer, vocabulary: object) -> tuple[SessionTree, Prompt]:
    """Two recorded turns of an agent; returns the tree and the third turn's request."""
    from protocol_adapters import Vocabulary

    assert isinstance(vocabulary, Vocabulary)
    tree = SessionTree()
    messages = [Message.text("system", "You fix bugs."), Message.text("user", "The test fails.")]
    for index, command in enumerate(("cat test_x.py", "ls")):
        prompt = Prompt(tuple(messages), TOOLS)
        route = tree.route(prompt)
        rendered = renderer.render(route)
        arguments = json.dumps({"command": command})
        output = (
            f'<tool_call>\n{{"name": "bash", "arguments": {arguments}}}\n</tool_call><|im_end|>'
        )
        ids = vocabulary.encode(output)
        completion = Completion(ids, [-0.5] * len(ids), FinishReason.STOP)
        reply = Message("assistant", (ToolCall(f"call_{index}", "bash", arguments),))
        tree.record(route, rendered.prompt, completion, reply)
        messages += [reply, Message("tool", (Text("x.py test_x.py\n" * 40),), f"call_{index}")]
    return tree, Prompt(tuple(messages), TOOLS)


def main() -> None:
    console = Console()
    with tempfile.TemporaryDirectory() as cache:
        vocabulary = load_qwen3_vocabulary(QwenTokenizerConfig(cache_dir=Path(cache)))
    table = Table(title="One bridged turn through Renderer.render")
    for column in ("turn", "files", "opened", "calls across", "calls back", "hops", "returns"):
        table.add_column(column)
    visited: dict[str, list[str]] = {}
    for label, rate in (("sampled check off", 0.0), ("sampled check on", 1.0)):
        config = RendererConfig(check_sample_rate=rate, seed=0)
        renderer = Renderer(vocabulary, qwen3_template(), config)
        tree, prompt = session(renderer, vocabulary)
        walk = trace(renderer, tree, prompt)
        figures = (
            len(walk.files),
            walk.opened,
            walk.calls_across,
            walk.calls_back,
            walk.hops,
            walk.returns,
        )
        table.add_row(label, *map(str, figures))
        visited[label] = walk.files
    console.print(table)
    for label, files in visited.items():
        console.print(f"{label}: {' -> '.join(files)}")


if __name__ == "__main__":
    main()
