"""The contract between the tree and a renderer: what the renderer sent to the engine, and how.

A renderer asks the tree for a :class:`~trajectory_tree.Route`, renders only the route's
new messages, and hands back a :class:`BridgedPrompt` (the tree then knows, at no cost, that the
prompt extends its path). When it had to render the whole conversation instead, it hands back a
:class:`FullPrompt` with its reason; the tree checks whether those ids still extend the path and,
if not, starts a new lineage whose history is context only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ._reasons import LossReason

PROMPT_REASONS: frozenset[LossReason] = frozenset(
    (
        LossReason.CONTEXT,
        LossReason.TOOL_OUTPUT,
        LossReason.TEMPLATE_SCAFFOLD,
        LossReason.RERENDERED_HISTORY,
    )
)


@dataclass(frozen=True, slots=True)
class Segment:
    """Consecutive prompt tokens with one reason (a tool result, a role header, a user note)."""

    reason: LossReason
    ids: Sequence[int]

    def __post_init__(self) -> None:
        if self.reason not in PROMPT_REASONS:
            raise ValueError(f"{self.reason} is not a reason for prompt tokens")


@dataclass(frozen=True, slots=True)
class BridgedPrompt:
    """Prompt ids = the route's prefix ids + ``segments`` + ``generation_prompt``.

    ``segments`` render the route's new messages, including any closing scaffold owed after the
    previous generated output; ``generation_prompt`` is the assistant header the template appends.
    """

    segments: Sequence[Segment]
    generation_prompt: Sequence[int]

    @property
    def new_length(self) -> int:
        return sum(len(s.ids) for s in self.segments) + len(self.generation_prompt)


@dataclass(frozen=True, slots=True)
class FullPrompt:
    """Prompt ids rendered from the whole conversation; the last ``generation_prompt_length``
    of them are the generation prompt. ``reason`` says why the bridge was not used."""

    ids: Sequence[int]
    generation_prompt_length: int
    reason: str

    def __post_init__(self) -> None:
        if not 0 <= self.generation_prompt_length <= len(self.ids):
            raise ValueError("generation_prompt_length must lie within the prompt")
