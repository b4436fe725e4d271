"""Server-Sent Events to clients: one event as the bytes a streaming handler writes.

The other direction, parsing the engine's stream, is ``_engine/sse_reader.py``.
"""

from __future__ import annotations

from .json_shape import compact_dumps


def sse_event(data: object, event: str | None = None) -> bytes:
    """``event: NAME`` (when given) and one ``data:`` line of compact JSON, then a blank line.

    Compact JSON never contains a raw newline, so one ``data:`` line always suffices.
    """
    head = f"event: {event}\n" if event is not None else ""
    return f"{head}data: {compact_dumps(data)}\n\n".encode()


DONE = b"data: [DONE]\n\n"
"""The OpenAI Chat Completions end-of-stream sentinel."""
