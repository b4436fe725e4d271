"""Qwen3's added tokens at their real ids.

The ids matter more than the strings: engine output ids are recorded verbatim and trained on, so a
tokenizer built here must give ``<tool_call>`` the id the real checkpoint uses (151657), or every
parsed tool call and every bridged prompt would disagree with the model.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AddedTokenSpec:
    """One added token: its text, its id in Qwen3, and whether Hugging Face flags it special."""

    text: str
    id: int
    special: bool


_FIRST_ADDED_ID = 151643
_SPECIAL = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
# Qwen3's tokenizer_config marks these as added but not "special" (they survive
# skip_special_tokens); they are still matched as single tokens when encoding.
_NOT_SPECIAL = (
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)

QWEN3_ADDED_TOKENS: tuple[AddedTokenSpec, ...] = tuple(
    AddedTokenSpec(text, _FIRST_ADDED_ID + offset, offset < len(_SPECIAL))
    for offset, text in enumerate(_SPECIAL + _NOT_SPECIAL)
)
"""All 26 added tokens of Qwen3, ids 151643 (``<|endoftext|>``) to 151668 (``</think>``)."""

END_OF_TURN = "<|im_end|>"
END_OF_TEXT = "<|endoftext|>"
