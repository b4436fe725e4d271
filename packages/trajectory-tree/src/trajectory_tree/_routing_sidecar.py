"""Routing outside the tree's JSON: one binary sidecar, each turn's part found by a digest.

Routing is the bulk of a MoE session (4 bytes x layers x topk per token: 200 MB for 100k tokens
of a 64-layer top-8 model), so it is never written as JSON numbers. :func:`dump_routing` writes
every turn's expert ids, turn by turn, as little-endian int32; the tree's JSON names, per turn,
where its part lies, its shape and its SHA-256, so a sidecar that is truncated, reordered or
from another session is refused instead of replayed.
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from collections.abc import Mapping
from typing import Any

from ._errors import FormatError
from ._routing import RoutedExperts, zeros
from ._tree import SessionTree


def _little_endian(experts: array[int]) -> memoryview:
    """The ids as little-endian bytes, without a copy on a little-endian host."""
    if sys.byteorder == "little":
        return memoryview(experts).cast("B")
    swapped = array("i", experts)
    swapped.byteswap()
    return memoryview(swapped).cast("B")


def routing_offsets(tree: SessionTree) -> dict[int, int]:
    """Where each routed turn's part starts in the sidecar, in bytes, by turn id."""
    offsets: dict[int, int] = {}
    position = 0
    for turn in tree.turns:
        if turn.routed_experts is not None:
            offsets[turn.id] = position
            position += 4 * len(turn.routed_experts.experts)
    return offsets


def dump_routing(tree: SessionTree) -> bytes:
    """The sidecar of ``tree``: every turn's routing in turn order (empty without routing)."""
    return b"".join(
        _little_endian(t.routed_experts.experts) for t in tree.turns if t.routed_experts is not None
    )


def routing_entry(routing: RoutedExperts, offset: int) -> dict[str, Any]:
    """A turn's ``"routing"`` entry in the tree's JSON."""
    data = _little_endian(routing.experts)
    return {
        "start": routing.start,
        "layers": routing.layers,
        "topk": routing.topk,
        "offset": offset,
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }


def routing_from_entry(entry: Mapping[str, Any], sidecar: bytes, where: str) -> RoutedExperts:
    """The routing a turn's entry names in ``sidecar``; :class:`FormatError` if it is not there
    as written."""
    offset, size = int(entry["offset"]), int(entry["bytes"])
    data = memoryview(sidecar)[offset : offset + size]
    if offset < 0 or len(data) != size or size % 4:
        raise FormatError(f"{where}: the routing sidecar holds no {size} bytes at {offset}")
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise FormatError(f"{where}: the routing sidecar's bytes do not match their digest")
    experts = zeros(size // 4)
    memoryview(experts).cast("B")[:] = data
    if sys.byteorder != "little":
        experts.byteswap()
    return RoutedExperts(int(entry["start"]), int(entry["layers"]), int(entry["topk"]), experts)
