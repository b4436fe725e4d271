"""What a scripted policy reads from its prompt, as a model would: the tools on offer.

A prompt rendered with the Qwen3-style template lists the function specs in a `<tools>` block of
the system turn, one JSON object per line. A policy that answers with a shell command picks the
tool whose only required argument is a command-line string, whatever the CLI named it (Claude
Code's `Bash` takes `command`, Codex's `exec_command` takes `cmd`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

ASSISTANT_HEADER = "<|im_start|>assistant\n"
_TOOLS_BLOCK = re.compile(r"<tools>\n(.*?)\n</tools>", re.DOTALL)
_COMMAND_ARGUMENTS = ("command", "cmd")


@dataclass(frozen=True, slots=True)
class ShellTool:
    """A function tool that runs one shell command line, held in the string `argument`."""

    name: str
    argument: str

    def call(self, command_line: str) -> tuple[str, dict[str, object]]:
        return self.name, {self.argument: command_line}


def offered_tools(prompt_text: str) -> list[Mapping[str, object]]:
    """The function specs the template wrote into the system turn, in order."""
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
    """The tool whose only required argument is a command-line string, if any."""
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


def replies_so_far(prompt_text: str) -> int:
    """How many assistant replies the conversation already holds (the last header is ours)."""
    return prompt_text.count(ASSISTANT_HEADER) - 1
