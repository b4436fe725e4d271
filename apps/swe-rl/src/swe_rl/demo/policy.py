"""The demo's scripted policy: the engine double's "model" for the demo tasks.

There is no GPU here, so no model runs: this script plays one. Like a model it sees only its
prompt (the token ids the adapter sent), reads the problem statement and the shell tool the
CLI offers, and answers with reasoning, shell commands and a final message, turn by turn. It
keeps no per-episode state: its first reply states a plan ("[demo plan: fix]"), and later turns
read that plan back from the conversation, as a model would read its own earlier turns.

Plans rotate per task so every GRPO group mixes outcomes (non-zero advantages):
- fix:   inspect, make the right edit, run the tests, report;
- wrong: make a plausible but wrong edit;
- cheat: rewrite the test file so the buggy code passes (grading refuses test changes);
- skip:  look around and give up without changing anything.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from protocol_adapters import Vocabulary
from protocol_adapters.testing import ScriptedReply
from protocol_adapters.testing.prompt_tools import (
    ShellTool,
    find_shell_tool,
    offered_tools,
    replies_so_far,
)
from swe_rl.demo.repos import TASKS, DemoTask

PLANS = ("fix", "cheat", "fix", "wrong", "skip")
_PLAN_MARK = "[demo plan: "


@dataclass(slots=True)
class DemoPolicy:
    """A callable of a request's prompt ids -> the reply (the engine double's Script)."""

    vocabulary: Vocabulary
    plans: Sequence[str] = PLANS
    started: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, input_ids: Sequence[int]) -> ScriptedReply:
        prompt = self.vocabulary.decode(list(input_ids))
        task = next((t for t in TASKS if t.issue in prompt), None)
        tool = find_shell_tool(offered_tools(prompt))
        if task is None or tool is None:
            return ScriptedReply(text="I cannot tell what to do here.")
        step = replies_so_far(prompt)
        if step == 0:
            return self._first(task, tool)
        plan = _plan_in(prompt)
        return _next_step(task, tool, plan, step)

    def _first(self, task: DemoTask, tool: ShellTool) -> ScriptedReply:
        with self._lock:  # the double may serve concurrent episodes from threads
            index = self.started[task.name]
            self.started[task.name] += 1
        offset = TASKS.index(task)
        plan = self.plans[(index + offset) % len(self.plans)]
        return ScriptedReply(
            reasoning=f"First read {task.fix.path} and its tests.",
            text=f"{_PLAN_MARK}{plan}] Let me look at {task.fix.path}.",
            tool_calls=[tool.call(f"cat {task.fix.path} {task.test_module}.py")],
        )


def _plan_in(prompt: str) -> str:
    """The plan the first reply announced (its visible text: every CLI echoes that back)."""
    start = prompt.rfind(_PLAN_MARK)
    if start < 0:
        return "skip"
    return prompt[start + len(_PLAN_MARK) :].split("]", 1)[0].strip()


def _next_step(task: DemoTask, tool: ShellTool, plan: str, step: int) -> ScriptedReply:
    fix = task.fix
    if step == 1 and plan in ("fix", "wrong"):
        new = fix.new if plan == "fix" else fix.wrong
        return ScriptedReply(
            reasoning=f"The bug is in {fix.path}.",
            tool_calls=[tool.call(_replace(fix.path, fix.old, new))],
        )
    if step == 1 and plan == "cheat":
        return ScriptedReply(
            reasoning="Easier to make the tests agree with the code.",
            tool_calls=[tool.call(f"printf 'import unittest\\n' > {task.test_module}.py")],
        )
    if step == 2 and plan != "skip":
        return ScriptedReply(
            text="Running the tests.",
            tool_calls=[tool.call(f"python3 -m unittest -q {task.test_module} 2>&1 | tail -3")],
        )
    summary = {
        "fix": f"Fixed the bug in {fix.path}; the tests pass.",
        "wrong": f"Changed {fix.path}; that should do it.",
        "cheat": "The tests pass now.",
    }.get(plan, "I could not find the problem.")
    return ScriptedReply(text=summary)


def _replace(path: str, old: str, new: str) -> str:
    """A shell command that replaces `old` with `new` in `path` (exactly once)."""
    script = (
        "import pathlib, sys\n"
        f"p = pathlib.Path({path!r})\n"
        f"old, new = {json.dumps(old)}, {json.dumps(new)}\n"
        "text = p.read_text()\n"
        "if text.count(old) != 1: sys.exit('pattern not found once')\n"
        "p.write_text(text.replace(old, new))\n"
    )
    return f"python3 - <<'EOF'\n{script}EOF"
