"""The renderer: the policy around the bridge, for one tokenizer and one chat template.

Each turn is bridged (:func:`.bridge.bridge`, the norm) or rendered in full (the exception,
always counted): a turn the bridge cannot express, one whose check found the template text
wrong, or every turn in ``TemplateMode.FULL_RENDER``. A full render is returned as a
``FullPrompt`` with its reason; the tree then decides whether the ids still extend the path or
start a new sample. A failed check concerns its own turn only: renderer state shared by all
sessions (caches, counters) never changes how a turn is rendered.

What the renderer decides, and nothing else: the mode (at construction the template is audited
and its verdict enforced: a template the bridge cannot serve exactly is refused with
:class:`~protocol_adapters._audit.TemplateRefused` unless the mode covers it, and then every turn
records the mode), which turns the sampled check compares whole (``check_sample_rate``), which
differences are served, the fallback, the counters (:attr:`Renderer.stats`), the clock a
time-dependent template sees (one instant per session) and the cache of template contexts.

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
from array import array
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from protocol_adapters._audit.audit import audit_template
from protocol_adapters._audit.verdict import TemplateAudit, TemplateMode, enforce
from protocol_adapters._template.context import Slot, TemplateContext
from protocol_adapters._template.messages import call_names
from protocol_adapters._template.template import ChatTemplate, TemplateError
from protocol_adapters._tokenizer import TooManyTokens, Vocabulary
from protocol_adapters._types import AdapterError, ErrorKind
from trajectory_tree import BridgedPrompt, FullPrompt, Message, Prompt, Route, SessionTree

from .bridge import NotBridgeable, PromptTooLong, bridge, encode_within
from .check import Mismatch, Place
from .notes import (
    FAILED_CHECK,
    FULL_RENDER_MODE,
    PROBE_REFUSED,
    TEMPLATE_CLOCK,
    TEMPLATE_DEVIATIONS,
    TEMPLATE_MODE,
)
from .stats import BridgeStats, StatsRecorder


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
    """What to record (``prompt``), what to send (``ids``: the full prompt token ids, an
    ``array('i')``: compare with ``ids.tolist()``), and the notes every turn keeps about how its
    prompt was made (``TurnMeta.extra``)."""

    prompt: BridgedPrompt | FullPrompt
    ids: array[int]
    checked: bool = False
    notes: Mapping[str, str] = field(default_factory=dict)


class Renderer:
    """Prompt construction for one tokenizer and one chat template.

    Raises :class:`~protocol_adapters._audit.TemplateRefused` when the template's audit does
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
        self._drops_reasoning = self.audit.drops_reasoning
        self._parallel_calls_refusal = self.audit.parallel_calls_refusal
        self._generation_prompt_differs = self.audit.generation_prompt_differs
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
            turn = bridge(
                route,
                self._context(prompt, now),
                self.vocabulary,
                check=self._sample_check(),
                drops_reasoning=self._drops_reasoning,
                max_tokens=max_tokens,
            )
        except NotBridgeable as exc:
            return self._full(prompt, exc.reason, max_tokens, now)
        except TemplateError:  # a probe, or the request itself: the full render tells which
            return self._full(prompt, PROBE_REFUSED, max_tokens, now)
        mismatch = turn.mismatch
        if mismatch is not None and not self._keeps(mismatch):
            # The bridge got the template's text wrong on this turn: this turn is rendered in
            # full, with the reason in its notes. Nothing else changes: one session's request
            # (an option the audit did not try, say) never decides how another is rendered.
            self._stats.checked(mismatch.reason, kept=False)
            return self._full(prompt, FAILED_CHECK, max_tokens, now, mismatch)
        if turn.checked:
            self._stats.checked(mismatch.reason if mismatch else None, kept=mismatch is not None)
        elif mismatch is not None:
            self._stats.kept(mismatch.reason)
        self._stats.bridged()
        notes = {**self._turn_notes(now, None), **turn.notes}
        return RenderedPrompt(turn.prompt, turn.ids, turn.checked, notes)

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
        history_ids, _ = encode_within(self.vocabulary, history, max_tokens, len(gen_ids))
        ids = history_ids + gen_ids
        self._stats.fallback(reason)
        notes = self._turn_notes(now, mismatch)
        return RenderedPrompt(FullPrompt(ids, len(gen_ids), reason), array("i", ids), notes=notes)

    def _keeps(self, mismatch: Mismatch) -> bool:
        """Whether a bridged prompt with this difference is still served: the model's own
        output always (the engine's ids are the truth), a generation prompt history renders
        differently only when the user accepted that deviation."""
        if mismatch.place is Place.OUTPUT:
            return True
        return (
            mismatch.place is Place.GENERATION_PROMPT
            and self.config.mode is TemplateMode.ACCEPT_DEVIATIONS
            and self._generation_prompt_differs
        )

    def _refuse_parallel_calls(self, route: Route) -> None:
        """A template that refuses assistant turns with several calls refuses the request, even
        where the bridge would not render that turn: its prompt has no template render."""
        refusal = self._parallel_calls_refusal
        if refusal is None:
            return
        previous = route.previous
        turns = [*route.new_messages, *([previous] if previous is not None else [])]
        if any(len(m.tool_calls) > 1 for m in turns):
            raise AdapterError(
                ErrorKind.INVALID_REQUEST,
                f"the chat template {refusal.feature}: {refusal.detail}",
            )

    def _turn_notes(self, now: datetime | None, mismatch: Mismatch | None) -> dict[str, str]:
        notes = dict(self._notes)
        if now is not None:
            notes[TEMPLATE_CLOCK] = now.isoformat()
        if mismatch is not None:
            key, reason = mismatch.note()
            notes[key] = reason
        return notes

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


def _refused_as_request_error(context: TemplateContext, messages: Sequence[Message]) -> str:
    """The full render, or the template's refusal as the client's error (its own words)."""
    try:
        return context.render(messages, add_generation_prompt=True)
    except TemplateError as exc:
        raise AdapterError(
            ErrorKind.INVALID_REQUEST, f"the chat template refuses this conversation: {exc}"
        ) from None
