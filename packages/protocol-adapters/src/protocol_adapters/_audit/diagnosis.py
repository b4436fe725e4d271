"""What a difference between two renders of a template means, named as a finding.

The audit (:mod:`.audit`) finds where the bridge's text and the template's own render part; this
module says why, for the traits published templates have: reasoning of earlier turns dropped, a
header every render ends with, tool results rendered inside the model's turn, a message moved
before earlier ones, the tool list moved, a generation prompt history does not repeat. Anything
else is named by where it happens, with both texts quoted.
"""

from __future__ import annotations

from collections.abc import Sequence

from protocol_adapters._template.context import USER, TemplateContext
from trajectory_tree import Message

from .scenarios import TOOLS_MARKER, marker
from .verdict import GENERATION_PROMPT_DIFFERS, REASONING_DROPPED, Finding, FindingKind

EXCERPT = 40
"""Characters of text quoted around a difference."""


def excerpt(text: str, at: int) -> str:
    return repr(text[max(0, at - EXCERPT // 2) : at + EXCERPT])


def common_prefix(a: str, b: str) -> int:
    limit = min(len(a), len(b))
    for index in range(limit):
        if a[index] != b[index]:
            return index
    return limit


def describe(messages: Sequence[Message], index: int) -> str:
    message = messages[index]
    if message.role == "assistant":
        calls = len(message.tool_calls)
        if calls > 1:
            return f"an assistant turn with {calls} tool calls"
        return "an assistant turn with a tool call" if calls else "an assistant reply"
    if message.role == "tool":
        return "a tool result"
    if message.role == "system":
        return "a system message after the first" if index else "a leading system message"
    return "a user message"


def _markers(message: Message) -> list[str]:
    """The audit markers in a scenario message's text."""
    text = message.plain_text
    parts = text.split("\u2063")
    return [f"\u2063{parts[i]}\u2063" for i in range(1, len(parts) - 1, 2)]


def describe_last(messages: Sequence[Message]) -> str:
    return describe(messages, len(messages) - 1)


def generation_differs(
    context: TemplateContext,
    prompt: str,
    generation_at: int,
    history: str,
    messages: Sequence[Message],
    reply: int,
) -> Finding:
    """The template's prompt for a request is not a prefix of its render of the history
    that adds the reply: what was sent and generated differs from what history shows."""
    at = common_prefix(prompt, history)
    if at < generation_at:
        return rewrite(context, prompt, history, messages[:reply], messages[reply:])
    generation = prompt[generation_at:]
    shown = history[generation_at : generation_at + len(generation) + EXCERPT // 2]
    role = messages[reply - 1].role
    return Finding(
        FindingKind.DEVIATION,
        f"{GENERATION_PROMPT_DIFFERS} (after a {role} message)",
        f"prompt ends {generation!r}, history renders {shown!r}",
    )


def unclosed(history: str, closing: str, messages: Sequence[Message], reply: int) -> Finding:
    """History renders a reply without the closing the model ends its turns with: the bridge
    keeps the model's end token and adds the rest of the closing, the template does not."""
    if reply + 1 < len(messages) and messages[reply + 1].role == "tool":
        return Finding(
            FindingKind.REWRITE,
            "renders tool results inside the model's turn",
            f"its closing {closing!r} comes after them, not after the model's calls",
        )
    return Finding(
        FindingKind.REWRITE,
        f"does not close {describe(messages, reply)} as it closes a reply",
        f"history ends {history[-EXCERPT:]!r}, a reply ends {closing!r}",
    )


def rewrite(
    context: TemplateContext,
    earlier: str,
    later: str,
    before: Sequence[Message],
    new: Sequence[Message],
) -> Finding:
    """``earlier`` (the render of ``before``) is not a prefix of ``later`` (after ``new``
    arrived): name the rewrite when it is a known one."""
    at = common_prefix(earlier, later)
    reasoning = [marker(f"R{i}") for i in (2, 4, 6, 8)]
    if any(m in earlier and m not in later for m in reasoning):
        return Finding(
            FindingKind.DEVIATION,
            REASONING_DROPPED,
            "bridged prompts keep the model's reasoning where the template's render drops it",
        )
    suffix = earlier[at:]
    if suffix and context.base_text(USER).endswith(suffix):
        return Finding(
            FindingKind.REWRITE,
            "ends every render with an assistant header, even without add_generation_prompt",
            f"{suffix!r} is replaced by the next message",
        )
    tail = context.assistant_tail()
    result = later.find(next(iter(_markers(new[0])), "\u2063")) if new else -1
    if (
        before
        and before[-1].role == "assistant"
        and new[0].role == "tool"
        and tail
        and result >= at
        and tail not in later[at:result]
    ):
        return Finding(
            FindingKind.REWRITE,
            "renders tool results inside the model's turn",
            f"its closing {tail!r} comes after them, not after the model's calls",
        )
    for index, message in enumerate(new):
        for moved in _markers(message):
            found = later.find(moved)
            if found >= 0 and earlier[at:] and earlier[at:] in later[found:]:
                return Finding(
                    FindingKind.REWRITE,
                    f"moves {describe((*before, *new), len(before) + index)} before "
                    "earlier messages",
                    f"rendered inside {excerpt(later, found)}",
                )
    if earlier.find(TOOLS_MARKER) != later.find(TOOLS_MARKER):
        return Finding(
            FindingKind.REWRITE,
            "moves the tool list as messages arrive (into the last user message)",
            f"{excerpt(earlier, at)} becomes {excerpt(later, at)}",
        )
    after = describe_last(before) if before else "the conversation's start"
    return Finding(
        FindingKind.REWRITE,
        f"rewrites earlier text when messages follow {after}",
        f"{excerpt(earlier, at)} becomes {excerpt(later, at)}",
    )
