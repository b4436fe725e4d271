"""The renderer: prompt ids for a routed request, bridged onto the tree's tokens when provable.

Bridged path (the norm): ``route.prefix_ids()`` (earlier output verbatim) + the closing scaffold
owed after that output + the new messages rendered after a probe conversation whose last role
matches the real predecessor + the generation prompt. Only the new messages are rendered and
encoded, so the cost of a turn does not grow with the context.

Full path (the exception, always counted): a template whose check failed, or a request the
bridge cannot express, is rendered whole and returned as a ``FullPrompt`` with its reason; the
tree then decides whether the ids still extend the path or start a new sample.

Check mode re-renders the whole conversation for a sample of turns (``check_sample_rate``) and
compares the bridged ids with the same region of the full render's ids: everything after the
previous message, plus the template's closing of the previous assistant turn.

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
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from protocol_adapters.tokenizer import TooManyTokens, Vocabulary
from protocol_adapters.types import AdapterError, ErrorKind
from trajectory_tree import BridgedPrompt, FullPrompt, LossReason, Prompt, Route, Segment

from .conversation import TemplateContext
from .scaffold import closing_scaffold
from .segments import label_text, segment_ids
from .stats import BridgeStats, StatsRecorder
from .template import ChatTemplate

FAILED_CHECK = "the chat template failed the bridge check"
ENDS_ON_REPLY = "the request ends on the model's own reply"
NOT_AN_APPEND = "the chat template does not render new messages as an append after a {role} message"


class PromptTooLong(Exception):
    """The prompt holds more tokens than the caller allowed: at least ``tokens`` (encoding stopped
    once the limit was passed, so the true count may be larger)."""

    def __init__(self, tokens: int) -> None:
        super().__init__(f"the prompt holds at least {tokens} tokens")
        self.tokens = tokens


@dataclass(frozen=True, slots=True)
class RendererConfig:
    """``check_sample_rate``: fraction of bridged turns verified against a full render (1.0 in
    tests). ``fallback_after_mismatch``: after one failed check, render every later turn in full
    (the template has shown it rewrites history; bridging it would train on unproven tokens)."""

    check_sample_rate: float = 0.01
    fallback_after_mismatch: bool = True
    seed: int | None = None
    context_cache_size: int = 16

    def __post_init__(self) -> None:
        if not 0.0 <= self.check_sample_rate <= 1.0:
            raise ValueError("check_sample_rate must lie in [0, 1]")
        if self.context_cache_size < 1:
            raise ValueError("context_cache_size must be at least 1")


@dataclass(frozen=True, slots=True)
class RenderedPrompt:
    """What to record (``prompt``) and what to send (``ids``: the full prompt token ids)."""

    prompt: BridgedPrompt | FullPrompt
    ids: list[int]
    checked: bool = False


class Renderer:
    """Prompt construction for one tokenizer and one chat template."""

    def __init__(
        self,
        vocabulary: Vocabulary,
        template: ChatTemplate,
        config: RendererConfig | None = None,
    ) -> None:
        self.vocabulary = vocabulary
        self.template = template
        self.config = config or RendererConfig()
        self._stats = StatsRecorder(template.name)
        self._proven = True
        self._lock = threading.Lock()
        self._random = random.Random(self.config.seed)
        self._contexts: OrderedDict[tuple[str, ...], TemplateContext] = OrderedDict()

    @property
    def stats(self) -> BridgeStats:
        return self._stats.snapshot()

    @property
    def proven(self) -> bool:
        """False once a check found the template rewriting history (then every turn is full)."""
        return self._proven

    # -- public entry points -----------------------------------------------------------------------

    def render(self, route: Route, max_tokens: int | None = None) -> RenderedPrompt:
        """Prompt ids for ``route``: bridged when provable, else a counted full render.

        Raises :class:`PromptTooLong` once the prompt is known to hold more than ``max_tokens``.
        """
        prompt = route.prompt
        if not prompt.messages:
            raise AdapterError(ErrorKind.INVALID_REQUEST, "the conversation has no messages")
        if not self._proven:
            return self.render_full(prompt, FAILED_CHECK, max_tokens)
        context = self._context(prompt)
        turn = route.previous_generated
        previous = route.previous
        role = previous.role if previous is not None else None
        new = route.new_messages
        gen_text = context.generation_prompt()
        if not new:
            if turn is not None:
                return self.render_full(prompt, ENDS_ON_REPLY, max_tokens)
            return self._bridged(route, BridgedPrompt((), self._generation_ids(context)))

        text = context.render_after(role, new, gen=True)
        base = context.base_text(role)
        if not (
            text.startswith(base)
            and text.endswith(gen_text)
            and len(text) >= len(base) + len(gen_text)
        ):
            return self.render_full(prompt, NOT_AN_APPEND.format(role=role), max_tokens)
        body = text[len(base) : len(text) - len(gen_text)]

        segments: list[Segment] = []
        scaffold_ids: list[int] = []
        if turn is not None:
            tail = context.assistant_tail()
            scaffold = closing_scaffold(tail, route.tree.output_ids(turn), self.vocabulary)
            scaffold_ids = self.vocabulary.encode(scaffold)
            if scaffold_ids:
                segments.append(Segment(LossReason.TEMPLATE_SCAFFOLD, scaffold_ids))
        generation_ids = self._generation_ids(context)
        around = route.prefix_length + len(scaffold_ids) + len(generation_ids)
        ids, offsets = self._encode_within(body, max_tokens, around)
        message_segments = segment_ids(ids, offsets, label_text(context, role, new, body))
        segments.extend(message_segments)
        bridged = BridgedPrompt(tuple(segments), generation_ids)

        if self._sample_check():
            new_ids = [i for s in message_segments for i in s.ids] + list(bridged.generation_prompt)
            mismatch = self._check(route, context, scaffold_ids, new_ids)
            self._stats.checked(mismatch)
            if mismatch is not None and self.config.fallback_after_mismatch:
                self._proven = False
                return self.render_full(prompt, FAILED_CHECK)
            return self._bridged(route, bridged, checked=True)
        return self._bridged(route, bridged)

    def render_full(
        self, prompt: Prompt, reason: str, max_tokens: int | None = None
    ) -> RenderedPrompt:
        """The whole conversation rendered and encoded; counted under ``reason``. Raises
        :class:`PromptTooLong` once the prompt is known to hold more than ``max_tokens``."""
        context = self._context(prompt)
        text = context.render(prompt.messages, add_generation_prompt=True)
        gen_text = context.generation_prompt()
        if text.endswith(gen_text):
            history = text[: len(text) - len(gen_text)]
        else:
            history = context.render(prompt.messages, add_generation_prompt=False)
            if not text.startswith(history):
                raise ValueError(
                    f"chat template {self.template.name!r}: the generation prompt is not an append"
                )
            gen_text = text[len(history) :]
        gen_ids = self.vocabulary.encode(gen_text)
        history_ids, _ = self._encode_within(history, max_tokens, len(gen_ids))
        ids = history_ids + gen_ids
        self._stats.fallback(reason)
        return RenderedPrompt(FullPrompt(ids, len(gen_ids), reason), ids)

    def count_tokens(self, prompt: Prompt) -> int:
        """Prompt tokens of ``prompt`` rendered in full with the generation prompt (what
        ``/v1/messages/count_tokens`` answers), counted exactly in bounded memory."""
        context = self._context(prompt)
        return self.vocabulary.count(context.render(prompt.messages, add_generation_prompt=True))

    # -- internals ------------------------------------------------------------------------------

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

    def _bridged(
        self, route: Route, bridged: BridgedPrompt, *, checked: bool = False
    ) -> RenderedPrompt:
        ids = route.prefix_ids().tolist()
        for segment in bridged.segments:
            ids.extend(segment.ids)
        ids.extend(bridged.generation_prompt)
        self._stats.bridged()
        return RenderedPrompt(bridged, ids, checked)

    def _check(
        self,
        route: Route,
        context: TemplateContext,
        scaffold_ids: Sequence[int],
        new_ids: Sequence[int],
    ) -> str | None:
        """None if the bridged ids equal the full render's ids after the previous message, else
        what differs."""
        messages = route.prompt.messages
        history = messages[: route.matched]
        history_text = context.render(history, add_generation_prompt=False) if history else ""
        full_text = context.render(messages, add_generation_prompt=True)
        if not full_text.startswith(history_text):
            return (
                "the full render does not extend the earlier messages' render (history rewritten)"
            )
        history_ids = self.vocabulary.encode(history_text)
        full_ids = self.vocabulary.encode(full_text)
        if full_ids[: len(history_ids)] != history_ids:
            return "the earlier messages tokenize differently inside the full render"
        if route.previous_generated is not None:
            tail_ids = self.vocabulary.encode(context.assistant_tail())
            if history_ids[len(history_ids) - len(tail_ids) :] != tail_ids:
                return "the template closes the previous assistant turn differently"
            if list(scaffold_ids) != tail_ids[len(tail_ids) - len(scaffold_ids) :]:
                return "the closing scaffold is not the end of the template's closing"
        region = full_ids[len(history_ids) :]
        if region != list(new_ids):
            at = next(
                (i for i, (a, b) in enumerate(zip(region, new_ids, strict=False)) if a != b),
                min(len(region), len(new_ids)),
            )
            return (
                f"bridged ids differ from the full render at new token {at} "
                f"({len(new_ids)} bridged vs {len(region)} rendered)"
            )
        return None

    def _generation_ids(self, context: TemplateContext) -> list[int]:
        if context.generation_ids is None:
            context.generation_ids = self.vocabulary.encode(context.generation_prompt())
        return context.generation_ids

    def _sample_check(self) -> bool:
        rate = self.config.check_sample_rate
        if rate >= 1.0:
            return True
        if rate <= 0.0:
            return False
        with self._lock:
            return self._random.random() < rate

    def _context(self, prompt: Prompt) -> TemplateContext:
        key = prompt.context_key()
        with self._lock:
            context = self._contexts.get(key)
            if context is not None:
                self._contexts.move_to_end(key)
                return context
        context = TemplateContext(self.template, prompt)
        with self._lock:
            self._contexts[key] = context
            while len(self._contexts) > self.config.context_cache_size:
                self._contexts.popitem(last=False)
        return context
