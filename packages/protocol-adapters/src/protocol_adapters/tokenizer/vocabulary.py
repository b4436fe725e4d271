"""The tokenizer as the renderer and the parsers use it.

A thin, typed face over a ``tokenizers.Tokenizer``: encode without adding anything, decode without
skipping anything. Both choices are about faithfulness: a chat template already wrote every
special token it wants, and a parser must see ``<tool_call>`` exactly as the engine produced it.

Thread safety: a :class:`Vocabulary` is immutable after construction and the Rust tokenizer it
wraps is safe to share, so one instance may serve any number of worker threads. Encoding goes
through ``encode_batch``, which releases the GIL while Rust tokenizes (plain ``encode`` holds it:
measured, a 2k-token encode in a worker thread then stalls the event loop for its whole duration).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer

from .special_tokens import END_OF_TEXT, END_OF_TURN


class Vocabulary:
    """Encode/decode plus the ids that end a turn."""

    __slots__ = ("_added_ids", "_stop_ids", "name", "tokenizer")

    def __init__(
        self,
        tokenizer: Tokenizer,
        name: str,
        stop_tokens: Sequence[str] = (END_OF_TURN, END_OF_TEXT),
    ) -> None:
        self.tokenizer = tokenizer
        self.name = name
        self._added_ids = frozenset(tokenizer.get_added_tokens_decoder())
        self._stop_ids = frozenset(self.token_id(t) for t in stop_tokens)

    @classmethod
    def from_file(cls, path: Path, name: str | None = None) -> Vocabulary:
        """Load a ``tokenizer.json``."""
        return cls(Tokenizer.from_file(str(path)), name or path.stem)

    @property
    def size(self) -> int:
        return int(self.tokenizer.get_vocab_size(with_added_tokens=True))

    @property
    def stop_ids(self) -> frozenset[int]:
        """Ids that end an assistant turn (``<|im_end|>``, ``<|endoftext|>``)."""
        return self._stop_ids

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special-token text becomes its single id, nothing is added."""
        return list(self.tokenizer.encode_batch([text], add_special_tokens=False)[0].ids)

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Ids and the character span of ``text`` each id came from."""
        (encoding,) = self.tokenizer.encode_batch([text], add_special_tokens=False)
        return list(encoding.ids), list(encoding.offsets)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` with every special token spelled out (nothing skipped)."""
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    def token_id(self, token: str) -> int:
        """The id of a single token, or a clear error if the vocabulary lacks it."""
        found = self.tokenizer.token_to_id(token)
        if found is None:
            raise KeyError(f"{token!r} is not a token of {self.name}")
        return int(found)

    def is_added(self, token_id: int) -> bool:
        """Whether ``token_id`` is an added (control) token such as ``<|im_end|>``."""
        return token_id in self._added_ids

    def __repr__(self) -> str:
        return f"Vocabulary({self.name!r}, size={self.size})"
