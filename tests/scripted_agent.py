"""The scripted "model" behind the CLI tests: it reads its prompt as a model would and answers
with the tool the CLI offered in that prompt, using that tool's own argument schema.

The session it plays: one shell command; then two shell commands in ONE reply (parallel tool
calls); then a final text answer. Every command writes a marker file (so the test can see the
CLI really ran it) and prints a unique line (so the test can see each result came back as the
answer to its own call).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from protocol_adapters.testing import ScriptedReply
from protocol_adapters.tokenizer import Vocabulary

ASSISTANT_HEADER = "<|im_start|>assistant\n"
_TOOLS_BLOCK = re.compile(r"<tools>\n(.*?)\n</tools>", re.DOTALL)
_COMMAND_ARGUMENTS = ("command", "cmd")
FINAL_ANSWER = "All three marker files are written."
FIRST_REASONING = "The task needs three files; start with the first."


@dataclass(frozen=True, slots=True)
class Command:
    marker: str
    output: str

    @property
    def line(self) -> str:
        return f"echo {self.output} > {self.marker} && echo {self.output}"


STEPS: tuple[tuple[Command, ...], ...] = (
    (Command("marker1", "first-command-ran"),),
    (Command("marker2", "parallel-a-ran"), Command("marker3", "parallel-b-ran")),
)
ALL_COMMANDS = tuple(command for step in STEPS for command in step)


@dataclass(frozen=True, slots=True)
class ShellTool:
    """A function tool that runs one shell command line, held in the string ``argument``."""

    name: str
    argument: str

    def call(self, command: Command) -> tuple[str, dict[str, object]]:
        return self.name, {self.argument: command.line}


def offered_tools(prompt_text: str) -> list[Mapping[str, object]]:
    """The function specs the Qwen3-style template wrote into the system turn, one per line."""
    block = _TOOLS_BLOCK.search(prompt_text)
    if block is None:
        return []
    specs: list[Mapping[str, object]] = []
    for line in block.group(1).split("\n"):
        spec = json.loads(line)
        function = spec.get("function", spec)
        if isinstance(function, dict):
            specs.append(function)
    return specs


def find_shell_tool(tools: Sequence[Mapping[str, object]]) -> ShellTool | None:
    """The tool whose only required argument is a command-line string (``command``/``cmd``).

    A call then satisfies its schema with that one argument, whatever the CLI named the tool.
    """
    for tool in tools:
        schema = tool.get("parameters")
        name = tool.get("name")
        if not isinstance(schema, dict) or not isinstance(name, str):
            continue
        properties = schema.get("properties")
        required = schema.get("required")
        if not isinstance(properties, dict) or not isinstance(required, list):
            continue
        if len(required) == 1 and required[0] in _COMMAND_ARGUMENTS:
            spec = properties.get(required[0])
            if isinstance(spec, dict) and spec.get("type") == "string":
                return ShellTool(name, required[0])
    return None


@dataclass(slots=True)
class ShellSessionAgent:
    """The engine double's script (a callable of each request's prompt ids).

    ``replies`` keeps every (prompt ids, reply) so a test can recompute what the double
    generated; ``problems`` collects what a real model could not have worked with (no shell
    tool offered, more requests than the session has steps); the test asserts it is empty.
    """

    vocabulary: Vocabulary
    replies: list[tuple[tuple[int, ...], ScriptedReply]] = field(default_factory=list)
    shell_tools: list[ShellTool] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def __call__(self, input_ids: Sequence[int]) -> ScriptedReply:
        reply = self._reply(self.vocabulary.decode(list(input_ids)))
        self.replies.append((tuple(input_ids), reply))
        return reply

    def _reply(self, prompt: str) -> ScriptedReply:
        step = prompt.count(ASSISTANT_HEADER) - 1  # earlier replies; the last header is ours
        if step == len(STEPS):
            return ScriptedReply(text=FINAL_ANSWER)
        if step > len(STEPS):
            self.problems.append(f"request with {step} earlier replies: the session was over")
            return ScriptedReply(text=FINAL_ANSWER)
        tool = find_shell_tool(offered_tools(prompt))
        if tool is None:
            self.problems.append(f"step {step}: no shell tool among the offered tools")
            return ScriptedReply(text="I have no shell tool.")
        self.shell_tools.append(tool)
        calls = [tool.call(command) for command in STEPS[step]]
        if step == 0:
            return ScriptedReply(
                reasoning=FIRST_REASONING,
                text="Creating the first marker.",
                tool_calls=calls,
            )
        return ScriptedReply(tool_calls=calls)
