"""The scripted "model" behind the CLI tests: it reads its prompt as a model would and answers
with the tool the CLI offered in that prompt, using that tool's own argument schema.

The session it plays: one shell command; then two shell commands in ONE reply (parallel tool
calls); then a final text answer. Every command writes a marker file (so the test can see the
CLI really ran it) and prints a unique line (so the test can see each result came back as the
answer to its own call).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from protocol_adapters.testing import ScriptedReply
from protocol_adapters.testing.prompt_tools import ShellTool

from .reading import Prompt, ScriptedModel

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


@dataclass(slots=True)
class ShellSessionAgent(ScriptedModel):
    """Plays the session above; ``shell_tools`` records the shell tool each step found."""

    shell_tools: list[ShellTool] = field(default_factory=list)

    def answer(self, prompt: Prompt) -> ScriptedReply:
        step = prompt.replies_so_far
        if step == len(STEPS):
            return ScriptedReply(text=FINAL_ANSWER)
        if step > len(STEPS):
            return self.problem(
                f"request with {step} earlier replies: the session was over", FINAL_ANSWER
            )
        tool = prompt.shell_tool
        if tool is None:
            return self.problem(f"step {step}: no shell tool among the offered tools")
        self.shell_tools.append(tool)
        calls = [tool.call(command.line) for command in STEPS[step]]
        if step == 0:
            return ScriptedReply(
                reasoning=FIRST_REASONING,
                text="Creating the first marker.",
                tool_calls=calls,
            )
        return ScriptedReply(tool_calls=calls)
