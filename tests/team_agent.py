"""The scripted "model" of the sub-agent shape tests: a main agent that runs one command of its
own, then hands parts of the job to Claude Code sub-agents of every shape (fresh, twin,
identical twin, fork, nested, one that has to compact), and the sub-agents that do the parts.

Every request is read the way a model reads it. An agent knows who it is from the last
``SUBTASK <name>:`` line the user side of its conversation holds outside tool results: a fresh
sub-agent's first user message is its prompt, a fork's directive comes after the parent's
history it copied, a compacted sub-agent's summary repeats it. A conversation without such a
line is the main agent's. Each part's work is known to the model by the part's name:

- ``run``: one shell command that writes ``<name>-marker`` and prints ``<name>-ran``; then a
  report of the line it printed.
- ``fresh-dir``: one shell command that makes a new directory (``mktemp``) holding a marker and
  prints its name; then a report of it. Identical twins do this: their first requests are the
  same bytes, so they get the same reply, and only the directory the command made tells them
  apart afterwards.
- ``spawn``: one ``Agent`` call (in the foreground) handing the part ``child`` to a sub-agent of
  its own; then the report, once the child's report came back.
- ``steps``: ``steps`` report steps, each printing ``lines`` lines of digits (several thousand
  tokens), one per reply, so the sub-agent's own context fills up and the CLI compacts it; the
  summary it writes carries the directive and the steps done.

The main agent runs its own command first (so a fork copies a history that already holds a
reply the engine generated), then starts every part in one reply, and gives its final answer
once a report of every part is in its prompt (a foreground sub-agent's as the ``Agent`` call's
tool result, a background one's as a later notification); until then it says it is waiting.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from protocol_adapters.testing import ScriptedReply

from .compacting_agent import is_compaction_request
from .reading import ChatMessage, Prompt, ScriptedModel

AGENT_TOOL = "Agent"
TASK = (
    "Run the preparation command, then hand each part of this job to its own sub-agent and "
    "wait for their reports, then say that you are done."
)
PREPARED = "main-prepared"
_DIRECTIVE = re.compile(r"\bSUBTASK (\w+):")
_REPORT = re.compile(r"REPORT (\w+): ([\w./-]+)")
_TOOL_RESPONSE = re.compile(r"<tool_response>.*?</tool_response>", re.DOTALL)
_STEP_DONE = re.compile(r"STEP-(\d+)-DONE")

Work = Literal["run", "fresh-dir", "spawn", "steps"]


@dataclass(frozen=True, slots=True)
class Part:
    """One part of the job: who does it (``name``), what it is (``work``; ``child`` the part a
    ``spawn`` hands on, ``steps`` and ``lines`` those of ``steps``) and how it is handed over:
    the ``Agent`` call's ``description`` (``"Run part <name>"`` unless given),
    ``subagent_type`` and ``run_in_background`` (each left out of the call when ``None``)."""

    name: str
    work: Work = "run"
    description: str | None = None
    subagent_type: str | None = None
    background: bool | None = False
    child: Part | None = None
    steps: int = 0
    lines: int = 0

    def agent_input(self) -> dict[str, object]:
        call: dict[str, object] = {
            "description": self.description or f"Run part {self.name}",
            "prompt": directive(self),
        }
        if self.subagent_type is not None:
            call["subagent_type"] = self.subagent_type
        if self.background is not None:
            call["run_in_background"] = self.background
        return call

    def all_parts(self) -> list[Part]:
        """This part and every part under it."""
        return [self, *(self.child.all_parts() if self.child is not None else [])]


def directive(part: Part) -> str:
    what = {
        "run": "run one shell command, then report the line it printed.",
        "fresh-dir": "make a fresh directory with one shell command, then report its name.",
        "spawn": "hand one part to a sub-agent of your own, then report when it reported.",
        "steps": f"run the {part.steps} report steps in order, one per reply, then report.",
    }[part.work]
    return f"SUBTASK {part.name}: {what}"


def marker(name: str) -> str:
    return f"{name}-marker"


def output(name: str) -> str:
    return f"{name}-ran"


def steps_log(name: str) -> str:
    return f"{name}-steps.log"


def final_answer(reports: Mapping[str, list[str]]) -> str:
    lines = [f"REPORT {name}: {value}" for name in sorted(reports) for value in reports[name]]
    return "Done. " + " ".join(lines)


def user_side(message: ChatMessage) -> str:
    """What a user message says outside the tool results it carries."""
    return _TOOL_RESPONSE.sub("", message.text) if message.role == "user" else ""


def whose(prompt: Prompt) -> tuple[str, int]:
    """The name of the part this conversation works on (``"main"`` for none) and the index of
    the message that named it (-1 for the main agent)."""
    for index in range(len(prompt.messages) - 1, -1, -1):
        found = _DIRECTIVE.findall(user_side(prompt.messages[index]))
        if found:
            return found[-1], index
    return "main", -1


@dataclass(slots=True)
class TeamAgent(ScriptedModel):
    """``parts``: started by the main agent, all in one reply. ``system_prompts`` records the
    system prompt each role saw (``"main"`` or a part's name); ``summaries`` the parts that
    wrote a compaction summary, one entry per summary."""

    parts: tuple[Part, ...] = ()
    system_prompts: dict[str, set[str]] = field(default_factory=dict)
    summaries: list[str] = field(default_factory=list)

    def part(self, name: str) -> Part | None:
        return next((p for top in self.parts for p in top.all_parts() if p.name == name), None)

    @property
    def backgrounded(self) -> bool:
        """Whether some part runs in the background (a fork does unless told otherwise)."""
        return any(p.background is not False for p in self.parts)

    def answer(self, prompt: Prompt) -> ScriptedReply:
        role, named_at = whose(prompt)
        system = prompt.first("system")
        self.system_prompts.setdefault(role, set()).add(system.text if system else "")
        if role == "main":
            return self._main(prompt)
        part = self.part(role)
        if part is None:
            return self.problem(f"a sub-agent for {role!r}, which was never delegated")
        if is_compaction_request(prompt):
            return self._summary(part, prompt)
        step = sum(1 for m in prompt.messages[named_at + 1 :] if m.role == "assistant")
        if part.work == "steps":
            return self._steps(part, prompt)
        if step == 0:
            return self._start(part, prompt)
        if step == 1:
            return self._report(part, prompt)
        return self.problem(f"sub-agent {part.name}: a request after {step} replies")

    # -- the main agent ------------------------------------------------------------------------

    def expected_reports(self) -> Counter[str]:
        return Counter(part.name for part in self.parts)

    def reports(self, text: str) -> dict[str, list[str]]:
        """Distinct reported values by part, in order of first appearance."""
        found: dict[str, list[str]] = {}
        for name, value in _REPORT.findall(text):
            values = found.setdefault(name, [])
            if value not in values:
                values.append(value)
        return found

    def _main(self, prompt: Prompt) -> ScriptedReply:
        step = prompt.replies_so_far
        if step == 0:
            tool = prompt.shell_tool
            if tool is None:
                return self.problem("the main agent was offered no shell tool")
            return ScriptedReply(
                text="Preparing first.",
                tool_calls=[tool.call(f"echo {PREPARED} > main-marker && echo {PREPARED}")],
            )
        if step == 1:
            if prompt.tool(AGENT_TOOL) is None:
                return self.problem(f"the main agent was offered no {AGENT_TOOL} tool")
            calls = [(AGENT_TOOL, part.agent_input()) for part in self.parts]
            return ScriptedReply(text="Each part goes to its own sub-agent.", tool_calls=calls)
        reports = self.reports(prompt.text)
        expected = self.expected_reports()
        if all(len(reports.get(name, ())) >= count for name, count in expected.items()):
            return ScriptedReply(text=final_answer({n: reports[n] for n in expected}))
        if not self.backgrounded:
            return self.problem(f"a foreground sub-agent's report is missing: {reports}")
        return ScriptedReply(text="Waiting for the sub-agents' reports.")

    # -- the sub-agents ------------------------------------------------------------------------

    def _start(self, part: Part, prompt: Prompt) -> ScriptedReply:
        if part.work == "spawn":
            child = part.child
            if child is None:
                return self.problem(f"sub-agent {part.name}: nothing to hand over")
            if prompt.tool(AGENT_TOOL) is None:
                return self.problem(f"sub-agent {part.name} was offered no {AGENT_TOOL} tool")
            return ScriptedReply(
                text="Handing it over.", tool_calls=[(AGENT_TOOL, child.agent_input())]
            )
        tool = prompt.shell_tool
        if tool is None:
            return self.problem(f"sub-agent {part.name}: no shell tool among the offered tools")
        name = part.name
        if part.work == "fresh-dir":
            line = f'd=$(mktemp -d {name}-XXXXXX) && echo {output(name)} > "$d/marker" && echo "$d"'
        else:
            line = f"echo {output(name)} > {marker(name)} && echo {output(name)}"
        return ScriptedReply(text="Running it.", tool_calls=[tool.call(line)])

    def _report(self, part: Part, prompt: Prompt) -> ScriptedReply:
        results = prompt.tool_results
        if not results:
            return self.problem(f"sub-agent {part.name}: no tool result to report")
        if part.work == "spawn":
            assert part.child is not None
            child = self.reports(results[-1]).get(part.child.name, [])
            if child != [output(part.child.name)]:
                return self.problem(f"sub-agent {part.name}: its child reported {child}")
            return ScriptedReply(text=f"REPORT {part.name}: {output(part.name)}")
        printed = results[-1].strip().splitlines()[-1]
        return ScriptedReply(text=f"REPORT {part.name}: {printed}")

    def _steps(self, part: Part, prompt: Prompt) -> ScriptedReply:
        done = {int(k) for k in _STEP_DONE.findall(prompt.text)}
        pending = [k for k in range(1, part.steps + 1) if k not in done]
        if not pending:
            return ScriptedReply(text=f"REPORT {part.name}: {output(part.name)}")
        tool = prompt.shell_tool
        if tool is None:
            return self.problem(f"sub-agent {part.name}: no shell tool among the offered tools")
        step = pending[0]
        first = step * 100_000  # every line is 7 bytes: 6 digits and a newline
        line = (
            f"echo {step} >> {steps_log(part.name)} && seq {first} {first + part.lines - 1} && "
            f"printf 'STEP-%s-DONE\\n' {step}"  # the marker never appears in the call itself
        )
        return ScriptedReply(tool_calls=[tool.call(line)])

    def _summary(self, part: Part, prompt: Prompt) -> ScriptedReply:
        self.summaries.append(part.name)
        done = sorted({int(k) for k in _STEP_DONE.findall(prompt.text)})
        completed = " ".join(f"STEP-{k}-DONE" for k in done) or "nothing yet"
        return ScriptedReply(
            text=(
                "<analysis>\nMy directive and the report steps finished so far.\n</analysis>\n\n"
                f"<summary>\n{directive(part)}\nCompleted: {completed}\n</summary>"
            )
        )
