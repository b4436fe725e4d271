"""Incremental Server-Sent Events parsing over raw bytes.

Fed with whatever the socket delivers, so one event may span many reads and one read may hold
many events. Reading whole lines through the HTTP client instead would cap the size of an event,
and SGLang's cumulative chunks grow with every token.
"""

from __future__ import annotations


class SSEParser:
    """Collects ``data:`` fields and returns each event's data when its blank line arrives.

    Only ``data`` matters for SGLang; comments (``:``) and other fields are skipped. Lines may
    end in ``\\n``, ``\\r\\n`` or ``\\r``.
    """

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._data: list[str] = []
        self._scanned = 0
        """Buffered bytes already known to hold no line end (a trailing CR excepted): a 100 MB
        event arriving in 64 KB reads is searched once, not once per read."""

    def feed(self, chunk: bytes) -> list[str]:
        self._buffer += chunk
        events: list[str] = []
        start = 0
        while True:
            end = self._line_end(max(start, self._scanned))
            if end < 0:
                break
            line = bytes(self._buffer[start:end])
            start = end + 1
            if line.endswith(b"\r"):
                line = line[:-1]
            self._line(line, events)
        del self._buffer[:start]
        self._scanned = max(0, len(self._buffer) - 1)
        return events

    def close(self) -> list[str]:
        """End of stream: a final line ended by a lone CR is complete; a half event is dropped."""
        events: list[str] = []
        if self._buffer.endswith(b"\r"):
            self._line(bytes(self._buffer[:-1]), events)
        self._buffer.clear()
        self._data = []
        self._scanned = 0
        return events

    @property
    def pending(self) -> bool:
        """True if bytes of an unfinished event are buffered."""
        return bool(self._buffer) or bool(self._data)

    def _line_end(self, start: int) -> int:
        nl = self._buffer.find(b"\n", start)
        cr = self._buffer.find(b"\r", start)
        if cr >= 0 and (nl < 0 or cr < nl - 1):
            # a bare CR ends a line only once we know no LF follows it
            return cr if cr + 1 < len(self._buffer) else -1
        return nl

    def _line(self, line: bytes, events: list[str]) -> None:
        if not line:
            if self._data:
                events.append("\n".join(self._data))
                self._data = []
            return
        if line.startswith(b":"):
            return
        name, _, value = line.partition(b":")
        if name != b"data":
            return
        if value.startswith(b" "):
            value = value[1:]
        self._data.append(value.decode("utf-8"))
