"""Generated tokens as the logprob lists clients ask for, from the engine's exact ids and
logprobs (and its most likely alternatives, when asked for).

Every token of the reply is listed, reasoning, tool-call markup and the end-of-turn token
included: the list lines up with the reported output token count and with what is trained.
"""

from __future__ import annotations

from collections.abc import Sequence

from protocol_adapters._engine.types import TopLogprobs
from protocol_adapters._tokenizer import Vocabulary
from protocol_adapters._types import TokenLogprob


def token_logprobs(
    vocabulary: Vocabulary,
    ids: Sequence[int],
    logprobs: Sequence[float],
    top: Sequence[TopLogprobs] = (),
) -> tuple[TokenLogprob, ...]:
    """One entry per generated token; ``top`` (one row per token) may be empty."""
    rows: Sequence[TopLogprobs] = top or [()] * len(ids)
    return tuple(
        TokenLogprob(
            *_spelled(vocabulary, token_id),
            logprob,
            tuple(TokenLogprob(*_spelled(vocabulary, other), p) for other, p in row),
        )
        for token_id, logprob, row in zip(ids, logprobs, rows, strict=True)
    )


def _spelled(vocabulary: Vocabulary, token_id: int) -> tuple[str, bytes]:
    raw = vocabulary.token_bytes(token_id)
    try:
        return raw.decode(), raw
    except UnicodeDecodeError:  # part of a UTF-8 character: spelled the way OpenAI spells it
        return "bytes:" + "".join(f"\\x{byte:02x}" for byte in raw), raw
