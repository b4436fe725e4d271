"""Telling a request that was resent without its task after a too-long refusal.

Refused as too long, Claude Code and Codex resend their request for a summary without the oldest
messages of the history, the task among them: what the model then writes was written without the
task. The note this module writes (``TurnMeta.extra["history_dropped"]``) makes trajectory-tree
exclude that turn from training (``LossReason.HISTORY_DROPPED``) and count it.

Measured on a 32k engine (``tests/test_cli_shortened_summary.py``), on the host and in a sandbox:

- Claude Code 2.1.330: its conversation refused, it asks for a summary of the opening round (the
  task, a system message, the first reply and its result, then its instruction); refused too,
  it asks for a summary of every round but the opening one, led by a placeholder user message
  ("[earlier conversation truncated for compaction retry]") and a date system message: two
  refusals, then accepted. Against the request refused last: 2 of its 5 messages gone, every
  later one kept, and the rounds it had left out added.
- Codex 0.169.0: its compaction request refused, it resends it without its oldest item each
  time: the skills (a developer message), the environment context (a user message), the task,
  then the first call with its output (rewriting the message that holds that reply's parallel
  calls): four refusals, the fourth resend accepted. The request refused last had already lost
  the task: its history opens with a reply.

The session keeps each agent's last refused request only, so a request is judged against it. It is
noted when it has the same tools, options and system prompt, keeps a reply or tool result of it
(the same conversation: call ids are unique) and lacks its task: the last user message before its
first reply. When that history opens with a reply, an earlier resend dropped the task: then the
request is noted when it lacks that history's oldest message. A retry, a continuation, a resend
that keeps the task and another conversation get no note. Not measured, so not covered: Claude
Code resending again from its placeholder, which then stands where the task was.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from trajectory_tree import Prompt

HISTORY_DROPPED = "history_dropped"
"""``TurnMeta.extra`` key of the note (trajectory-tree excludes such turns from training)."""

Key = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Refused:
    """What identifies a refused request: its tools and options, and its messages."""

    context: Key
    messages: tuple[Key, ...]

    @classmethod
    def of(cls, prompt: Prompt) -> Refused:
        return cls(prompt.context_key(), tuple(message.key for message in prompt.messages))


def dropped_history(refused: Refused | None, prompt: Prompt) -> str | None:
    """The note for ``prompt`` when it resends ``refused`` without its task, else None."""
    if refused is None or prompt.context_key() != refused.context:
        return None
    keys = [message.key for message in prompt.messages]
    head = 1 if refused.messages[:1] and refused.messages[0][0] == "system" else 0
    if keys[:head] != list(refused.messages[:head]):
        return None  # another system prompt: another kind of request
    old, present = refused.messages[head:], set(keys[head:])
    if not any(key[0] in ("assistant", "tool") and key in present for key in old):
        return None  # nothing of its conversation kept: another one
    task = _task(old)
    if task is not None and old[task] in present:
        return None  # the task kept (a retry, a continuation, a summary of it)
    if task is None and old[0] in present:
        return None  # a history that had lost its task, kept whole from its oldest message
    gone = sum(1 for key in old if key not in present)
    said = "the task among them" if task is not None else "its task gone in an earlier resend"
    return f"resent after a too-long refusal without {gone} of its {len(old)} messages, {said}"


def _task(history: Sequence[Key]) -> int | None:
    """Where the task is: the last user message before the first reply (Codex sends its
    environment context as a user message before the task); None if the history opens with a
    reply."""
    task = None
    for index, key in enumerate(history):
        if key[0] == "assistant":
            break
        if key[0] == "user":
            task = index
    return task
