"""The closing scaffold: template text owed between the model's last token and the next message."""

from __future__ import annotations

from collections.abc import Sequence

from protocol_adapters._tokenizer import Vocabulary


def closing_scaffold(tail: str, output_ids: Sequence[int], vocabulary: Vocabulary) -> str:
    """What to append after ``output_ids`` so the prompt continues as the template would.

    ``tail`` is what the template writes after an assistant message's content (for Qwen,
    ``<|im_end|>\\n``). When the model ended its turn with the template's own end token, only the
    rest is owed (``\\n``); when it stopped on a stop string or the length limit, all of it is.
    """
    if output_ids:
        last = output_ids[-1]
        if vocabulary.is_added(last):
            emitted = vocabulary.decode([last])
            if tail.startswith(emitted):
                return tail[len(emitted) :]
    return tail
