"""Provider-neutral messages: what every dialect's request is normalized into.

Each message carries a precomputed ``key``: a flat tuple of plain strings that two messages share
whenever they are byte-identical in everything routing cares about. Comparing keys is a single
C-level tuple comparison, which is what keeps routing a 1M-token request far below the cost of
parsing its JSON. Fields routing must ignore (thinking signatures, encrypted reasoning, cache
markers) are simply not part of the key; formatting differences that still mean the same message
(re-serialized tool arguments, reasoning a client did not echo) are settled by
:func:`trajectory_tree.same_message` on the rare key miss.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

Role: TypeAlias = Literal["system", "user", "assistant", "tool"]
ROLES: frozenset[str] = frozenset(("system", "user", "assistant", "tool"))


@dataclass(frozen=True, slots=True)
class Text:
    """Plain text content."""

    text: str


@dataclass(frozen=True, slots=True)
class Reasoning:
    """Model reasoning (``<think>`` content, Anthropic thinking, Responses reasoning items).

    ``signature`` and ``encrypted`` are opaque provider tokens echoed by clients; they never take
    part in equality.
    """

    text: str
    signature: str | None = field(default=None, compare=False)
    encrypted: str | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A call the assistant made. ``arguments`` is the JSON text as produced or received."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Media:
    """Non-text content (an image, a document) kept by reference: ``source`` is a URL or base64."""

    media_type: str
    source: str


Block: TypeAlias = Text | Reasoning | ToolCall | Media


def _block_key(block: Block) -> tuple[str, ...]:
    if isinstance(block, Text):
        return ("text", block.text)
    if isinstance(block, ToolCall):
        return ("call", block.id, block.name, block.arguments)
    if isinstance(block, Reasoning):
        return ("reasoning", block.text)
    return ("media", block.media_type, block.source)


@dataclass(frozen=True, slots=True)
class Message:
    """One conversation entry.

    ``role="tool"`` messages carry one tool result: ``tool_call_id`` names the call it answers and
    ``is_error`` flags a failed call. ``system`` messages may appear anywhere in a conversation
    (clients insert them mid-history).
    """

    role: Role
    content: tuple[Block, ...] = ()
    tool_call_id: str | None = None
    is_error: bool = False
    name: str | None = None
    key: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"unknown role {self.role!r}; expected one of {sorted(ROLES)}")
        if (self.role == "tool") != (self.tool_call_id is not None):
            raise ValueError("tool_call_id is required on tool messages and only there")
        parts: list[str] = [
            self.role,
            self.tool_call_id or "",
            "E" if self.is_error else "",
            self.name or "",
        ]
        for block in self.content:
            parts.extend(_block_key(block))
        object.__setattr__(self, "key", tuple(parts))

    @classmethod
    def text(cls, role: Role, text: str) -> Message:
        """A message with a single text block."""
        return cls(role, (Text(text),))

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        return tuple(b for b in self.content if isinstance(b, ToolCall))

    @property
    def reasoning(self) -> tuple[Reasoning, ...]:
        return tuple(b for b in self.content if isinstance(b, Reasoning))

    @property
    def plain_text(self) -> str:
        """All text blocks joined: what a reader wants to see of the message."""
        return "".join(b.text for b in self.content if isinstance(b, Text))


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool offered to the model. ``parameters`` is its JSON schema as compact JSON text, key
    order as the client sent it: the chat template prints it as a deployed engine would."""

    name: str
    description: str = ""
    parameters: str = "{}"


@dataclass(frozen=True, slots=True)
class Prompt:
    """A request in neutral form: everything that decides the prompt tokens.

    ``options`` holds rendering switches that change the tokens (for example a chat template's
    ``enable_thinking``); two prompts that differ in tools or options never share tokens.
    """

    messages: Sequence[Message]
    tools: Sequence[ToolSpec] = ()
    options: Mapping[str, str] = field(default_factory=dict)

    def context_key(self) -> tuple[str, ...]:
        """The part of the prompt that precedes all messages in token space."""
        parts: list[str] = []
        for tool in self.tools:
            parts += (tool.name, tool.description, tool.parameters)
        parts.append("\x00")
        for name in sorted(self.options):
            parts += (name, self.options[name])
        return tuple(parts)
