"""Scripted assistant replies, written out the way a Qwen3 model generates them.

A reply becomes ``<think>\\n…\\n</think>\\n\\n`` (if it has reasoning), its text, one
``<tool_call>\\n{"name": …, "arguments": …}\\n</tool_call>`` per call (a newline before each call
that follows text or another call) and ``<|im_end|>`` when it stops normally. The markers are
encoded as their single special-token ids and the text between them with the real tokenizer, so
the ids are the ones a Qwen3 engine would emit for that reply.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
END_OF_TURN = "<|im_end|>"
QWEN3_MARKERS = (THINK_OPEN, THINK_CLOSE, TOOL_CALL_OPEN, TOOL_CALL_CLOSE, END_OF_TURN)

Finish = Literal["stop", "length", "abort"]


class Tokenizer(Protocol):
    """What the double needs from a Hugging Face-style tokenizer."""

    def encode(self, text: str, /, *, add_special_tokens: bool) -> list[int]: ...

    def decode(self, token_ids: list[int], /, *, skip_special_tokens: bool) -> str: ...

    def convert_tokens_to_ids(self, tokens: str, /) -> int | list[int] | None: ...


@dataclass(frozen=True, slots=True)
class ScriptedReply:
    """One assistant reply the double will "generate".

    ``finish="stop"`` ends with ``<|im_end|>``; ``"length"`` and ``"abort"`` end without it, as a
    generation cut short does. A request's ``max_new_tokens`` may still cut any reply to length.
    """

    text: str = ""
    reasoning: str | None = None
    tool_calls: Sequence[tuple[str, Mapping[str, object]]] = ()
    finish: Finish = "stop"
    after_calls: str = ""
    """Text the model writes after its tool calls (a space, as Hermes-style models do, or a
    sentence): what a Chat Completions client cannot echo back in place."""

    def __post_init__(self) -> None:
        if self.finish not in ("stop", "length", "abort"):
            raise ValueError(f"finish must be 'stop', 'length' or 'abort', got {self.finish!r}")
        for call in self.tool_calls:
            if len(call) != 2 or not isinstance(call[0], str) or not isinstance(call[1], Mapping):
                raise ValueError(f"a tool call is (name, arguments dict), got {call!r}")


def qwen3_pieces(reply: ScriptedReply) -> list[tuple[bool, str]]:
    """The reply as ``(is_marker, text)`` pieces in generation order."""
    pieces: list[tuple[bool, str]] = []
    if reply.reasoning is not None:
        pieces += [(True, THINK_OPEN), (False, f"\n{reply.reasoning}\n"), (True, THINK_CLOSE)]
        pieces.append((False, "\n\n"))
    pieces.append((False, reply.text))
    for i, (name, arguments) in enumerate(reply.tool_calls):
        if i > 0 or reply.text:
            pieces.append((False, "\n"))
        call = json.dumps({"name": name, "arguments": dict(arguments)}, ensure_ascii=False)
        pieces += [(True, TOOL_CALL_OPEN), (False, f"\n{call}\n"), (True, TOOL_CALL_CLOSE)]
    if reply.after_calls:
        pieces.append((False, reply.after_calls))
    if reply.finish == "stop":
        pieces.append((True, END_OF_TURN))
    return pieces


def qwen3_text(reply: ScriptedReply) -> str:
    """The reply as the text the model would produce (markers spelled out)."""
    return "".join(text for _, text in qwen3_pieces(reply))


class Qwen3ReplyEncoder:
    """Encodes scripted replies to token ids with a real tokenizer.

    Fails at construction if the tokenizer lacks any Qwen3 marker as one token: ids for a reply
    must never depend on how a marker's spelling happens to split.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.marker_ids: dict[str, int] = {}
        for marker in QWEN3_MARKERS:
            token_id = tokenizer.convert_tokens_to_ids(marker)
            if not isinstance(token_id, int) or tokenizer.encode(
                marker, add_special_tokens=False
            ) != [token_id]:
                raise ValueError(f"tokenizer has no single token for the Qwen3 marker {marker!r}")
            self.marker_ids[marker] = token_id

    @property
    def end_of_turn_id(self) -> int:
        return self.marker_ids[END_OF_TURN]

    def encode(self, reply: ScriptedReply) -> list[int]:
        ids: list[int] = []
        text = ""
        for is_marker, piece in qwen3_pieces(reply):
            if not is_marker:
                text += piece
                continue
            if text:
                ids += self.tokenizer.encode(text, add_special_tokens=False)
                text = ""
            ids.append(self.marker_ids[piece])
        if text:
            ids += self.tokenizer.encode(text, add_special_tokens=False)
        return ids
