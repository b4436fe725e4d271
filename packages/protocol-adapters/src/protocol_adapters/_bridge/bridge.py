"""The bridge: one turn's prompt ids built onto the tree's tokens, rendering only what is new.

The ids sent are ``route.prefix_ids()`` (earlier output verbatim, as the engine generated it) +
the closing scaffold owed after that output + the new messages rendered after a probe
conversation that ends like their real predecessor + the generation prompt. Only the new
messages are rendered and encoded, so a turn's cost does not grow with the context.

:func:`bridge` is the one entry: route, template context and vocabulary in; the turn's prompt,
ids and notes out, with what the check found. Whether a difference the check found is served is
the renderer's decision (:mod:`.renderer`), not the bridge's. A turn the bridge cannot express
raises :class:`NotBridgeable` with the reason its full render is counted under.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from protocol_adapters._template.context import Slot, TemplateContext
from protocol_adapters._template.messages import call_names
from protocol_adapters._template.template import TemplateError
from protocol_adapters._tokenizer import TooManyTokens, Vocabulary
from protocol_adapters._tokenizer.token_starts import first_token_from
from trajectory_tree import (
    Block,
    BridgedPrompt,
    LossReason,
    Message,
    Reasoning,
    Route,
    Segment,
    Text,
    ToolCall,
)

from .check import Mismatch, check_bridge, check_reply
from .notes import ENDS_ON_REPLY, KEPT_EARLIER, NOT_AN_APPEND, OUTPUT_KEPT, REASONING_KEPT


class NotBridgeable(Exception):
    """The bridge cannot express this turn; ``reason``: why its full render is counted."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class BridgedTurn:
    """One bridged turn. ``ids``: the whole prompt to send; ``notes``: what the turn records of
    how its prompt was made (a difference found, an output kept verbatim); ``mismatch``: the
    difference the check found, for the renderer to serve or refuse; ``checked``: the whole prompt
    was compared with the template's render (a sampled turn), not only the previous reply."""

    prompt: BridgedPrompt
    ids: array[int]
    notes: Mapping[str, str]
    mismatch: Mismatch | None
    checked: bool


def bridge(
    route: Route,
    context: TemplateContext,
    vocabulary: Vocabulary,
    *,
    check: bool,
    drops_reasoning: bool,
    max_tokens: int | None = None,
) -> BridgedTurn:
    """The prompt of ``route``'s turn, bridged onto its path's tokens.

    ``check``: compare the whole prompt with the template's render (else only the previous
    reply, which every turn does). ``drops_reasoning``: the template leaves some reasoning out
    (its audit says so), so a prompt keeping the model's is noted. Raises
    :class:`NotBridgeable`, :class:`~protocol_adapters._template.TemplateError` (a probe or the
    request refused: the full render tells which) and
    :class:`PromptTooLong`.
    """
    if not route.new_messages and route.previous_generated is not None:
        raise NotBridgeable(ENDS_ON_REPLY)
    messages = route.prompt.messages
    appended = context.append(messages, route.matched)
    if appended is None:
        role = messages[route.matched - 1].role if route.matched else None
        raise NotBridgeable(NOT_AN_APPEND.format(role=role))
    generation = generation_ids(context, vocabulary, appended.last)
    if not route.new_messages:
        prompt = BridgedPrompt((), generation)
        return _turn(
            route, context, prompt, prompt_ids(route, prompt), None, False, drops_reasoning
        )

    scaffold = ""
    if route.previous_generated is not None:
        output = route.tree.output_ids(route.previous_generated)
        scaffold = closing_scaffold(context.assistant_tail(), output, vocabulary)
    scaffold_ids = vocabulary.encode(scaffold)
    around = route.prefix_length + len(scaffold_ids) + len(generation)
    ids, starts = encode_within(vocabulary, appended.body, max_tokens, around)
    message_segments = segment_ids(ids, starts, appended.labels)
    head = [Segment(LossReason.TEMPLATE_SCAFFOLD, scaffold_ids)] if scaffold_ids else []
    prompt = BridgedPrompt((*head, *message_segments), generation)

    sent = prompt_ids(route, prompt)
    if check:
        new_ids = [i for s in message_segments for i in s.ids] + generation
        new_text = appended.body + appended.generation
        mismatch = check_bridge(route, context, vocabulary, scaffold_ids, new_ids, sent, new_text)
    else:
        mismatch = check_reply(route, context, vocabulary, scaffold, appended.names)
    return _turn(route, context, prompt, sent, mismatch, check, drops_reasoning)


class PromptTooLong(Exception):
    """The prompt holds more tokens than the caller allowed: at least ``tokens`` (encoding stopped
    once the limit was passed, so the true count may be larger)."""

    def __init__(self, tokens: int) -> None:
        super().__init__(f"the prompt holds at least {tokens} tokens")
        self.tokens = tokens


def encode_within(
    vocabulary: Vocabulary, text: str, max_tokens: int | None, around: int
) -> tuple[list[int], Sequence[int]]:
    """Ids of ``text`` and where each id's token begins in it (read lazily: see
    :class:`~protocol_adapters._tokenizer.token_starts.TokenStarts`), whose prompt holds
    ``around`` more tokens; raises :class:`PromptTooLong` as soon as the whole is known to pass
    ``max_tokens``."""
    if max_tokens is None:
        return vocabulary.encode_with_starts(text)
    if around > max_tokens:
        raise PromptTooLong(around)
    try:
        return vocabulary.encode_with_starts(text, max_tokens=max_tokens - around)
    except TooManyTokens as exc:
        raise PromptTooLong(around + exc.counted) from None


def closing_scaffold(tail: str, output_ids: Sequence[int], vocabulary: Vocabulary) -> str:
    """What to append after ``output_ids`` so the prompt continues as the template would.

    ``tail`` is what the template writes after an assistant message's content (for Qwen,
    ``<|im_end|>\\n``). When the model ended its turn with the template's own end token, only the
    rest is owed (``\\n``); when it stopped on a stop string or the length limit, all of it is.
    """
    if output_ids:
        last = output_ids[-1]
        if vocabulary.is_added(last):
            emitted = vocabulary.decode([last])
            if tail.startswith(emitted):
                return tail[len(emitted) :]
    return tail


def segment_ids(
    ids: Sequence[int],
    starts: Sequence[int],
    spans: Sequence[tuple[int, LossReason]],
) -> list[Segment]:
    """Cut the ids of a text (encoded once; ``starts``: the character each id's token begins at)
    where the spans end (a token belongs to the span its first character is in); neighbouring
    cuts with the same reason are merged. ``starts`` is searched once per span end, so a lazy
    sequence costs that, not a value per token."""
    segments: list[Segment] = []
    cut = 0
    for index, (end, reason) in enumerate(spans):
        stop = len(ids) if index == len(spans) - 1 else first_token_from(starts, end, cut)
        if stop > cut:
            if segments and segments[-1].reason is reason:
                segments[-1] = Segment(reason, [*segments[-1].ids, *ids[cut:stop]])
            else:
                segments.append(Segment(reason, ids[cut:stop]))
            cut = stop
    return segments


def prompt_ids(route: Route, prompt: BridgedPrompt) -> array[int]:
    """The whole prompt: the route's prefix, then the bridged segments and generation prompt
    (an array: the prefix is copied at C speed, never turned into Python ints)."""
    ids = route.prefix_ids()
    for part in (*(segment.ids for segment in prompt.segments), prompt.generation_prompt):
        if isinstance(part, list):
            ids.fromlist(part)  # three times as fast as extend() from a list
        else:
            ids.extend(part)
    return ids


def generation_ids(context: TemplateContext, vocabulary: Vocabulary, slot: Slot) -> list[int]:
    """The generation prompt after a message of ``slot``, encoded once per context."""
    ids = context.generation_ids(slot)
    if ids is None:
        ids = vocabulary.encode(context.generation_prompt(slot))
        context.keep_ids(slot, ids)
    return ids


def _turn(
    route: Route,
    context: TemplateContext,
    prompt: BridgedPrompt,
    ids: array[int],
    mismatch: Mismatch | None,
    checked: bool,
    drops_reasoning: bool,
) -> BridgedTurn:
    notes = dict([mismatch.note()]) if mismatch is not None else {}
    if OUTPUT_KEPT not in notes:
        kept = (_reasoning_kept(route, context) if drops_reasoning else None) or _kept_on_path(
            route
        )
        if kept is not None:
            notes[OUTPUT_KEPT] = kept
    return BridgedTurn(prompt, ids, notes, mismatch, checked)


def _reasoning_kept(route: Route, context: TemplateContext) -> str | None:
    """:data:`REASONING_KEPT` when the template leaves out the reasoning of a reply the engine
    generated on ``route``'s path (the bridged prompt keeps it, as generated): a template that
    drops earlier reasoning, or one that never renders it (whose reply check may name another
    difference first, an accepted generation prompt's). Told by rendering the conversation's
    skeleton (short stand-ins for every text, a marker for every reasoning): the template decides
    by the conversation's shape, so this costs the number of messages, not their length, and runs
    on every turn, not on sampled ones."""
    nodes = route.anchor.path()[1:]
    messages = route.prompt.messages[: route.matched]
    generated = {
        index
        for index, (node, message) in enumerate(zip(nodes, messages, strict=False))
        if node.turn is not None and any(isinstance(b, Reasoning) for b in message.content)
    }
    if not generated:
        return None
    skeleton = [_skeleton(message, index) for index, message in enumerate(route.prompt.messages)]
    try:
        text = context.render(skeleton, add_generation_prompt=False, names=call_names(skeleton))
    except TemplateError:
        return None
    if all(_marker(index) in text for index in generated):
        return None
    return REASONING_KEPT


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
