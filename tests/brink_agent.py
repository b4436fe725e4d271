"""Scripted "models" that land their history at the brink of the engine's context, so that the
CLI's request for a summary is itself too long and is resent without its oldest messages, the
task statement among them.

Claude Code (2.1.330), read from its debug log ("Reactive compact: ..."): refused a request as too
long, it groups the history into rounds (the task, then each reply with its tool results) and
first asks for a summary of the opening rounds alone, keeping the later ones verbatim; that
request ends with a long instruction ("CRITICAL: Respond with TEXT ONLY...", some 1,300 tokens).
Refused too, it keeps more rounds; once only the task would be left to summarize, it asks for a
summary of everything but the opening round (the task), behind a placeholder message "[earlier
conversation truncated for compaction retry]". :class:`BrinkAgent` lands the history ``margin``
tokens under the limit with its first step (less than the instruction: the request for a summary
of the task and that step is too long) and pushes it over with the next.

Codex compacts when a reply's reported usage reaches its threshold, after that reply's tool
outputs are added; its compaction request refused as too long, it resends it without its oldest
item, one at a time: the skills and environment messages, then the task, then the oldest call
with its output (0.169.0 measured: four resends, the fourth accepted).
:class:`ParallelBrinkAgent` runs enough steps at once (Codex keeps at most a capped output of
each) to bring the history past the threshold, then enough to bring the compaction request
``overshoot`` tokens over the limit: more than the messages up to the task, less than one capped
output.

Each policy sees its prompt's length in tokens and measures what a step adds once it has run
one. They read each prompt as a model would. A step appends its number to ``steps.log`` (so the
test sees each ran once), prints its lines of digits (seven tokens a line with Qwen's tokenizer)
and ends with ``STEP-<k>-OF-<n>-DONE``: a summary written without the task statement still says
how far the task went and how long it is. A summary lists the steps whose output it can see; the
conversation that goes on from it takes every step up to the highest one it sees as done.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from protocol_adapters.testing import ScriptedReply
from protocol_adapters.testing.prompt_tools import ShellTool

from .compacting_agent import STEP_LOG, final_answer, is_compaction_request
from .reading import Prompt, ScriptedModel

__all__ = [
    "STEP_LOG",
    "BrinkAgent",
    "ParallelBrinkAgent",
    "Seen",
    "final_answer",
    "holds_task",
    "task",
]

_TASK = re.compile(r"Run the (\d+) report steps[^\n<]*")
_DONE = re.compile(r"STEP-(\d+)-OF-(\d+)-DONE")
_COMPLETED = "Completed: "
"""How a summary these models write lists the steps done: seeing it, the history was compacted."""
TOKENS_PER_LINE = 7
"""``seq`` from ``k * 100000``: six digits and a newline, one token each with Qwen's tokenizer."""


def task(steps: int) -> str:
    return (
        f"Run the {steps} report steps with the shell tool, in order, several at once where you "
        "can; each prints a long report. Then say that you are done."
    )


def holds_task(prompt: Prompt) -> bool:
    """Whether the task statement is in the prompt."""
    return _TASK.search(prompt.text) is not None


@dataclass(frozen=True, slots=True)
class Seen:
    """One request as the model saw it: its length in tokens, whether it asked for a summary,
    whether the task statement was in it, the steps whose output it held, and the lines of each
    step it then ran."""

    length: int
    summary: bool
    task: bool
    steps_done: tuple[int, ...]
    ran: tuple[int, ...] = ()


@dataclass(slots=True)
class BrinkAgent(ScriptedModel):
    """One step a reply: the first lands the history ``margin`` tokens under ``limit``, the
    next pushes it over, those after a compaction are ``small``."""

    limit: int = 0
    """The most prompt tokens the adapter accepts (``Session.max_prompt_tokens``)."""
    margin: int = 400
    """How far under the limit the first step lands the history."""
    besides: int = 100
    """What the first step is assumed to add besides its lines (its call, the result's wrapping:
    about 85 tokens measured; an error of tens of tokens still lands it well within the
    instruction), before it could be measured."""
    small: int = 60
    """The lines of a step after a compaction, and how far past the limit the push goes."""
    most: int = 4000
    """The most lines a step prints (Claude Code cuts a shell output past 30,000 characters)."""
    seen: list[Seen] = field(default_factory=list)
    _length: int = 0
    _ran: list[tuple[int, list[int]]] = field(default_factory=list)
    """Each reply with steps before a compaction: the length of its prompt, its steps' lines."""

    def __call__(self, input_ids: Sequence[int]) -> ScriptedReply:
        self._length = len(input_ids)
        return ScriptedModel.__call__(self, input_ids)

    def answer(self, prompt: Prompt) -> ScriptedReply:
        statement = _TASK.search(prompt.text)
        markers = sorted({(int(k), int(n)) for k, n in _DONE.findall(prompt.text)})
        done = tuple(k for k, _ in markers)
        summary = is_compaction_request(prompt)
        ran: list[int] = []
        try:
            if summary:
                return _summary(statement[0] if statement else None, markers)
            steps = int(statement[1]) if statement else max((n for _, n in markers), default=0)
            if not steps:
                return self.problem("neither the task statement nor a step's output is in view")
            pending = list(range(max(done, default=0) + 1, steps + 1))
            if not pending:
                return ScriptedReply(text=final_answer(steps))
            tool = prompt.shell_tool
            if tool is None:
                return self.problem("no shell tool among the offered tools")
            ran = self._plan(len(pending), compacted=_COMPLETED in prompt.text)
            calls = [
                _step(tool, step, lines, steps) for step, lines in zip(pending, ran, strict=False)
            ]
            return ScriptedReply(tool_calls=calls)
        finally:
            self.seen.append(Seen(self._length, summary, statement is not None, done, tuple(ran)))

    def _plan(self, pending: int, *, compacted: bool) -> list[int]:
        """The lines of each step to run now, at most ``pending`` of them."""
        if compacted:
            return [self.small]
        if not self._ran:
            target = self.limit - self.margin - self._length - self.besides
            lines = min(self.most, max(self.small, target // TOKENS_PER_LINE))
        else:
            room = self.limit - self._length - self._measured()  # for this step's lines
            lines = min(self.most, max(0, room) // TOKENS_PER_LINE + self.small)
        self._ran.append((self._length, [lines]))
        return [lines]

    def _measured(self) -> int:
        """What the last reply's steps added besides their lines, per step."""
        length, lines = self._ran[-1]
        return (self._length - length - TOKENS_PER_LINE * sum(lines)) // len(lines)


@dataclass(slots=True)
class ParallelBrinkAgent(BrinkAgent):
    """Several steps a reply, each printing more than Codex keeps (``cap`` tokens at most, one
    a byte): the first reply brings the history past ``compact_at``, the next brings the
    compaction request ``overshoot`` tokens over the limit; after a compaction, every step left
    at once, each ``small``."""

    compact_at: int = 0
    """Codex's ``model_auto_compact_token_limit``."""
    cap: int = 0
    """The most tokens Codex keeps of one output (its ``tool_output_token_limit`` in bytes)."""
    overshoot: int = 2000

    def _plan(self, pending: int, *, compacted: bool) -> list[int]:
        if compacted:
            return [self.small] * pending
        lines = self.cap // TOKENS_PER_LINE + self.small  # always cut to the cap
        if not self._ran:
            count = math.ceil((self.compact_at - self._length) / self.cap)
        else:
            length, before = self._ran[-1]
            per_step = (self._length - length) // len(before)  # each output cut to the cap
            count = math.ceil((self.limit + self.overshoot - self._length) / per_step)
        count = max(1, min(count, pending))
        self._ran.append((self._length, [lines] * count))
        return [lines] * count


def _step(tool: ShellTool, step: int, lines: int, steps: int) -> tuple[str, dict[str, object]]:
    first = step * 100_000
    return tool.call(
        f"echo {step} >> {STEP_LOG} && seq {first} {first + lines - 1} && "
        f"printf 'STEP-%s-OF-%s-DONE\\n' {step} {steps}"  # the marker never in the call itself
    )


def _summary(statement: str | None, markers: list[tuple[int, int]]) -> ScriptedReply:
    completed = " ".join(f"STEP-{k}-OF-{n}-DONE" for k, n in markers) or "nothing yet"
    return ScriptedReply(
        text=(
            "<analysis>\nThe task and the report steps finished so far.\n</analysis>\n\n"
            f"<summary>\nTask: {statement or 'not in view'}\n{_COMPLETED}{completed}\n</summary>"
        )
    )
