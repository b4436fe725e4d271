"""Long texts encoded once, however many turns ask for the same one at the same time.

A batch of episodes starts together, and the episodes of one group (GRPO's samples of one task)
send the same first request: the agent's system prompt, its tools and the task, ~12k tokens for
Claude Code. Their first turns arrive within milliseconds of one another and each would tokenize
that text again (tens of ms of CPU each, all at once on a node's few cores, so every other turn
waits behind them). The first caller encodes it; callers that ask while it does wait for its
result, and later ones within the last :data:`RECENT` texts take it as it is. The tokenizer is a
function of the text, so a shared result is the result.

Only texts from :data:`SHARED_CHARS` to :data:`MAX_SHARED_CHARS` characters are shared (the
caller, ``Vocabulary.encode_with_starts``, tells them apart before it calls in here): shorter ones
cost less to encode than to look up, and longer ones (a conversation rendered whole) would hold
megabytes for a text that seldom comes twice.
"""

from __future__ import annotations

import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Generic, TypeVar

SHARED_CHARS = 16 * 1024
MAX_SHARED_CHARS = 256 * 1024
RECENT = 16

S = TypeVar("S", bound=Sequence[int])
"""Where each id's token begins in the text (``Vocabulary.encode_with_starts``)."""


class SharedEncodings(Generic[S]):
    """The encodings of recent long texts, each computed once (thread-safe)."""

    def __init__(self, recent: int = RECENT) -> None:
        self._recent = recent
        self._lock = threading.Lock()
        self._done: OrderedDict[str, tuple[array[int], S]] = OrderedDict()
        self._running: dict[str, Future[tuple[array[int], S]]] = {}

    def encoded(self, text: str, encode: Callable[[], tuple[list[int], S]]) -> tuple[list[int], S]:
        """``encode()``'s result for ``text``: found, awaited from the caller already encoding
        it, or computed now. Each caller gets a list of its own. If the caller whose encoding
        another awaits fails (its own token limit, say), the other encodes the text itself."""
        mine: Future[tuple[array[int], S]] | None = None
        with self._lock:
            found = self._done.get(text)
            if found is not None:
                self._done.move_to_end(text)
                running = None
            else:
                running = self._running.get(text)
                if running is None:
                    mine = self._running[text] = Future()
        if found is not None:
            return found[0].tolist(), found[1]
        if running is not None:
            try:
                ids, starts = running.result()
            except Exception:
                return encode()
            return ids.tolist(), starts
        assert mine is not None
        try:
            result = encode()
        except BaseException as exc:
            with self._lock:
                del self._running[text]
            mine.set_exception(exc)
            raise
        kept = (array("i", result[0]), result[1])
        with self._lock:
            del self._running[text]
            self._done[text] = kept
            while len(self._done) > self._recent:
                self._done.popitem(last=False)
        mine.set_result(kept)
        return result
