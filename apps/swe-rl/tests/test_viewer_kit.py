"""Support for the viewer's tests (no tests here): run directories recorded for real.

Every session is played through the real adapter (real Qwen3 tokenizer and chat template, the
real SGLang client) with the official `anthropic` SDK as the client; only the engine is the
SGLang-wire double, replying from the script below. The rich episode has everything a viewer
must draw: a main agent with tool calls and results, a sub-agent (its own system prompt and
agent-id header), an engine abort answered by the client's retry, an abandoned retry, and a
compaction (a summary request, then a new history that starts from the summary). Grading's
verdicts are written as `swe_rl.run` writes them: resolved with a refused conftest.py (a cheat
the grader did not apply), unresolved with passing tests left unlisted, timed out, and not graded.
Model output, tool output, a refused file's name and a test id carry markup (`</script>`,
`<img onerror=...>`) that must render as text.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import anthropic
import pytest
from anthropic.types import MessageParam, ToolParam

from protocol_adapters import Vocabulary
from protocol_adapters.testing import ScriptedReply
from protocol_adapters.testing.stack import LocalStack, local_stack
from swe_rl.grading import GradeResult, Verdict
from trajectory_tree import SessionTree, dumps

INJECTED = '</script><img src=x onerror="window.__pwned=1"><!--'
"""Markup in model and tool output; if it ever ran, `window.__pwned` would be set."""
INJECTED_PATH = '<img src=x onerror="window.__pwned=1">.py'
"""A file an agent named itself, refused by grading: the page must show the name as text."""
CONFTEST_WHY = "code the test runner loads by itself (conftest.py)"

SUB_AGENT = "a1b2c3d4e5f60718"
MAIN_SYSTEM = "You are a coding agent. Fix the issue in the repository you are given."
SUB_SYSTEM = "You are a search sub-agent. Answer the question and stop."
TASK = "Fix the bug: add() in calc.py subtracts instead of adding."
SUMMARY = "Summary: add() subtracted; it now returns a + b and the tests pass."
BASH: ToolParam = {
    "name": "Bash",
    "description": "Run a shell command",
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
}
TASK_TOOL: ToolParam = {
    "name": "Task",
    "description": "Start a sub-agent",
    "input_schema": {
        "type": "object",
        "properties": {"description": {"type": "string"}, "prompt": {"type": "string"}},
        "required": ["description", "prompt"],
    },
}

SCRIPT = [
    # the rich episode
    ScriptedReply(
        reasoning="Read calc.py first.", tool_calls=[("Bash", {"command": "cat calc.py"})]
    ),
    ScriptedReply(
        text="Let me find the tests.",
        tool_calls=[("Task", {"description": "find tests", "prompt": "Which tests cover add()?"})],
    ),
    ScriptedReply(tool_calls=[("Bash", {"command": "grep -rn 'add(' tests"})]),
    ScriptedReply(text="tests/test_calc.py line 4 covers add()."),
    ScriptedReply(text="I will now edit calc.py and", finish="abort"),
    ScriptedReply(tool_calls=[("Bash", {"command": "sed -i 's/a - b/a + b/' calc.py"})]),
    ScriptedReply(tool_calls=[("Bash", {"command": "python -m pytest -q"})]),
    ScriptedReply(tool_calls=[("Bash", {"command": "python -m pytest -q tests"})]),
    ScriptedReply(text=SUMMARY),
    ScriptedReply(text="The fix is in place and the tests pass.\n" + INJECTED),
    # the truncated episode
    ScriptedReply(tool_calls=[("Bash", {"command": "ls"})]),
    ScriptedReply(text="calc.py tests"),
    # the aborted episode
    ScriptedReply(reasoning="Look around.", tool_calls=[("Bash", {"command": "ls"})]),
]


@dataclass(frozen=True)
class RecordedRun:
    directory: Path
    trees: dict[str, SessionTree]
    """The session tree of each episode that has one, by episode id."""


def record_run(directory: Path, vocabulary: Vocabulary) -> RecordedRun:
    """Record the sessions through the adapter and write the run directory."""
    return asyncio.run(_record(directory, vocabulary))


async def _record(directory: Path, vocabulary: Vocabulary) -> RecordedRun:
    async with local_stack(
        SCRIPT, tokenizer_cache=directory / "tokenizer", vocabulary=vocabulary
    ) as stack:
        rich = await _session(stack, "rich", _rich_episode)
        short = await _session(stack, "short", _short_episode)
        aborted = await _session(stack, "aborted", _aborted_episode)
    trees = {"ep-rich": rich, "ep-short": short, "ep-aborted": aborted}
    episodes = [
        _entry(
            "ep-rich",
            "calc__add-1",
            0,
            1.0,
            0.87,
            "completed",
            str(GRADING["ep-rich"]["reason"]),  # as swe_rl.episode reports it
            GRADING["ep-rich"],
        ),
        _entry(
            "ep-short",
            "calc__add-1",
            0,
            0.0,
            -0.87,
            "truncated",
            "wall-clock budget reached",
            GRADING["ep-short"],
        ),
        _entry("ep-aborted", "calc__sub-2", 1, 0.0, None, "aborted", "sandbox: could not start"),
        _entry("ep-broken", "calc__sub-2", 1, 0.0, 0.0, "completed", "", GRADING["ep-broken"]),
    ]
    for episode_id, tree in trees.items():
        _write(directory / "episodes" / episode_id / "tree.json", dumps(tree))
    _write(directory / "episodes" / "ep-broken" / "tree.json", '{"format": "trajectory-tree/1"')
    rich_dir = directory / "episodes" / "ep-rich"
    _write(rich_dir / "diff.patch", DIFF)
    _write(rich_dir / "grading.log", "tests/test_calc.py::test_add PASSED\n" + INJECTED + "\n")
    _write(rich_dir / "summary.json", json.dumps({"reward": 1.0, "status": "completed"}))
    run = {
        "title": "Viewer test run <b>bold?</b>",
        "policy": "scripted engine double",
        "agent": "claude-code",
        "episodes": episodes,
        "alarms": [
            {
                "gate": "zero_trainable",
                "share": 0.5,
                "limit": 0.2,
                "message": "2/4 episodes (50%) > limit 20%",
            }
        ],
    }
    _write(directory / "run.json", json.dumps(run, indent=2))
    return RecordedRun(directory, trees)


GRADING: dict[str, dict[str, Any]] = {
    # Resolved, with a cheat refused: the agent's conftest.py was not applied.
    "ep-rich": GradeResult(
        Verdict.RESOLVED,
        "all 2 wanted tests passed",
        {"tests/test_calc.py::test_add": "passed", "tests/test_calc.py::test_sub": "passed"},
        {"conftest.py": CONFTEST_WHY},
        patch_applied=True,
    ).summary(),
    # Unresolved; two files refused, one named as markup; most passing tests left unlisted.
    "ep-short": GradeResult(
        Verdict.UNRESOLVED,
        "2 of 6 wanted tests did not pass: tests/test_calc.py::test_add failed",
        {
            "tests/test_calc.py::test_mul": "passed",
            "tests/test_calc.py::test_add": "failed",
            "tests/test_calc.py::test_neg": "xfailed",
            f"tests/test_calc.py::test_name[{INJECTED}]": "missing",
            "tests/test_calc.py::test_zero": "passed",
            "tests/test_calc.py::test_one": "passed",
        },
        {"conftest.py": CONFTEST_WHY, INJECTED_PATH: "a test file the grader restores"},
        patch_applied=True,
    ).summary(max_tests=3),
    "ep-broken": GradeResult(
        Verdict.TESTS_TIMED_OUT,
        "the test run passed its 30 s limit",
        {"tests/test_calc.py::test_sub": "missing"},
        timed_out=True,
        patch_applied=True,
    ).summary(),
}
"""What grading wrote for each graded episode, as `swe_rl.run` puts it in run.json (with the
keys the viewer does not read: reward, resolved, patch_applied, collection_errors)."""


DIFF = """diff --git a/calc.py b/calc.py
--- a/calc.py
+++ b/calc.py
@@ -1,2 +1,2 @@
 def add(a, b):
-    return a - b
+    return a + b
"""


def _entry(
    episode_id: str,
    instance_id: str,
    group: int,
    reward: float,
    advantage: float | None,
    status: str,
    reason: str,
    grading: dict[str, Any] | None = None,
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "episode_id": episode_id,
        "instance_id": instance_id,
        "group": group,
        "reward": reward,
        "advantage": advantage,
        "status": status,
        "reason": reason,
        "dir": f"episodes/{episode_id}",
    }
    if grading is not None:  # an episode that was not graded has no key (older runs neither)
        entry["grading"] = grading
    return entry


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


class Client:
    """The official SDK against the adapter, one conversation at a time."""

    def __init__(self, api: anthropic.AsyncAnthropic) -> None:
        self.api = api

    async def ask(
        self,
        system: str,
        messages: list[MessageParam],
        tools: list[ToolParam],
        headers: Mapping[str, str] | None = None,
    ) -> MessageParam:
        """One model call; returns the assistant message as the client echoes it back."""
        reply = await self.api.messages.create(
            model="policy",
            max_tokens=512,
            system=system,
            messages=messages,
            tools=tools,
            extra_headers=dict(headers or {}),
        )
        content = [block.model_dump(exclude_none=True) for block in reply.content]
        return cast(MessageParam, {"role": "assistant", "content": content})


def _blocks(message: MessageParam) -> list[dict[str, Any]]:
    return cast(list[dict[str, Any]], message["content"])


def _result(message: MessageParam, output: str) -> MessageParam:
    call = next(b["id"] for b in _blocks(message) if b["type"] == "tool_use")
    return {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": call, "content": output}],
    }


async def _session(stack: LocalStack, name: str, play: Any) -> SessionTree:
    session = stack.server.sessions.open(name)
    api = anthropic.AsyncAnthropic(base_url=stack.server.url, api_key=session.token, max_retries=0)
    async with api:
        await play(Client(api))
    closed = await stack.server.close_session(session.token)
    return closed.tree


async def _rich_episode(client: Client) -> None:
    tools = [BASH, TASK_TOOL]
    history: list[MessageParam] = [{"role": "user", "content": TASK}]
    cat = await client.ask(MAIN_SYSTEM, history, tools)
    history += [cat, _result(cat, "def add(a, b):\n    return a - b  # " + INJECTED + "\n")]
    task = await client.ask(MAIN_SYSTEM, history, tools)

    sub_history: list[MessageParam] = [{"role": "user", "content": "Which tests cover add()?"}]
    agent = {"x-claude-code-agent-id": SUB_AGENT}
    grep = await client.ask(SUB_SYSTEM, sub_history, [BASH], agent)
    sub_history += [grep, _result(grep, "tests/test_calc.py:4:    assert add(2, 3) == 5")]
    found = await client.ask(SUB_SYSTEM, sub_history, [BASH], agent)
    hand_back = "[Subagent hand-back] " + _blocks(found)[0]["text"]

    history += [task, _result(task, hand_back)]
    with pytest.raises(anthropic.InternalServerError) as aborted:  # the engine aborted it
        await client.ask(MAIN_SYSTEM, history, tools)
    assert aborted.value.status_code == 529
    edit = await client.ask(MAIN_SYSTEM, history, tools, {"x-stainless-retry-count": "1"})
    history += [edit, _result(edit, "(no output)")]
    await client.ask(MAIN_SYSTEM, history, tools)  # this answer is abandoned: the client retries
    test = await client.ask(MAIN_SYSTEM, history, tools, {"x-stainless-retry-count": "1"})
    history += [test, _result(test, "1 passed in 0.01s")]
    history.append({"role": "user", "content": "Summarize the conversation so far."})
    summary = await client.ask(MAIN_SYSTEM, history, tools)
    restart = (
        "This session is being continued from a previous conversation.\n"
        + _blocks(summary)[0]["text"]
    )
    await client.ask(MAIN_SYSTEM, [{"role": "user", "content": restart}], tools)


async def _short_episode(client: Client) -> None:
    history: list[MessageParam] = [{"role": "user", "content": "What files are there?"}]
    ls = await client.ask(MAIN_SYSTEM, history, [BASH])
    history += [ls, _result(ls, "calc.py\ntests\n")]
    await client.ask(MAIN_SYSTEM, history, [BASH])


async def _aborted_episode(client: Client) -> None:
    history: list[MessageParam] = [{"role": "user", "content": "Fix sub() in calc.py."}]
    await client.ask(MAIN_SYSTEM, history, [BASH])
