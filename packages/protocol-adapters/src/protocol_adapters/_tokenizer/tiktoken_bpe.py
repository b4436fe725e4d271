"""Turn a tiktoken BPE rank file into a Hugging Face fast tokenizer.

tiktoken files list tokens with their ranks but no merges. Byte-level BPE in ``tokenizers`` needs
the merges, so each token's merge is recovered by replaying BPE on its bytes with only the ranks
below its own: the pair left at the end is the merge that created it. That reproduces the
merges.txt Qwen ships (151,387 merges for 151,643 tokens); a one-time cost of a few seconds,
which is why :mod:`protocol_adapters._tokenizer.qwen` caches the result.
"""

from __future__ import annotations

import base64
from pathlib import Path

from tokenizers import Tokenizer, models

from .byte_level import byte_to_unicode


def load_tiktoken_ranks(path: Path) -> dict[bytes, int]:
    """Read ``<base64 token> <rank>`` lines."""
    ranks: dict[bytes, int] = {}
    for number, line in enumerate(path.read_bytes().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except ValueError as exc:
            raise ValueError(f"{path}:{number}: not a tiktoken rank line ({exc})") from None
    return ranks


def _merge_of(token: bytes, rank: int, ranks: dict[bytes, int]) -> tuple[bytes, bytes]:
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best_index = -1
        best_rank = rank
        for index in range(len(parts) - 1):
            pair_rank = ranks.get(parts[index] + parts[index + 1])
            if pair_rank is not None and pair_rank < best_rank:
                best_index, best_rank = index, pair_rank
        if best_index < 0:
            break
        parts[best_index : best_index + 2] = [parts[best_index] + parts[best_index + 1]]
    if len(parts) != 2:
        raise ValueError(f"token {token!r} (rank {rank}) is not reachable by BPE merges")
    return parts[0], parts[1]


def tokenizer_from_ranks(ranks: dict[bytes, int]) -> Tokenizer:
    """A byte-level BPE ``Tokenizer`` (model only: callers add the pipeline and added tokens)."""
    to_unicode = byte_to_unicode()

    def spell(data: bytes) -> str:
        return "".join(to_unicode[b] for b in data)

    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError("tiktoken ranks must be the contiguous ids 0..n-1")
    vocab = {spell(token): rank for token, rank in ranks.items()}
    merges: list[tuple[int, str, str]] = []
    for token, rank in ranks.items():
        if len(token) > 1:
            left, right = _merge_of(token, rank, ranks)
            merges.append((rank, spell(left), spell(right)))
    merges.sort()
    model = models.BPE(
        vocab=vocab,
        merges=[(left, right) for _, left, right in merges],
        fuse_unk=False,
        byte_fallback=False,
    )
    return Tokenizer(model)
