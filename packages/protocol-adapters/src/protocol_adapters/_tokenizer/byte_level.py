"""GPT-2 style byte-level BPE plumbing shared by the Qwen builder and the test-fixture trainer."""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    normalizers,
    pre_tokenizers,
    processors,
)

from .special_tokens import AddedTokenSpec

QWEN_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
"""Qwen 1-3's pre-tokenization regex (one digit per pre-token)."""


def byte_to_unicode() -> dict[int, str]:
    """The reversible byte -> printable character map byte-level BPE vocabularies are written in."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def configure_qwen_pipeline(tokenizer: Tokenizer) -> None:
    """NFC, Qwen's split regex, byte-level mapping and decoding: the pipeline of Qwen2/3's
    tokenizer.json. ``Regex`` matters: a plain string would be split on literally."""
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)


def add_tokens_at_ids(tokenizer: Tokenizer, specs: Iterable[AddedTokenSpec]) -> None:
    """Append added tokens and prove each landed on its intended id.

    ``tokenizers`` assigns ids sequentially after the base vocabulary, so the specs must be
    contiguous and start right after it; anything else is a build error, not a silent shift.
    """
    for spec in specs:
        token = AddedToken(spec.text, special=spec.special, normalized=False)
        if spec.special:
            tokenizer.add_special_tokens([token])
        else:
            tokenizer.add_tokens([token])
        got = tokenizer.token_to_id(spec.text)
        if got != spec.id:
            raise ValueError(f"added token {spec.text!r} landed on id {got}, expected {spec.id}")
