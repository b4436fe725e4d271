"""Telling a request that was resent without the oldest part of its history.

Refused as too long, Claude Code retries its compaction request shorter, and Codex retries its
own up to five times, each time without the oldest messages: the first user message, the task,
goes first. What the model then writes (a summary of the conversation) was written without the
task. The tree records it as any turn; the note this module writes excludes it from training
(``LossReason.HISTORY_DROPPED``) and says what was dropped.

A resend is recognized against the agent's last refused request: the same tools, options and
system prompt, fewer messages after it, and the refused request's last messages at its end
(its first message may be one the client rewrote to start the shorter history).
"""

from __future__ import annotations

from dataclasses import dataclass

from trajectory_tree import Prompt

HISTORY_DROPPED = "history_dropped"
"""``TurnMeta.extra`` key of the note (trajectory-tree excludes such turns from training)."""


@dataclass(frozen=True, slots=True)
class Refused:
    """What identifies a refused request: its tools and options, and its messages."""

    context: tuple[str, ...]
    messages: tuple[tuple[str, ...], ...]

    @classmethod
    def of(cls, prompt: Prompt) -> Refused:
        return cls(prompt.context_key(), tuple(message.key for message in prompt.messages))


def dropped_history(refused: Refused | None, prompt: Prompt) -> str | None:
    """The note for ``prompt`` when it resends ``refused`` without its oldest messages (its
    leading system messages kept)."""
    if refused is None or prompt.context_key() != refused.context:
        return None
    keys = tuple(message.key for message in prompt.messages)
    head = _leading_system(refused.messages)
    if keys[:head] != refused.messages[:head]:
        return None
    old, new = refused.messages[head:], keys[head:]
    if not 0 < len(new) < len(old):
        return None
    start = len(old) - len(new)
    if old[start + 1 :] != new[1:]:
        return None
    dropped = start if old[start] == new[0] else start + 1
    roles = [key[0] for key in old]
    first_user = roles.index("user") if "user" in roles else len(old)
    note = f"resent without its first {dropped} of {len(old)} messages after a too-long refusal"
    if first_user < dropped:
        note += "; the first user message (the task) among them"
    return note


def _leading_system(messages: tuple[tuple[str, ...], ...]) -> int:
    """How many system messages open the conversation (the system prompt)."""
    count = 0
    while count < len(messages) and messages[count][0] == "system":
        count += 1
    return count
