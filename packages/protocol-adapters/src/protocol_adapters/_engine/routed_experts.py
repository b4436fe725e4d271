"""SGLang's ``meta_info.routed_experts``: which experts a MoE model used per position, decoded.

The engine sends int32 ids, little-endian, flattened rows of ``layers x topk`` (one row per
position it computed from ``routed_experts_start_len`` up to, not including, the last token), as
base64 text (or, in some releases, a JSON list). A 64-layer top-8 model at 100k positions sends
51M ids, so nothing here loops over ids in Python: base64 is decoded and checked a slice at a
time in C calls (``STEP_CHARS``), each short enough that an event loop on another thread gets the
GIL back between them. Errors are ``ValueError`` naming the field; :mod:`.wire` adds the rid.
"""

from __future__ import annotations

import base64
import binascii
import sys
from array import array
from collections.abc import Mapping
from typing import cast

from trajectory_tree import FinishReason, RoutedExperts

from .types import RoutingAsk

STEP_CHARS = 256 * 1024
"""Base64 characters decoded per C call (~1 ms); a multiple of 16, so every slice but the last
decodes to whole int32s."""

_SIGN_CLEAR = bytes(range(0x80))
"""Bytes whose top bit is clear: deleting them from the sign bytes leaves one per negative id."""


def routed_experts_of(
    meta: Mapping[str, object],
    ask: RoutingAsk | None,
    *,
    prompt_tokens: int,
    completion_tokens: int,
    finish: FinishReason | None,
) -> RoutedExperts | None:
    """The routing in one response object (a whole answer, or one streamed chunk).

    Only the object that carries the finish reason counts: streamed chunks before it may lack
    routing or carry a partial one. Routing the request did not ask for is an error (a confused
    engine or gateway), and so is routing missing when it was asked for (SGLang leaves it out
    when not started with ``--enable-return-routed-experts``): a silent gap would only surface
    at training time. The exception is an aborted call, which may end before the engine gathered
    its routing: it gets none (its partial turn is never trained).
    """
    value = meta.get("routed_experts")
    if ask is None:
        if value is not None:
            raise ValueError("meta_info.routed_experts is present but was not asked for")
        return None
    if finish is None:
        return None
    if value is None:
        if finish is FinishReason.ABORT:
            return None
        raise ValueError(
            "meta_info.routed_experts is missing though return_routed_experts was sent "
            "(is the engine started with --enable-return-routed-experts?)"
        )
    echoed = meta.get("routed_experts_start_len")
    if echoed is not None and echoed != ask.start:
        raise ValueError(
            f"meta_info.routed_experts_start_len is {echoed!r}, but {ask.start} was asked for"
        )
    rows = max(0, prompt_tokens + completion_tokens - 1 - ask.start)
    expected = rows * ask.layers * ask.topk
    experts = int32_ids(value)
    if len(experts) != expected:
        raise ValueError(
            f"meta_info.routed_experts holds {len(experts)} expert ids, not {expected}: "
            f"{rows} positions from {ask.start} x {ask.layers} layers x top-{ask.topk}"
        )
    return RoutedExperts(ask.start, ask.layers, ask.topk, experts)


def int32_ids(value: object) -> array[int]:
    """Base64 of little-endian int32s, or a JSON list of ints, as non-negative ``array('i')``."""
    if isinstance(value, str):
        return _from_base64(value)
    if isinstance(value, list):
        return _from_list(value)
    raise ValueError(
        f"meta_info.routed_experts is a {type(value).__name__}, not base64 text or a list"
    )


def _from_base64(text: str) -> array[int]:
    if len(text) % 4:
        raise ValueError(f"meta_info.routed_experts is not base64: {len(text)} characters")
    size = len(text) // 4 * 3 - len(text[-2:]) + len(text[-2:].rstrip("="))
    if size % 4:
        raise ValueError(f"meta_info.routed_experts decodes to {size} bytes, not whole int32s")
    # Allocated once at its exact size: appending slice by slice over-allocates by 1/16 (13 MB
    # more for 100k positions of a 64x8 model), and the array lives as long as the session.
    packed: array[int] = array("i", [0]) * (size // 4)
    view = memoryview(packed).cast("B")
    filled = 0
    for at in range(0, len(text), STEP_CHARS):
        piece = text[at : at + STEP_CHARS]
        if at + STEP_CHARS < len(text) and "=" in piece:
            raise ValueError("meta_info.routed_experts is not base64: padding inside the text")
        try:
            raw = base64.b64decode(piece, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ValueError(f"meta_info.routed_experts is not base64: {exc}") from None
        if len(raw) % 4:
            raise ValueError(
                f"meta_info.routed_experts decodes to {at // 4 * 3 + len(raw)} bytes, "
                "not whole int32s"
            )
        if raw[3::4].translate(None, _SIGN_CLEAR):  # the top byte of each little-endian id
            raise ValueError("meta_info.routed_experts holds a negative expert id")
        if filled + len(raw) > size:
            raise ValueError("meta_info.routed_experts is not base64: padding inside the text")
        view[filled : filled + len(raw)] = raw
        filled += len(raw)
    view.release()  # an exported buffer would pin the array's size for good
    if filled != size:
        raise ValueError("meta_info.routed_experts is not base64: padding inside the text")
    if sys.byteorder == "big":
        packed.byteswap()
    return packed


def _from_list(values: list[object]) -> array[int]:
    try:
        packed: array[int] = array("i", cast("list[int]", values))  # checked here, at C speed
    except (TypeError, OverflowError):
        raise ValueError("meta_info.routed_experts holds something not an int32") from None
    if packed and min(packed) < 0:
        raise ValueError("meta_info.routed_experts holds a negative expert id")
    return packed
