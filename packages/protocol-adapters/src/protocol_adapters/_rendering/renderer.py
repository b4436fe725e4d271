"""The renderer: prompt ids for a routed request, bridged onto the tree's tokens when provable.

Bridged path (the norm): ``route.prefix_ids()`` (earlier output verbatim) + the closing scaffold
owed after that output + the new messages rendered after a probe conversation that ends like
their real predecessor + the generation prompt. Only the new messages are rendered and encoded,
so the cost of a turn does not grow with the context.

Full path (the exception, always counted): a turn whose check failed, a request the bridge
cannot express, or every turn in ``TemplateMode.FULL_RENDER``, is rendered whole and returned as
a ``FullPrompt`` with its reason; the tree then decides whether the ids still extend the path or
start a new sample. A failed check concerns its own turn only: renderer state shared by all
sessions (caches, counters) never changes how a turn is rendered.

At construction the template is audited (:mod:`.audit`) and its verdict enforced against the
configured :class:`TemplateMode`: a template the bridge cannot serve exactly is refused
(:class:`TemplateRefused`) unless the mode covers it, and then every turn records the mode in
:attr:`RenderedPrompt.notes`. A template that prints the clock sees one instant per session.

Check mode compares a sample of bridged turns (``check_sample_rate``) with the template's own
render, the whole prompt included (:mod:`.check`); every difference is recorded with its reason
in the turn's notes and counted in :attr:`Renderer.stats`.

A prompt over the caller's token limit is refused (:class:`PromptTooLong`) as soon as encoding
passes the limit: a 20 MB request is not tokenized to the end only to be refused.

Thread safety: :meth:`Renderer.render`, :meth:`Renderer.render_full` and
:meth:`Renderer.count_tokens` are synchronous, CPU-bound and safe to call from several worker
threads at once (``asyncio.to_thread``). Shared state is limited to caches with idempotent writes
and lock-protected counters. ``render`` reads the route's path; the tree is append-only, so that
read is safe while the event loop records other turns of the session.
"""

from __future__ import annotations

import random
import threading
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from protocol_adapters._tokenizer import TooManyTokens, Vocabulary
from protocol_adapters._types import AdapterError, ErrorKind
from trajectory_tree import (
    Block,
    BridgedPrompt,
    FullPrompt,
    LossReason,
    Message,
    Prompt,
    Reasoning,
    Route,
    Segment,
    SessionTree,
    Text,
    ToolCall,
)

from .audit import PARALLEL_CALLS_REFUSED, audit_template
from .check import Mismatch, Place, check_bridge, check_reply
from .conversation import Slot, TemplateContext, bridge_text
from .diagnosis import GENERATION_PROMPT_DIFFERS, REASONING_DROPPED, REASONING_NEVER_RENDERED
from .scaffold import closing_scaffold
from .segments import label_text, segment_ids
from .stats import BridgeStats, StatsRecorder
from .template import ChatTemplate, TemplateError
from .template_messages import call_names
from .verdict import TemplateAudit, TemplateMode, enforce

FAILED_CHECK = "the chat template failed the bridge check"
ENDS_ON_REPLY = "the request ends on the model's own reply"
NOT_AN_APPEND = "the chat template does not render new messages as an append after a {role} message"
PROBE_REFUSED = "the chat template refused a probe conversation"
FULL_RENDER_MODE = "the template is served in full-render mode"

TEMPLATE_MODE = "template_mode"
"""Turn note: the mode a template is served in, when the user chose one beyond ``exact``."""
TEMPLATE_DEVIATIONS = "template_deviations"
"""Turn note: the deviations from the template's render the user accepted."""
TEMPLATE_CLOCK = "template_clock"
"""Turn note: the instant a time-dependent template sees for the whole session (ISO 8601)."""
PROMPT_MISMATCH = "prompt_mismatch"
"""Turn note: why the check found the bridged prompt's template text different from the
template's render (``trajectory_tree.summarize`` counts it in ``prompt_mismatches``)."""
OUTPUT_KEPT = "output_kept"
"""Turn note: an earlier reply is kept as the engine generated it where the template renders it
differently; expected, not a fault (``summarize`` counts it in ``outputs_kept``)."""


class PromptTooLong(Exception):
    """The prompt holds more tokens than the caller allowed: at least ``tokens`` (encoding stopped
    once the limit was passed, so the true count may be larger)."""

    def __init__(self, tokens: int) -> None:
        super().__init__(f"the prompt holds at least {tokens} tokens")
        self.tokens = tokens


@dataclass(frozen=True, slots=True)
class RendererConfig:
    """``check_sample_rate``: fraction of bridged turns verified against a full render (1.0 in
    tests); a turn the check finds wrong is rendered in full and says why, and no other turn,
    of this session or another, is changed by it: what a template may be served as is decided
    once, at load, by its audit. ``mode``: how far the template may be from bridge-exact (see
    :class:`TemplateMode`); the default serves only templates the bridge reproduces exactly."""

    check_sample_rate: float = 0.01
    seed: int | None = None
    context_cache_size: int = 16
    mode: TemplateMode = TemplateMode.EXACT

    def __post_init__(self) -> None:
        if not 0.0 <= self.check_sample_rate <= 1.0:
            raise ValueError("check_sample_rate must lie in [0, 1]")
        if self.context_cache_size < 1:
            raise ValueError("context_cache_size must be at least 1")
        object.__setattr__(self, "mode", TemplateMode(self.mode))


@dataclass(frozen=True, slots=True)
class RenderedPrompt:
    """What to record (``prompt``), what to send (``ids``: the full prompt token ids), and the
    notes every turn keeps about how its prompt was made (``TurnMeta.extra``)."""

    prompt: BridgedPrompt | FullPrompt
    ids: list[int]
    checked: bool = False
    notes: Mapping[str, str] = field(default_factory=dict)


class Renderer:
    """Prompt construction for one tokenizer and one chat template.

    Raises :class:`~protocol_adapters._rendering.TemplateRefused` when the template's audit does
    not allow ``config.mode``.
    """

    def __init__(
        self,
        vocabulary: Vocabulary,
        template: ChatTemplate,
        config: RendererConfig | None = None,
    ) -> None:
        self.vocabulary = vocabulary
        self.template = template
        self.config = config or RendererConfig()
        self.audit: TemplateAudit = audit_template(template)
        enforce(self.audit, self.config.mode)
        self._drops_reasoning = any(
            f.feature in (REASONING_DROPPED, REASONING_NEVER_RENDERED) for f in self.audit.findings
        )
        self._notes: dict[str, str] = {}
        if self.config.mode is not TemplateMode.EXACT:
            self._notes[TEMPLATE_MODE] = self.config.mode.value
            if self.audit.deviations():
                self._notes[TEMPLATE_DEVIATIONS] = self.audit.deviations()
        self._stats = StatsRecorder(template.name)
        self._lock = threading.Lock()
        self._random = random.Random(self.config.seed)
        self._contexts: OrderedDict[tuple[object, ...], TemplateContext] = OrderedDict()
        self._clocks: weakref.WeakKeyDictionary[SessionTree, datetime] = weakref.WeakKeyDictionary()

    @property
    def stats(self) -> BridgeStats:
        return self._stats.snapshot()

    # -- public entry points -----------------------------------------------------------------------

    def render(self, route: Route, max_tokens: int | None = None) -> RenderedPrompt:
        """Prompt ids for ``route``: bridged when provable, else a counted full render.

        Raises :class:`PromptTooLong` once the prompt is known to hold more than ``max_tokens``,
        and an ``INVALID_REQUEST`` :class:`AdapterError` when the template refuses the request.
        """
        prompt = route.prompt
        if not prompt.messages:
            raise AdapterError(ErrorKind.INVALID_REQUEST, "the conversation has no messages")
        now = self._clock(route.tree)
        if self.config.mode is TemplateMode.FULL_RENDER:
            return self._full(prompt, FULL_RENDER_MODE, max_tokens, now)
        self._refuse_parallel_calls(route)
        try:
            return self._bridge(route, max_tokens, now)
        except TemplateError:  # a probe, or the request itself: the full render tells which
            return self._full(prompt, PROBE_REFUSED, max_tokens, now)

    def render_full(
        self, prompt: Prompt, reason: str, max_tokens: int | None = None
    ) -> RenderedPrompt:
        """The whole conversation rendered and encoded; counted under ``reason``. Raises
        :class:`PromptTooLong` once the prompt is known to hold more than ``max_tokens``."""
        return self._full(prompt, reason, max_tokens, None)

    def count_tokens(self, prompt: Prompt, max_tokens: int | None = None) -> int:
        """Prompt tokens of ``prompt`` rendered in full with the generation prompt (what
        ``/v1/messages/count_tokens`` answers), counted exactly in bounded memory. Raises
        :class:`PromptTooLong` once more than ``max_tokens`` are known: counting a prompt the
        adapter could never serve costs no more than the limit."""
        context = self._context(prompt, None)
        text = _refused_as_request_error(context, prompt.messages)
        try:
            return self.vocabulary.count(text, max_tokens=max_tokens)
        except TooManyTokens as exc:
            raise PromptTooLong(exc.counted) from None

    # -- internals ------------------------------------------------------------------------------

    def _bridge(self, route: Route, max_tokens: int | None, now: datetime | None) -> RenderedPrompt:
        prompt = route.prompt
        messages = prompt.messages
        context = self._context(prompt, now)
        turn = route.previous_generated
        new = route.new_messages
        names = _names_for(messages, route.matched)
        last = Slot.of(messages, len(messages) - 1, names)
        if not new:
            if turn is not None:
                return self._full(prompt, ENDS_ON_REPLY, max_tokens, now)
            generation = self._generation_ids(context, last)
            return self._bridged(route, BridgedPrompt((), generation), now)

        previous = Slot.of(messages, route.matched - 1, names) if route.matched else None
        text = bridge_text(context, previous, new, last, names)
        if text is None:
            role = previous.role if previous is not None else None
            return self._full(prompt, NOT_AN_APPEND.format(role=role), max_tokens, now)

        segments: list[Segment] = []
        scaffold_ids: list[int] = []
        scaffold = ""
        if turn is not None:
            tail = context.assistant_tail()
            scaffold = closing_scaffold(tail, route.tree.output_ids(turn), self.vocabulary)
            scaffold_ids = self.vocabulary.encode(scaffold)
            if scaffold_ids:
                segments.append(Segment(LossReason.TEMPLATE_SCAFFOLD, scaffold_ids))
        generation_ids = self._generation_ids(context, last)
        around = route.prefix_length + len(scaffold_ids) + len(generation_ids)
        ids, offsets = self._encode_within(text.body, max_tokens, around)
        slots = [
            previous,
            *(Slot.of(messages, i, names) for i in range(route.matched, len(messages) - 1)),
        ]
        labels = label_text(context, slots, new, text.body, names)
        message_segments = segment_ids(ids, offsets, labels)
        segments.extend(message_segments)
        bridged = BridgedPrompt(tuple(segments), generation_ids)

        if not self._sample_check():
            reply = check_reply(route, context, self.vocabulary, scaffold, names)
            if reply is not None and not self._keeps(reply):
                return self._failed(prompt, max_tokens, now, reply)
            if reply is not None:
                self._stats.kept(reply.reason)
            return self._bridged(route, bridged, now, mismatch=reply)
        new_ids = [i for s in message_segments for i in s.ids] + list(generation_ids)
        sent = self._ids(route, bridged)
        new_text = text.body + text.generation
        mismatch = check_bridge(
            route, context, self.vocabulary, scaffold_ids, new_ids, sent, new_text
        )
        if mismatch is not None and not self._keeps(mismatch):
            return self._failed(prompt, max_tokens, now, mismatch)
        self._stats.checked(mismatch.reason if mismatch else None, kept=mismatch is not None)
        return self._bridged(route, bridged, now, checked=True, mismatch=mismatch)

    def _failed(
        self, prompt: Prompt, max_tokens: int | None, now: datetime | None, mismatch: Mismatch
    ) -> RenderedPrompt:
        """The bridge got the template's text wrong on this turn: this turn is rendered in full,
        with the reason in its notes. Nothing else changes: one session's request (an option the
        audit did not try, say) never decides how another session is rendered."""
        self._stats.checked(mismatch.reason, kept=False)
        return self._full(prompt, FAILED_CHECK, max_tokens, now, mismatch)

    def _full(
        self,
        prompt: Prompt,
        reason: str,
        max_tokens: int | None,
        now: datetime | None,
        mismatch: Mismatch | None = None,
    ) -> RenderedPrompt:
        context = self._context(prompt, now)
        text = _refused_as_request_error(context, prompt.messages)
        last = Slot.of(prompt.messages, len(prompt.messages) - 1, call_names(prompt.messages))
        generation = context.generation_prompt_or_none(last)
        if generation is not None and text.endswith(generation):
            history = text[: len(text) - len(generation)]
        else:
            history, generation = text, ""  # the header counts as history: loss 0 either way
        gen_ids = self.vocabulary.encode(generation)
        history_ids, _ = self._encode_within(history, max_tokens, len(gen_ids))
        ids = history_ids + gen_ids
        self._stats.fallback(reason)
        notes = self._turn_notes(now, mismatch)
        return RenderedPrompt(FullPrompt(ids, len(gen_ids), reason), ids, notes=notes)

    def _keeps(self, mismatch: Mismatch) -> bool:
        """Whether a bridged prompt with this difference is still served: the model's own
        output always (the engine's ids are the truth), a generation prompt history renders
        differently only when the user accepted that deviation."""
        if mismatch.place is Place.OUTPUT:
            return True
        return (
            mismatch.place is Place.GENERATION_PROMPT
            and self.config.mode is TemplateMode.ACCEPT_DEVIATIONS
            and any(f.feature.startswith(GENERATION_PROMPT_DIFFERS) for f in self.audit.findings)
        )

    def _refuse_parallel_calls(self, route: Route) -> None:
        """A template that refuses assistant turns with several calls refuses the request, even
        where the bridge would not render that turn: its prompt has no template render."""
        if self.audit.parallel_calls:
            return
        previous = route.previous
        turns = [*route.new_messages, *([previous] if previous is not None else [])]
        if any(len(m.tool_calls) > 1 for m in turns):
            refusal = next(f for f in self.audit.findings if f.feature == PARALLEL_CALLS_REFUSED)
            raise AdapterError(
                ErrorKind.INVALID_REQUEST,
                f"the chat template {refusal.feature}: {refusal.detail}",
            )

    def _encode_within(
        self, text: str, max_tokens: int | None, around: int
    ) -> tuple[list[int], list[tuple[int, int]]]:
        """Ids and offsets of ``text``, whose prompt holds ``around`` more tokens; raises
        :class:`PromptTooLong` as soon as the whole is known to pass ``max_tokens``."""
        if max_tokens is None:
            return self.vocabulary.encode_with_offsets(text)
        if around > max_tokens:
            raise PromptTooLong(around)
        try:
            return self.vocabulary.encode_with_offsets(text, max_tokens=max_tokens - around)
        except TooManyTokens as exc:
            raise PromptTooLong(around + exc.counted) from None

    @staticmethod
    def _ids(route: Route, bridged: BridgedPrompt) -> list[int]:
        ids = route.prefix_ids().tolist()
        for segment in bridged.segments:
            ids.extend(segment.ids)
        ids.extend(bridged.generation_prompt)
        return ids

    def _bridged(
        self,
        route: Route,
        bridged: BridgedPrompt,
        now: datetime | None,
        *,
        checked: bool = False,
        mismatch: Mismatch | None = None,
    ) -> RenderedPrompt:
        self._stats.bridged()
        notes = self._turn_notes(now, mismatch)
        if OUTPUT_KEPT not in notes:
            kept = self._reasoning_kept(route, now) or _kept_on_path(route)
            if kept is not None:
                notes[OUTPUT_KEPT] = kept
        return RenderedPrompt(bridged, self._ids(route, bridged), checked, notes)

    def _reasoning_kept(self, route: Route, now: datetime | None) -> str | None:
        """:data:`REASONING_KEPT` when this template leaves out the reasoning of a reply the
        engine generated on ``route``'s path (the bridged prompt keeps it, as generated): a
        template that drops earlier reasoning, or one that never renders it (whose reply check
        may name another difference first, an accepted generation prompt's). Told
        by rendering the conversation's skeleton (short stand-ins for every text, a marker for
        every reasoning): the template decides by the conversation's shape, so this costs the
        number of messages, not their length, and runs on every turn, not on sampled ones."""
        if not self._drops_reasoning:
            return None
        nodes = route.anchor.path()[1:]
        messages = route.prompt.messages[: route.matched]
        generated = {
            index
            for index, (node, message) in enumerate(zip(nodes, messages, strict=False))
            if node.turn is not None and any(isinstance(b, Reasoning) for b in message.content)
        }
        if not generated:
            return None
        skeleton = [
            _skeleton(message, index) for index, message in enumerate(route.prompt.messages)
        ]
        try:
            text = self._context(route.prompt, now).render(
                skeleton, add_generation_prompt=False, names=call_names(skeleton)
            )
        except TemplateError:
            return None
        if all(_marker(index) in text for index in generated):
            return None
        return REASONING_KEPT

    def _turn_notes(self, now: datetime | None, mismatch: Mismatch | None) -> dict[str, str]:
        notes = dict(self._notes)
        if now is not None:
            notes[TEMPLATE_CLOCK] = now.isoformat()
        if mismatch is not None:
            notes[OUTPUT_KEPT if mismatch.place is Place.OUTPUT else PROMPT_MISMATCH] = (
                mismatch.reason
            )
        return notes

    def _generation_ids(self, context: TemplateContext, slot: Slot) -> list[int]:
        ids = context.generation_ids(slot)
        if ids is None:
            ids = self.vocabulary.encode(context.generation_prompt(slot))
            context.keep_ids(slot, ids)
        return ids

    def _sample_check(self) -> bool:
        """A draw in [0, 1) below the rate: rate 1.0 checks every turn, 0.0 none."""
        with self._lock:
            return self._random.random() < self.config.check_sample_rate

    def _clock(self, tree: SessionTree) -> datetime | None:
        """The instant a time-dependent template sees for all of ``tree``'s session."""
        if not self.audit.time_dependent:
            return None
        with self._lock:
            now = self._clocks.get(tree)
            if now is None:
                now = self._clocks[tree] = datetime.now()
            return now

    def _context(self, prompt: Prompt, now: datetime | None) -> TemplateContext:
        key = (*prompt.context_key(), now)
        with self._lock:
            context = self._contexts.get(key)
            if context is not None:
                self._contexts.move_to_end(key)
                return context
        context = TemplateContext(self.template, prompt, self.audit.result_names, now)
        with self._lock:
            self._contexts[key] = context
            while len(self._contexts) > self.config.context_cache_size:
                self._contexts.popitem(last=False)
        return context


REASONING_KEPT = "the template leaves out earlier replies' reasoning; the model's is kept verbatim"
"""The :data:`OUTPUT_KEPT` note of a turn whose prompt holds reasoning the template drops."""
KEPT_EARLIER = "an output kept verbatim in an earlier turn's prompt is in this prompt too"
"""The :data:`OUTPUT_KEPT` note of every turn whose prompt extends one that kept an output (a
template that drops earlier reasoning, say): its prompt differs from the template's render for
the same reason, so it is counted too, not only the turn where the difference first showed."""


def _marker(index: int) -> str:
    return f"@@reasoning-{index}@@"


def _skeleton(message: Message, index: int) -> Message:
    """``message`` with the same shape and none of its length: texts and arguments replaced by
    stand-ins, its reasoning by a marker naming its position."""
    blocks: list[Block] = []
    for block in message.content:
        if isinstance(block, Reasoning):
            blocks.append(Reasoning(_marker(index)))
        elif isinstance(block, ToolCall):
            blocks.append(ToolCall(block.id, block.name, "{}"))
        elif isinstance(block, Text):
            blocks.append(Text("x"))
        else:
            blocks.append(block)
    return replace(message, content=tuple(blocks))


def _kept_on_path(route: Route) -> str | None:
    """:data:`KEPT_EARLIER` when a turn on ``route``'s path was noted for a kept output."""
    for node in route.anchor.path():
        if node.turn is not None and OUTPUT_KEPT in node.turn.meta.extra:
            return KEPT_EARLIER
    return None


def _names_for(messages: Sequence[Message], matched: int) -> dict[str, str]:
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


def _refused_as_request_error(context: TemplateContext, messages: Sequence[Message]) -> str:
    """The full render, or the template's refusal as the client's error (its own words)."""
    try:
        return context.render(messages, add_generation_prompt=True)
    except TemplateError as exc:
        raise AdapterError(
            ErrorKind.INVALID_REQUEST, f"the chat template refuses this conversation: {exc}"
        ) from None
