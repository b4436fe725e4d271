"""A Hugging Face checkpoint directory without weights, for tests and demos.

What slime's `--hf-checkpoint` (and `load_checkpoint`) reads to talk to a model: the tokenizer
(`tokenizer.json`), the chat template and special tokens (`tokenizer_config.json`) and the stop
ids (`generation_config.json`). Built from a `Vocabulary` (e.g. the offline Qwen3 one) and our
Qwen3-style template, so everything offline speaks exactly what a Qwen3 checkpoint speaks.
"""

from __future__ import annotations

import json
from pathlib import Path

from protocol_adapters._template.template import qwen3_template
from protocol_adapters._tokenizer import Vocabulary

END_OF_TURN = "<|im_end|>"


def write_checkpoint(directory: Path, vocabulary: Vocabulary) -> Path:
    """Write the checkpoint's tokenizer files into `directory` (created); returns it."""
    directory.mkdir(parents=True, exist_ok=True)
    vocabulary.tokenizer.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "bos_token": None,
        "eos_token": END_OF_TURN,
        "pad_token": "<|endoftext|>",
        "chat_template": qwen3_template().source,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    stop = vocabulary.token_id(END_OF_TURN)
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": [stop]}))
    return directory
