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

from trajectory_tree import LossReason, Message, Prompt, Role, Text, ToolCall

from .messages import (
    ToolResultNames,
    call_names,
    template_messages,
    template_options,
    template_tools,
)
from .template import ChatTemplate, TemplateError

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

    def append(self, messages: Sequence[Message], matched: int) -> Appended | None:
        """What the template writes for ``messages[matched:]`` (a turn's new messages) after
        their real predecessor, learned from probes ending like it; None when it does not render
        them as an append (then only a full render is right). Raises :class:`TemplateError`
        when the template refuses a probe or the messages."""
        names = names_for(messages, matched)
        last = Slot.of(messages, len(messages) - 1, names)
        new = messages[matched:]
        if not new:
            return Appended("", self.generation_prompt(last), [], last, names)
        previous = Slot.of(messages, matched - 1, names) if matched else None
        text = bridge_text(self, previous, new, last, names)
        if text is None:
            return None
        slots = [
            previous,
            *(Slot.of(messages, i, names) for i in range(matched, len(messages) - 1)),
        ]
        labels = label_text(self, slots, new, text.body, names)
        return Appended(text.body, text.generation, labels, last, names)

    def reply_text(
        self, messages: Sequence[Message], index: int, names: Mapping[str, str]
    ) -> str | None:
        """``messages[index]`` (a reply) as the template renders it in history, after a probe
        ending like the message before it; None when no probe can tell."""
        before = Slot.of(messages, index - 1, names) if index >= 1 else None
        try:
            base = self.base_text(before)
            rendered = self.render_after(before, (messages[index],), gen=False, names=names)
        except TemplateError:
            return None
        return rendered[len(base) :] if rendered.startswith(base) else None

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
class Appended:
    """A turn's new messages as the template writes them (:meth:`TemplateContext.append`):
    ``body``, then ``generation`` (the generation prompt after ``last``, the slot of the last
    message); ``labels``: loss reasons over ``body`` (:func:`label_text`); ``names``: the
    functions the new tool results answer."""

    body: str
    generation: str
    labels: list[tuple[int, LossReason]]
    last: Slot
    names: Mapping[str, str]


def names_for(messages: Sequence[Message], matched: int) -> dict[str, str]:
    """Function names of the calls the new messages' tool results answer: found by walking
    back from the last matched message (the calls are in the turns just before)."""
    wanted = {m.tool_call_id for m in messages[matched:] if m.tool_call_id is not None}
    names = call_names(messages[matched:])
    wanted -= names.keys()
    index = matched - 1
    while wanted and index >= 0:
        for call in messages[index].tool_calls:
            if call.id in wanted:
                names[call.id] = call.name
                wanted.discard(call.id)
        index -= 1
    return names


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


# -- loss labels of the bridged text ------------------------------------------------------------
# All of it is loss 0: the labels only answer "why wasn't this trained?". Tool results are
# ``tool_output``, other messages ``context``, and the short template text around a message's
# content (role headers, ``<|im_end|>``, ``<tool_response>`` tags) ``template_scaffold``.
#
# Message boundaries are found without assuming anything about the template: each message is
# rendered alone after a probe conversation ending like its predecessor, and the longest prefix
# of that piece found at the current position of the real text is the message's region. A
# template that groups consecutive tool results (one ``<|im_end|>`` after the last) still splits
# right: the lone rendering's closing tag is simply where the match stops. Labels never decide
# tokens: a template that refuses one of the small label probes gets coarser labels, not an error.

MAX_SCAFFOLD_CHARS = 64
"""Template text around a message longer than this (a system prompt, a tools block) is context."""


def common_prefix_at(text: str, start: int, piece: str) -> int:
    """Length of the longest prefix of ``piece`` that ``text`` has at ``start``."""
    limit = min(len(piece), len(text) - start)
    if text.startswith(piece[:limit], start):
        return limit
    low, high = 0, limit  # a prefix of length `low` matches, of length `high` does not
    while high - low > 1:
        middle = (low + high) // 2
        if text.startswith(piece[:middle], start):
            low = middle
        else:
            high = middle
    return low


def message_regions(
    context: TemplateContext,
    slots: Sequence[Slot | None],
    messages: Sequence[Message],
    text: str,
    names: Mapping[str, str],
) -> list[tuple[int, int]]:
    """``[start, end)`` of each message in ``text`` (the rendering of ``messages``, each after
    the message of ``slots[i]``); the last region runs to the end of ``text``."""
    if len(messages) == 1:
        return [(0, len(text))]
    regions: list[tuple[int, int]] = []
    cursor = 0
    for slot, message in zip(slots, messages, strict=True):
        base = context.base_text(slot)
        alone = context.render_after(slot, (message,), gen=False, names=names)
        piece = alone[common_prefix_at(alone, 0, base) :]
        end = cursor + common_prefix_at(text, cursor, piece)
        regions.append((cursor, end))
        cursor = end
    if regions:
        start, _ = regions[-1]
        regions[-1] = (start, len(text))
    return regions


def _scaffold_or(reason: LossReason, length: int) -> LossReason:
    return LossReason.TEMPLATE_SCAFFOLD if length <= MAX_SCAFFOLD_CHARS else reason


def label_text(
    context: TemplateContext,
    slots: Sequence[Slot | None],
    messages: Sequence[Message],
    text: str,
    names: Mapping[str, str],
) -> list[tuple[int, LossReason]]:
    """``(end, reason)`` character spans covering ``text`` in order; ``slots[i]`` is the slot
    ``messages[i]`` follows. A template that refuses a label probe gets one span per reason."""
    try:
        return _label_text(context, slots, messages, text, names)
    except (TemplateError, ValueError):
        tools_only = all(m.role == "tool" for m in messages)
        return [(len(text), LossReason.TOOL_OUTPUT if tools_only else LossReason.CONTEXT)]


def _label_text(
    context: TemplateContext,
    slots: Sequence[Slot | None],
    messages: Sequence[Message],
    text: str,
    names: Mapping[str, str],
) -> list[tuple[int, LossReason]]:
    spans: list[tuple[int, LossReason]] = []
    regions = message_regions(context, slots, messages, text, names)
    for slot, message, (start, end) in zip(slots, messages, regions, strict=True):
        reason = LossReason.TOOL_OUTPUT if message.role == "tool" else LossReason.CONTEXT
        # Before the first message of a conversation sit the system prompt and tools block.
        head_reason = LossReason.CONTEXT if slot is None else reason
        header = context.header(slot, message.role)
        content_from = start
        if header is not None and text.startswith(header, start):
            content_from = start + len(header)
        content = message.plain_text if message.role != "assistant" else ""
        # Searched for past the header and within the region (empty content is found there)
        at = text.find(content, min(content_from, end), end)
        if message.role == "assistant" or (content and at < 0):
            spans.append((end, reason))
        else:
            spans.append((at, _scaffold_or(head_reason, at - start)))
            spans.append((at + len(content), reason))
            spans.append((end, _scaffold_or(reason, end - at - len(content))))
    return [span for i, span in enumerate(spans) if span[0] > (spans[i - 1][0] if i else 0)]
