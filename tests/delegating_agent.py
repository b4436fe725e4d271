"""The scripted "model" of the sub-agent tests: a main agent that hands work to Claude Code
sub-agents through the CLI's own ``Agent`` tool, and the sub-agents that do it.

Every request is read the way a model reads it. A conversation whose first user message carries
a ``SUBTASK <name>:`` line is that sub-agent's (its task is the delegated prompt, which Claude
Code passes verbatim); any other is the main agent's. The sub-agent runs its one shell command
(which writes a marker file and prints a line), then reports the line its tool result showed.
The main agent starts every sub-agent in its first reply, in the foreground or in the
background, and gives its final answer once every report is in its prompt (a foreground
sub-agent's comes back as the ``Agent`` call's tool result, a background one's as a later
notification); until then it says it is waiting.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from protocol_adapters.testing import ScriptedReply

from .reading import Prompt, ScriptedModel

AGENT_TOOL = "Agent"
TASK = (
    "Hand each part of this job to its own sub-agent and wait for their reports, then say that "
    "you are done."
)
_SUBTASK = re.compile(r"^SUBTASK (\w+):", re.MULTILINE)
_REPORT = re.compile(r"REPORT (\w+): ([\w-]+)")


def marker(name: str) -> str:
    return f"{name}-marker"


def output(name: str) -> str:
    return f"{name}-ran"


def subtask(name: str) -> str:
    return f"SUBTASK {name}: run one shell command, then report the line it printed."


def final_answer(names: tuple[str, ...]) -> str:
    return "Done. " + " ".join(f"REPORT {name}: {output(name)}" for name in names)


@dataclass(slots=True)
class DelegatingAgent(ScriptedModel):
    """``names``: one sub-agent each, all started in the main agent's first reply;
    ``background``: the ``Agent`` calls' ``run_in_background``. ``system_prompts`` records the
    system prompt each role saw (``"main"`` or the sub-agent's name)."""

    names: tuple[str, ...] = ()
    background: bool = False
    system_prompts: dict[str, set[str]] = field(default_factory=dict)

    def answer(self, prompt: Prompt) -> ScriptedReply:
        first_user = prompt.first("user")
        delegated = _SUBTASK.search(first_user.text) if first_user is not None else None
        role = "main" if delegated is None else delegated[1]
        system = prompt.first("system")
        self.system_prompts.setdefault(role, set()).add(system.text if system else "")
        if delegated is None:
            return self._main(prompt)
        return self._sub_agent(role, prompt)

    def _main(self, prompt: Prompt) -> ScriptedReply:
        if prompt.replies_so_far == 0:
            tool = prompt.tool(AGENT_TOOL)
            parameters = tool.get("parameters") if tool is not None else None
            properties = parameters.get("properties", {}) if isinstance(parameters, dict) else {}
            if not {"description", "prompt", "run_in_background"} <= set(properties):
                return self.problem(f"the main agent was offered no usable {AGENT_TOOL} tool")
            calls = [
                (
                    AGENT_TOOL,
                    {
                        "description": f"Run part {name}",
                        "prompt": subtask(name),
                        "run_in_background": self.background,
                    },
                )
                for name in self.names
            ]
            return ScriptedReply(text="Each part goes to its own sub-agent.", tool_calls=calls)
        reports = dict(_REPORT.findall(prompt.text))
        if all(reports.get(name) == output(name) for name in self.names):
            return ScriptedReply(text=final_answer(self.names))
        if not self.background:
            return self.problem(f"a foreground sub-agent's report is missing: {reports}")
        return ScriptedReply(text="Waiting for the sub-agents' reports.")

    def _sub_agent(self, name: str, prompt: Prompt) -> ScriptedReply:
        if name not in self.names:
            return self.problem(f"a sub-agent for {name!r}, which was never delegated")
        step = prompt.replies_so_far
        if step == 0:
            tool = prompt.shell_tool
            if tool is None:
                return self.problem(f"sub-agent {name}: no shell tool among the offered tools")
            line = f"echo {output(name)} > {marker(name)} && echo {output(name)}"
            return ScriptedReply(text="Running it.", tool_calls=[tool.call(line)])
        results = prompt.tool_results
        if step != 1 or not results:
            return self.problem(f"sub-agent {name}: request after {step} replies")
        printed = results[-1].strip().splitlines()[-1]
        return ScriptedReply(text=f"REPORT {name}: {printed}")
