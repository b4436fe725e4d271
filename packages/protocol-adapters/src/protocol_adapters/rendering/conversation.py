"""What a chat template does around messages, learned by rendering fixed probe conversations.

The bridge never asks a template to render the model's earlier output. It only needs to know, for
one request context (tools and options): what text comes before the new messages given the role
of their predecessor (the *base* rendering), what the generation prompt is, how an assistant turn
is closed, and what header a message of each role gets. Each is learned by rendering a small probe
conversation once and cached per context, so a bridged turn renders only its new messages.

Thread safety: a :class:`TemplateContext` caches with idempotent writes (two threads computing
the same entry store equal values), so sharing one between worker threads is safe.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trajectory_tree import Message, Prompt, Role, Text, ToolCall

from .template import ChatTemplate
from .template_messages import template_messages, template_options, template_tools

SENTINEL = "\u2063probe\u2063"
"""Content of probe messages: text no real message starts or ends with."""

_PROBE_CALL = ToolCall("call_probe", "probe", "{}")
_PROBE_BASES: dict[Role, tuple[Message, ...]] = {
    "user": (Message.text("user", "base"),),
    "assistant": (Message.text("user", "base"), Message.text("assistant", "base")),
    "system": (Message.text("user", "base"), Message.text("system", "base")),
    "tool": (
        Message.text("user", "base"),
        Message("assistant", (_PROBE_CALL,)),
        Message("tool", (Text("base"),), tool_call_id=_PROBE_CALL.id),
    ),
}
"""A fixed conversation ending in each role: new messages render after it as after the real one.
Each starts with a user turn, so a new system message is never mistaken for the leading one."""


def probe_message(role: Role) -> Message:
    if role == "tool":
        return Message("tool", (Text(SENTINEL),), tool_call_id=_PROBE_CALL.id)
    return Message.text(role, SENTINEL)


class TemplateContext:
    """A template bound to one request context (tools, options), with its probe results cached."""

    def __init__(self, template: ChatTemplate, prompt: Prompt) -> None:
        self.template = template
        self.tools = template_tools(tuple(prompt.tools))
        self.options: Mapping[str, Any] = template_options(prompt.options)
        self._base_text: dict[Role | None, str] = {}
        self._headers: dict[tuple[Role | None, Role], str | None] = {}
        self._generation_prompt: str | None = None
        self.generation_ids: list[int] | None = None
        self._assistant_tail: str | None = None

    def render(self, messages: Sequence[Message], *, add_generation_prompt: bool) -> str:
        return self.template.render_raw(
            template_messages(messages),
            self.tools,
            self.options,
            add_generation_prompt=add_generation_prompt,
        )

    def base(self, role: Role | None) -> tuple[Message, ...]:
        return () if role is None else _PROBE_BASES[role]

    def base_text(self, role: Role | None) -> str:
        """The rendering of the probe conversation ending in ``role`` ("" when there is none)."""
        text = self._base_text.get(role)
        if text is None:
            base = self.base(role)
            text = self.render(base, add_generation_prompt=False) if base else ""
            self._base_text[role] = text
        return text

    def render_after(self, role: Role | None, messages: Sequence[Message], *, gen: bool) -> str:
        """Render base(role) + messages; the caller strips :meth:`base_text` (and checks it)."""
        return self.render((*self.base(role), *messages), add_generation_prompt=gen)

    def generation_prompt(self) -> str:
        """The text ``add_generation_prompt`` appends after a user turn."""
        if self._generation_prompt is None:
            base = _PROBE_BASES["user"]
            plain = self.render(base, add_generation_prompt=False)
            with_prompt = self.render(base, add_generation_prompt=True)
            if not with_prompt.startswith(plain):
                raise ValueError(
                    f"chat template {self.template.name!r}: the generation prompt is not an append"
                )
            self._generation_prompt = with_prompt[len(plain) :]
        return self._generation_prompt

    def assistant_tail(self) -> str:
        """What the template writes after an assistant message's content (``<|im_end|>\\n``)."""
        if self._assistant_tail is None:
            text = self.render(
                (Message.text("user", "base"), probe_message("assistant")),
                add_generation_prompt=False,
            )
            at = text.rfind(SENTINEL)
            if at < 0:
                raise ValueError(f"chat template {self.template.name!r} drops assistant content")
            self._assistant_tail = text[at + len(SENTINEL) :]
        return self._assistant_tail

    def header(self, previous: Role | None, role: Role) -> str | None:
        """The text a ``role`` message starts with after a ``previous`` message, if learnable."""
        key = (previous, role)
        if key not in self._headers:
            base_text = self.base_text(previous)
            text = self.render_after(previous, (probe_message(role),), gen=False)
            at = text.find(SENTINEL, len(base_text))
            header = text[len(base_text) : at] if at >= 0 and text.startswith(base_text) else None
            self._headers[key] = header
        return self._headers[key]
