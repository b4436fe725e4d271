"""The bridge check: a bridged prompt against the chat template's own render of the request.

On every bridged turn that follows a reply, a cheap one (O(the reply)): the previous reply as it
was sent and generated (its generation prompt, the engine's output, the closing scaffold) against
the template's rendering of that reply in history, after a probe ending like the message before
it (:func:`check_reply`).

Two comparisons, for a sample of turns (``RendererConfig.check_sample_rate``):

1. the new region: the closing scaffold, the new messages and the generation prompt against the
   end of a full render, text and ids;
2. the whole prompt, prefix included, against the full render's ids.

A difference is located in the bridged prompt's own structure (the tree path's spans). In the
model's output of an earlier turn it is expected whenever the model wrote a reply differently
from how the template renders it (re-serialized JSON, whitespace, reasoning the template drops):
the bridge keeps the engine's ids, and the difference is recorded with its reason. In an earlier
turn's generation prompt it is the deviation some templates have (their generation prompt is not
how history renders the turn), acceptable only when the user accepted it. Anywhere else it is
the template's text, which the bridge got wrong.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from protocol_adapters._template.context import TemplateContext
from protocol_adapters._tokenizer import Vocabulary
from trajectory_tree import LossReason, Route

from .notes import OUTPUT_KEPT, PROMPT_MISMATCH

_SHOWN = 6
"""Tokens of each side quoted in a reason."""


class Place(StrEnum):
    """Where the first difference lies in the bridged prompt."""

    OUTPUT = "output"
    """An earlier reply, kept verbatim: the model wrote it unlike the template renders it."""
    GENERATION_PROMPT = "generation prompt"
    """An earlier turn's generation prompt: history renders that turn's header differently."""
    TEMPLATE_TEXT = "template text"
    """Text the bridge rendered from the template: the bridge got it wrong."""


@dataclass(frozen=True, slots=True)
class Mismatch:
    """Why a bridged prompt differs from the template's render, and where."""

    reason: str
    place: Place = Place.TEMPLATE_TEXT

    def note(self) -> tuple[str, str]:
        """The turn note that records it: a kept output, or the template text found wrong."""
        return (OUTPUT_KEPT if self.place is Place.OUTPUT else PROMPT_MISMATCH), self.reason


def check_bridge(
    route: Route,
    context: TemplateContext,
    vocabulary: Vocabulary,
    scaffold_ids: Sequence[int],
    new_ids: Sequence[int],
    bridged_ids: Sequence[int],
    new_text: str,
) -> Mismatch | None:
    """None when the bridged prompt is the template's render of the request, else why not.
    ``new_text``: the new messages and the generation prompt as the bridge rendered them."""
    full_text = context.render(route.prompt.messages, add_generation_prompt=True)
    full_ids = vocabulary.encode(full_text)
    region = _new_region(route, context, scaffold_ids, new_ids, new_text, full_text, full_ids)
    if region is not None:
        return Mismatch(region)
    return _whole(route, vocabulary, bridged_ids, full_ids)


def check_reply(
    route: Route,
    context: TemplateContext,
    vocabulary: Vocabulary,
    scaffold: str,
    names: Mapping[str, str],
) -> Mismatch | None:
    """None when the previous reply, as sent and generated, is how the template renders it in
    history (or when no probe can tell); else why not, and where."""
    node = route.anchor
    if route.previous_generated is None or node.delta is None or not node.spans:
        return None
    messages = route.prompt.messages
    index = route.matched - 1
    expected = context.reply_text(messages, index, names)
    if expected is None:
        return None
    kind, generation_length = node.spans[0]
    generation = generation_length if kind is LossReason.TEMPLATE_SCAFFOLD else 0
    prompt_text = vocabulary.decode(node.delta[:generation])
    actual = prompt_text + vocabulary.decode(node.delta[generation:]) + scaffold
    if actual == expected:
        return None
    at = next(
        (i for i, (x, y) in enumerate(zip(actual, expected, strict=False)) if x != y),
        min(len(actual), len(expected)),
    )
    shown = f"{actual[at : at + 30]!r} where the template renders {expected[at : at + 30]!r}"
    turn = route.previous_generated.id
    if at < len(prompt_text):
        return Mismatch(
            f"turn {turn}'s generation prompt is not how the template renders that turn in "
            f"history ({shown})",
            Place.GENERATION_PROMPT,
        )
    if route.previous_generated.reply != messages[index]:
        return Mismatch(
            f"the client echoed turn {turn}'s reply re-serialized or trimmed ({shown}); the "
            "engine's ids are kept",
            Place.OUTPUT,
        )
    return Mismatch(
        f"turn {turn}'s output is kept verbatim where the template renders its reply "
        f"differently ({shown})",
        Place.OUTPUT,
    )


def _new_region(
    route: Route,
    context: TemplateContext,
    scaffold_ids: Sequence[int],
    new_ids: Sequence[int],
    new_text: str,
    full_text: str,
    full_ids: Sequence[int],
) -> str | None:
    """The end of the full render must be the bridged end: the template's closing of the
    previous reply, the new messages, the generation prompt. Compared from the end, so a
    difference in earlier text (the whole-prompt comparison's business) does not hide it."""
    closing = context.assistant_tail() if route.previous_generated is not None else ""
    if not full_text.endswith(closing + new_text):
        return "the new messages or the closing before them differ from the full render's end"
    end = list(full_ids[len(full_ids) - len(new_ids) - len(scaffold_ids) :])
    if end != [*scaffold_ids, *new_ids]:
        return (
            "the new messages tokenize differently at the end of the full render "
            f"({len(scaffold_ids) + len(new_ids)} bridged ids)"
        )
    return None


def _whole(
    route: Route, vocabulary: Vocabulary, bridged: Sequence[int], full: Sequence[int]
) -> Mismatch | None:
    if list(bridged) == list(full):
        return None
    at = _first_difference(bridged, full)
    shown = (
        f"token {at}: bridged {vocabulary.decode(bridged[at : at + _SHOWN])!r}, "
        f"template {vocabulary.decode(full[at : at + _SHOWN])!r}"
    )
    for start, end, reason, turn in _spans(route):
        if start <= at < end:
            if reason is LossReason.GENERATED:
                return Mismatch(
                    f"turn {turn}'s output is kept verbatim where the template renders its "
                    f"reply differently ({shown})",
                    Place.OUTPUT,
                )
            if turn is not None:
                return Mismatch(
                    f"turn {turn}'s generation prompt is not how the template renders that "
                    f"turn in history ({shown})",
                    Place.GENERATION_PROMPT,
                )
            return Mismatch(
                f"the prompt differs from the template's render in earlier text ({shown})"
            )
    return Mismatch(f"the prompt differs from the template's render in the new messages ({shown})")


def _spans(route: Route) -> Iterator[tuple[int, int, LossReason, int | None]]:
    """``(start, end, reason, turn)`` of each span of the route's prefix ids; ``turn`` is set on
    a turn's generation prompt and output."""
    at = 0
    for node in route.anchor.path():
        turn = node.turn.id if node.turn is not None else None
        for reason, length in node.spans:
            yield at, at + length, reason, turn
            at += length


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )
