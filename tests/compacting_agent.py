"""The scripted "model" of the compaction tests: a long task of report steps whose shell outputs
are several thousand tokens each, so the real CLI has to compact its history to finish.

It reads each prompt as a model would. When the CLI asks for a summary (Claude Code's "Respond
with TEXT ONLY ... <summary>" instruction, Codex's "CONTEXT CHECKPOINT COMPACTION"), it writes
one from what the prompt holds: the task statement and the steps whose output it can see.
Otherwise it takes the number of steps from the task statement (in the prompt, or in the summary
that replaced it), sees which steps are done from their outputs (or the summary), and runs the
next one with the offered shell tool, or says it is done. A step appends its number to
``steps.log`` (so the test sees each ran once, in order), prints ``lines`` lines of digits
(one token per digit with Qwen's tokenizer) and ends with its ``STEP-<k>-DONE`` line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from protocol_adapters.testing import ScriptedReply

from .reading import Prompt, ScriptedModel

STEP_LOG = "steps.log"
_TASK = re.compile(r"Run the (\d+) report steps[^\n<]*")
_DONE = re.compile(r"STEP-(\d+)-DONE")
COMPACTION_INSTRUCTIONS = ("CRITICAL: Respond with TEXT ONLY", "CONTEXT CHECKPOINT COMPACTION")


def task(steps: int) -> str:
    return (
        f"Run the {steps} report steps in order, one per reply, with the shell tool; each "
        "prints a long report. Then say that you are done."
    )


def final_answer(steps: int) -> str:
    return f"All {steps} report steps are done."


def is_compaction_request(prompt: Prompt) -> bool:
    last = prompt.last("user")
    return last is not None and any(i in last.text for i in COMPACTION_INSTRUCTIONS)


@dataclass(frozen=True, slots=True)
class SummaryRequest:
    """What one compaction request showed the model: the task statement (if it was still
    there) and the steps whose output it could see."""

    task: str | None
    steps_done: tuple[int, ...]


@dataclass(slots=True)
class StepsAgent(ScriptedModel):
    lines: int = 1000
    summary_requests: list[SummaryRequest] = field(default_factory=list)

    def answer(self, prompt: Prompt) -> ScriptedReply:
        statement = _TASK.search(prompt.text)
        done = sorted({int(k) for k in _DONE.findall(prompt.text)})
        if is_compaction_request(prompt):
            return self._summary(statement[0] if statement else None, done)
        if statement is None:
            return self.problem("the task statement is gone from the prompt")
        steps = int(statement[1])
        pending = [k for k in range(1, steps + 1) if k not in done]
        if not pending:
            return ScriptedReply(text=final_answer(steps))
        tool = prompt.shell_tool
        if tool is None:
            return self.problem("no shell tool among the offered tools")
        step = pending[0]
        first = step * 100_000  # every line is 7 bytes: 6 digits and a newline
        line = (
            f"echo {step} >> {STEP_LOG} && seq {first} {first + self.lines - 1} && "
            f"printf 'STEP-%s-DONE\\n' {step}"  # the marker never appears in the call itself
        )
        return ScriptedReply(tool_calls=[tool.call(line)])

    def _summary(self, statement: str | None, done: list[int]) -> ScriptedReply:
        self.summary_requests.append(SummaryRequest(statement, tuple(done)))
        if statement is None:
            self.problems.append("a compaction request without the task statement")
        completed = " ".join(f"STEP-{k}-DONE" for k in done) or "nothing yet"
        return ScriptedReply(
            text=(
                "<analysis>\nThe task and the report steps finished so far.\n</analysis>\n\n"
                f"<summary>\nTask: {statement}\nCompleted: {completed}\n</summary>"
            )
        )
