"""What a chat template does around messages, learned by rendering small probe conversations.

The bridge never asks a template to render the model's earlier output. It only needs to know, for
one request context (tools, options, the session's clock): what text comes before the new
messages given the message they follow (the *base* rendering), what the generation prompt is
after a message, how an assistant turn is closed, and what header a message of each role gets.
Each is learned by rendering a small probe conversation that ends like the real one.

The probes must be conversations every well-formed template accepts, or the bridge fails on a
template whose full render works: each starts with a user turn (never a system message in
second position), a tool result follows an assistant turn that made the call it answers (same
id and function name, so templates that look the call up find it), and a system message is
either the first message or follows an assistant turn, as the real one does.

Thread safety: a :class:`TemplateContext` caches with idempotent writes (two threads computing
the same entry store equal values), so sharing one between worker threads is safe.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from trajectory_tree import Message, Prompt, Role, Text, ToolCall

from .template import ChatTemplate, TemplateError
from .template_messages import (
    ToolResultNames,
    template_messages,
    template_options,
    template_tools,
)

SENTINEL = "\u2063probe\u2063"
"""Content of probe messages: text no real message starts or ends with."""

PROBE_CALL = ToolCall("call_probe_0", "probe", "{}")
"""A call whose id satisfies templates that keep the last 9 characters of ids (Mistral)."""


@dataclass(frozen=True, slots=True)
class Slot:
    """What the bridge must know of the message that new messages follow.

    ``leading``: it opens the conversation (a leading system prompt is special to most templates).
    ``calls``: for an assistant turn, the ``(id, name)`` of its calls; for a tool result, of the
    call it answers. ``text``: an assistant turn with text (templates render tool-call turns
    without text differently).
    """

    role: Role
    leading: bool = False
    calls: tuple[tuple[str, str], ...] = ()
    text: bool = True

    @classmethod
    def of(cls, messages: Sequence[Message], index: int, names: Mapping[str, str]) -> Slot:
        """The slot of ``messages[index]``; ``names`` maps call ids to function names."""
        message = messages[index]
        if message.role == "assistant":
            calls = tuple((c.id, c.name) for c in message.tool_calls)
            return cls("assistant", calls=calls, text=bool(message.plain_text))
        if message.role == "tool":
            call_id = message.tool_call_id or PROBE_CALL.id
            name = message.name or names.get(call_id, PROBE_CALL.name)
            return cls("tool", calls=((call_id, name),))
        return cls(message.role, leading=index == 0 and message.role == "system")

    def generic(self) -> Slot:
        """The same slot with probe calls: what the generation prompt after it depends on."""
        if not self.calls:
            return self
        return replace(self, calls=((PROBE_CALL.id, PROBE_CALL.name),) * len(self.calls))

    def base(self) -> tuple[Message, ...]:
        """A probe conversation that ends in a message of this slot."""
        user = Message.text("user", "base")
        if self.role == "system":
            if self.leading:
                return (Message.text("system", "base"),)
            return (user, Message.text("assistant", "base"), Message.text("system", "base"))
        if self.role == "assistant":
            calls = tuple(ToolCall(i, n, "{}") for i, n in self.calls)
            text = (Text("base"),) if self.text or not calls else ()
            return (user, Message("assistant", (*text, *calls)))
        if self.role == "tool":
            ((call_id, name),) = self.calls or ((PROBE_CALL.id, PROBE_CALL.name),)
            call = ToolCall(call_id, name, "{}")
            return (
                user,
                Message("assistant", (call,)),
                Message("tool", (Text("base"),), tool_call_id=call_id),
            )
        return (user,)


class NotAnAppend(ValueError):
    """The generation prompt changes the text before it (it is not an append)."""


USER = Slot("user")
ASSISTANT = Slot("assistant")
TOOL = Slot("tool", calls=((PROBE_CALL.id, PROBE_CALL.name),))


def probe_message(slot: Slot) -> Message:
    """A message of ``slot`` whose content is the sentinel."""
    if slot.role == "tool":
        ((call_id, _),) = slot.calls or ((PROBE_CALL.id, PROBE_CALL.name),)
        return Message("tool", (Text(SENTINEL),), tool_call_id=call_id)
    return Message.text(slot.role, SENTINEL)


class TemplateContext:
    """A template bound to one request context (tools, options, the session's clock), with its
    probe results cached. ``result_names``: the audit's choice of tool results' names; ``now``
    freezes ``strftime_now`` (None: the real clock)."""

    def __init__(
        self,
        template: ChatTemplate,
        prompt: Prompt,
        result_names: ToolResultNames = ToolResultNames.FROM_CALLS,
        now: datetime | None = None,
    ) -> None:
        self.template = template
        self.tools = template_tools(tuple(prompt.tools))
        self.options: Mapping[str, Any] = template_options(prompt.options)
        self.result_names = result_names
        self.now = now
        self._base_text: dict[Slot, str] = {}
        self._headers: dict[tuple[Slot | None, Role], str | None] = {}
        self._generation_prompts: dict[Slot, str] = {}
        self._generation_ids: dict[Slot, list[int]] = {}
        self._assistant_tail: str | None = None

    def render(
        self,
        messages: Sequence[Message],
        *,
        add_generation_prompt: bool,
        names: Mapping[str, str] | None = None,
    ) -> str:
        """The template's text; ``names`` names tool results whose calls precede ``messages``
        (when the template needs them named)."""
        return self.template.render_raw(
            template_messages(messages, names, self.result_names),
            self.tools,
            self.options,
            add_generation_prompt=add_generation_prompt,
            now=self.now,
        )

    def base_text(self, slot: Slot | None) -> str:
        """The rendering of the probe conversation ending in ``slot`` ("" when there is none)."""
        if slot is None:
            return ""
        text = self._base_text.get(slot)
        if text is None:
            text = self.render(slot.base(), add_generation_prompt=False)
            if slot.calls == slot.generic().calls:  # real call ids change every turn
                self._base_text[slot] = text
        return text

    def render_after(
        self,
        slot: Slot | None,
        messages: Sequence[Message],
        *,
        gen: bool,
        names: Mapping[str, str] | None = None,
    ) -> str:
        """Render base(slot) + messages; the caller strips :meth:`base_text` (and checks it)."""
        base = slot.base() if slot is not None else ()
        return self.render((*base, *messages), add_generation_prompt=gen, names=names)

    def generation_prompt(self, slot: Slot) -> str:
        """The text ``add_generation_prompt`` appends after a message of ``slot``.

        Raises :class:`NotAnAppend` when it is not an append (the template changes earlier text).
        """
        key = slot.generic()
        found = self._generation_prompts.get(key)
        if found is None:
            base = key.base()
            plain = self.render(base, add_generation_prompt=False)
            with_prompt = self.render(base, add_generation_prompt=True)
            if not with_prompt.startswith(plain):
                raise NotAnAppend(
                    f"chat template {self.template.name!r}: the generation prompt after a "
                    f"{slot.role} message is not an append"
                )
            found = with_prompt[len(plain) :]
            self._generation_prompts[key] = found
        return found

    def generation_prompt_or_none(self, slot: Slot) -> str | None:
        """:meth:`generation_prompt`, or None when it is not an append or a probe is refused."""
        try:
            return self.generation_prompt(slot)
        except (ValueError, TemplateError):
            return None

    def generation_ids(self, slot: Slot) -> list[int] | None:
        """Cached ids of :meth:`generation_prompt` (set by the renderer with :meth:`keep_ids`)."""
        return self._generation_ids.get(slot.generic())

    def keep_ids(self, slot: Slot, ids: list[int]) -> None:
        self._generation_ids[slot.generic()] = ids

    def assistant_tail(self) -> str:
        """What the template writes after an assistant message's content (``<|im_end|>\\n``)."""
        if self._assistant_tail is None:
            text = self.render(
                (Message.text("user", "base"), probe_message(ASSISTANT)),
                add_generation_prompt=False,
            )
            at = text.rfind(SENTINEL)
            if at < 0:
                raise ValueError(f"chat template {self.template.name!r} drops assistant content")
            self._assistant_tail = text[at + len(SENTINEL) :]
        return self._assistant_tail

    def header(self, previous: Slot | None, role: Role) -> str | None:
        """The text a ``role`` message starts with after a ``previous`` message, if learnable."""
        key = (previous.generic() if previous is not None else None, role)
        if key not in self._headers:
            base_text = self.base_text(key[0])
            probe = probe_message(Slot(role))
            text = self.render_after(key[0], (probe,), gen=False)
            at = text.find(SENTINEL, len(base_text))
            header = text[len(base_text) : at] if at >= 0 and text.startswith(base_text) else None
            self._headers[key] = header
        return self._headers[key]


@dataclass(frozen=True, slots=True)
class BridgeText:
    """The text the bridge sends after the base: ``body`` (the new messages) and ``generation``
    (the generation prompt after the last of them)."""

    body: str
    generation: str


def bridge_text(
    context: TemplateContext,
    previous: Slot | None,
    new: Sequence[Message],
    last: Slot,
    names: Mapping[str, str] | None = None,
) -> BridgeText | None:
    """The new messages rendered after a probe ending like their real predecessor, or None when
    the template does not render them as an append to it (then only a full render is right)."""
    text = context.render_after(previous, new, gen=True, names=names)
    base = context.base_text(previous)
    generation = context.generation_prompt(last)
    if not (
        text.startswith(base)
        and text.endswith(generation)
        and len(text) >= len(base) + len(generation)
    ):
        return None
    return BridgeText(text[len(base) : len(text) - len(generation)], generation)
