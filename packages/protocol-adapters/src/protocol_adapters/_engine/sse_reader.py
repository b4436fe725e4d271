"""Incremental parsing of the engine's Server-Sent Events stream, over raw bytes.

Fed with whatever the socket delivers, so one event may span many reads and one read may hold
many events. Reading whole lines through the HTTP client instead would cap the size of an event,
and SGLang's cumulative chunks grow with every token. (Writing events to clients is
``_dialects/sse_writer.py``.)
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
        if not self._buffer and b"\r" not in chunk:
            return self._feed_lines(chunk)
        self._buffer += chunk
        events: list[str] = []
        start = 0
        with memoryview(self._buffer) as view:
            while True:
                end = self._line_end(max(start, self._scanned))
                if end < 0:
                    break
                stop = end - 1 if end > start and self._buffer[end - 1] == _CR else end
                self._line(view, start, stop, events)
                start = end + 1
        del self._buffer[:start]
        self._scanned = max(0, len(self._buffer) - 1)
        return events

    def _feed_lines(self, chunk: bytes) -> list[str]:
        """The common case, a read starting on a line and ending its lines in LF only (SGLang
        writes ``data: {...}\\n\\n``): its lines are split in one C call instead of found one
        by one; an unfinished last line is buffered for the general path."""
        lines = chunk.split(b"\n")
        rest = lines.pop()
        events: list[str] = []
        for line in lines:
            if not line:
                if self._data:
                    events.append("\n".join(self._data))
                    self._data = []
            elif line.startswith(b"data:"):
                value = 6 if line.startswith(b"data: ") else 5
                self._data.append(str(line[value:], "utf-8"))
            elif line == b"data":
                self._data.append("")
        if rest:
            self._buffer += rest
            self._scanned = len(rest) - 1
        return events

    def close(self) -> list[str]:
        """End of stream: a final line ended by a lone CR is complete; a half event is dropped."""
        events: list[str] = []
        if self._buffer.endswith(b"\r"):
            with memoryview(self._buffer) as view:
                self._line(view, 0, len(self._buffer) - 1, events)
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

    def _line(self, view: memoryview, start: int, stop: int, events: list[str]) -> None:
        """The line ``buffer[start:stop]``, read in place: a 100 MB data line is copied once,
        by its UTF-8 decoding."""
        if start == stop:
            if self._data:
                events.append("\n".join(self._data))
                self._data = []
            return
        buffer = self._buffer
        colon = buffer.find(b":", start, stop)
        name_end = stop if colon < 0 else colon
        if name_end - start != 4 or not buffer.startswith(b"data", start):
            return  # a comment (empty name) or another field
        value = stop if colon < 0 else colon + 1
        if value < stop and buffer[value] == _SPACE:
            value += 1
        self._data.append(str(view[value:stop], "utf-8"))


_CR = ord("\r")
_SPACE = ord(" ")
