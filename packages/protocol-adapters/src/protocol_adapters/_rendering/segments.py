"""Label the rendered text of new messages with loss reasons, then cut the ids to match.

All of it is loss 0: the labels only answer "why wasn't this trained?". Tool results are
``tool_output``, other messages ``context``, and the short template text around a message's
content (role headers, ``<|im_end|>``, ``<tool_response>`` tags) ``template_scaffold``.

Message boundaries are found without assuming anything about the template: each message is
rendered alone after a probe conversation ending like its predecessor, and the longest prefix of
that piece found at the current position of the real text is the message's region.
A template that groups consecutive tool results (one ``<|im_end|>`` after the last) still splits
right: the lone rendering's closing tag is simply where the match stops. The ids come from one
encode of the whole text; a token is labelled by the character it starts at. Labels never decide
tokens: a template that refuses one of the small label probes gets coarser labels, not an error.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping, Sequence

from trajectory_tree import LossReason, Message, Segment

from .conversation import Slot, TemplateContext
from .template import TemplateError

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


def segment_ids(
    ids: Sequence[int],
    offsets: Sequence[tuple[int, int]],
    spans: Sequence[tuple[int, LossReason]],
) -> list[Segment]:
    """Cut the ids of a text (encoded once, with each id's character span) where the spans end
    (a token belongs to the span its first character is in); neighbouring cuts with the same
    reason are merged."""
    starts = [begin for begin, _ in offsets]
    segments: list[Segment] = []
    cut = 0
    for index, (end, reason) in enumerate(spans):
        stop = len(ids) if index == len(spans) - 1 else bisect_left(starts, end, cut)
        if stop > cut:
            if segments and segments[-1].reason is reason:
                segments[-1] = Segment(reason, [*segments[-1].ids, *ids[cut:stop]])
            else:
                segments.append(Segment(reason, ids[cut:stop]))
            cut = stop
    return segments
