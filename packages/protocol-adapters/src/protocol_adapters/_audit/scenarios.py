"""The conversations the template audit drives through a template, as a coding agent would.

Every text carries a marker (``⁣U1⁣`` ...) so the audit can find where a template put it, or
notice that it dropped it. The tool spec's description carries one too, to see where the tool
list is rendered. Call ids are long enough for templates that keep their last 9 characters.
"""

from __future__ import annotations

import json

from trajectory_tree import Message, Reasoning, Role, Text, ToolCall, ToolSpec


def marker(name: str) -> str:
    """Invisible-delimited text no template writes by itself."""
    return f"\u2063{name}\u2063"


TOOLS_MARKER = marker("tools")
ARGUMENT_VALUE = "probe value 7"
TOOLS = (
    ToolSpec(
        "probe_tool",
        f"Runs a probe. {TOOLS_MARKER}",
        json.dumps(
            {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "what to run"}},
                "required": ["command"],
            }
        ),
    ),
)
CALL_A = ToolCall("call_audit_0001", "probe_tool", json.dumps({"command": "ls -la"}))
CALL_B = ToolCall("call_audit_0002", "probe_tool", json.dumps({"command": "pytest -x"}))
ARGUMENT_CALL = ToolCall("call_audit_0003", "probe_tool", json.dumps({"command": ARGUMENT_VALUE}))


def _text(role: Role, name: str, words: str) -> Message:
    return Message.text(role, f"{words} {marker(name)}")


def _result(call: ToolCall, name: str) -> Message:
    return Message("tool", (Text(f"{marker(name)} a.py b.py"),), tool_call_id=call.id)


SYSTEM = _text("system", "S0", "You are a careful coding agent.")


def agent(*, reasoning: bool, system: bool = True) -> tuple[Message, ...]:
    """A coding session: a call with text, a call alone, results, a reply, follow-ups."""

    def thought(name: str) -> tuple[Reasoning, ...]:
        return (Reasoning(f"{marker(name)} think it over"),) if reasoning else ()

    messages = (
        _text("user", "U1", "Fix the failing test."),
        Message("assistant", (*thought("R2"), Text(f"Looking. {marker('A2')}"), CALL_A)),
        _result(CALL_A, "T3"),
        Message("assistant", (*thought("R4"), CALL_B)),
        _result(CALL_B, "T5"),
        Message("assistant", (*thought("R6"), Text(f"{marker('A6')} Fixed."))),
        _text("user", "U7", "Thanks. Run it again."),
        Message("assistant", (*thought("R8"), Text(f"Done. {marker('A8')}"))),
        _text("user", "U9", "Bye."),
    )
    return (SYSTEM, *messages) if system else messages


def parallel_calls() -> tuple[Message, ...]:
    """One assistant turn with two calls, answered in order."""
    return (
        SYSTEM,
        _text("user", "U1", "Look around."),
        Message("assistant", (CALL_A, CALL_B)),
        _result(CALL_A, "T3"),
        _result(CALL_B, "T4"),
        _text("assistant", "A5", "Both done."),
        _text("user", "U6", "Good."),
    )


def system_note() -> tuple[Message, ...]:
    """A system message in the middle of the conversation, as agents insert reminders."""
    return (
        SYSTEM,
        _text("user", "U1", "Start."),
        _text("assistant", "A2", "Started."),
        _text("system", "S3", "Five minutes left."),
        _text("user", "U4", "Go on."),
        _text("assistant", "A5", "Going."),
        _text("user", "U6", "Stop."),
    )


def arguments_probe() -> tuple[Message, ...]:
    """A call whose arguments show whether the template prints them as JSON."""
    return (
        _text("user", "U1", "Probe."),
        Message("assistant", (ARGUMENT_CALL,)),
        _result(ARGUMENT_CALL, "T3"),
    )
