"""The tokenizer and chat template of a Hugging Face checkpoint directory, without transformers.

A training run names its policy by checkpoint directory (slime's ``--hf-checkpoint``), and the
adapter must tokenize exactly as that checkpoint does. Three files decide it:

- ``tokenizer.json``: the fast tokenizer (vocabulary, merges, pre-tokenizer, added tokens);
- ``tokenizer_config.json``: the named special tokens (``bos_token``, ``eos_token``,
  ``unk_token``, ``sep_token``, ``pad_token``, ``cls_token``, ``mask_token``, and the names an
  ``extra_special_tokens`` mapping gives, each a string or an ``AddedToken`` object with a
  ``content`` field) and, in older checkpoints, ``chat_template`` (a string, or a list of
  ``{"name", "template"}`` entries of which ``default`` is the chat template);
- ``chat_template.jinja``: where newer checkpoints keep the template; it wins over the config's,
  as it does in transformers.

``generation_config.json`` may list more ids that end generation (``eos_token_id``: Qwen3 lists
``<|im_end|>`` and ``<|endoftext|>``); together with ``eos_token`` they are the ids that end an
assistant turn. The template sees the named special tokens as variables, as transformers 5 passes
them (``apply_chat_template`` renders with ``special_tokens_map``): a template that writes
``bos_token`` or closes turns with ``eos_token`` renders here exactly as there.

Every problem is a :class:`CheckpointError` naming the file and the field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from protocol_adapters._template.template import ChatTemplate, TemplateError
from protocol_adapters._tokenizer import Vocabulary

SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
"""The named special tokens transformers hands a chat template as variables (when set)."""
EXTRA_SPECIAL_TOKENS = "extra_special_tokens"
"""A mapping of more named special tokens (multimodal checkpoints: ``image_token`` ...); a list
there names none and reaches no template."""

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"
GENERATION_CONFIG_FILE = "generation_config.json"


class CheckpointError(ValueError):
    """The checkpoint directory cannot give a tokenizer and chat template; names file and field."""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """What the adapter needs from a checkpoint: its tokenizer, template and special tokens."""

    directory: Path
    vocabulary: Vocabulary
    template: ChatTemplate
    special_tokens: Mapping[str, str]
    """The named special tokens set in ``tokenizer_config.json`` (``bos_token`` ...; unset ones
    absent): the variables the chat template renders with."""
    stop_tokens: tuple[str, ...]
    """The tokens that end an assistant turn: ``eos_token`` and generation_config's ids."""


@dataclass(frozen=True, slots=True)
class TemplateSource:
    """A checkpoint's chat template as text, the file it came from, and the named special
    tokens it renders with."""

    text: str
    where: Path
    special_tokens: Mapping[str, str]


def chat_template_source(directory: Path) -> TemplateSource:
    """The chat template and special tokens of the checkpoint in ``directory``, without loading
    its tokenizer (``protocol-adapters check-template`` judges the template alone)."""
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: not a directory")
    config = _json_object(directory / CONFIG_FILE)
    special = _special_tokens(directory / CONFIG_FILE, config)
    text, where = _template_source(directory, config)
    return TemplateSource(text, where, special)


def load_checkpoint(directory: Path) -> Checkpoint:
    """Load the tokenizer and chat template of the checkpoint in ``directory``."""
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: not a directory")
    tokenizer = _tokenizer(directory / TOKENIZER_FILE)
    config = _json_object(directory / CONFIG_FILE)
    special = _special_tokens(directory / CONFIG_FILE, config)
    for name, text in special.items():
        if tokenizer.token_to_id(text) is None:
            raise CheckpointError(
                f"{directory / CONFIG_FILE}: {name} {text!r} is not a token of {TOKENIZER_FILE}"
            )
    if "eos_token" not in special:
        raise CheckpointError(
            f"{directory / CONFIG_FILE}: eos_token is not set (it ends every assistant turn)"
        )
    stop = _stop_tokens(directory, tokenizer, special["eos_token"])
    source, where = _template_source(directory, config)
    try:
        template = ChatTemplate(directory.name, source, special)
    except TemplateError as exc:
        raise CheckpointError(f"{where}: {exc}") from None
    vocabulary = Vocabulary(tokenizer, directory.name, stop_tokens=stop)
    return Checkpoint(directory, vocabulary, template, special, stop)


def _tokenizer(path: Path) -> Tokenizer:
    if not path.is_file():
        raise CheckpointError(f"{path}: missing (a Hugging Face fast tokenizer is required)")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # the Rust loader raises plain Exceptions
        raise CheckpointError(f"{path}: not a tokenizer ({exc})") from None


def _json_object(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise CheckpointError(f"{path}: missing")
    try:
        data = json.loads(path.read_text("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return data


def _special_tokens(path: Path, config: Mapping[str, Any]) -> dict[str, str]:
    extra = config.get(EXTRA_SPECIAL_TOKENS)
    named: dict[str, Any] = {name: config.get(name) for name in SPECIAL_TOKEN_NAMES}
    if isinstance(extra, Mapping):
        named.update({str(k): v for k, v in extra.items() if k not in named})
    elif extra is not None and not isinstance(extra, list):
        raise CheckpointError(
            f"{path}: {EXTRA_SPECIAL_TOKENS} must map names to tokens (or list tokens), "
            f"got {extra!r}"
        )
    tokens: dict[str, str] = {}
    for name, value in named.items():
        if value is None:
            continue
        text = value.get("content") if isinstance(value, Mapping) else value  # an AddedToken
        if not isinstance(text, str) or not text:
            raise CheckpointError(f"{path}: {name} must be a token's text, got {value!r}")
        tokens[name] = text
    return tokens


def _stop_tokens(directory: Path, tokenizer: Tokenizer, eos: str) -> tuple[str, ...]:
    stop = [eos]
    path = directory / GENERATION_CONFIG_FILE
    if not path.is_file():
        return tuple(stop)
    ids = _json_object(path).get("eos_token_id")
    listed = ids if isinstance(ids, list) else [ids] if ids is not None else []
    for token_id in listed:
        text = (
            tokenizer.id_to_token(token_id)
            if isinstance(token_id, int) and not isinstance(token_id, bool)
            else None
        )
        if text is None:
            raise CheckpointError(f"{path}: eos_token_id {token_id!r} is not a token id")
        if text not in stop:
            stop.append(text)
    return tuple(stop)


def _template_source(directory: Path, config: Mapping[str, Any]) -> tuple[str, Path]:
    jinja = directory / TEMPLATE_FILE
    if jinja.is_file():
        try:
            source = jinja.read_text("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"{jinja}: not readable as UTF-8 text ({exc})") from None
        if not source.strip():
            raise CheckpointError(f"{jinja}: empty")
        return source, jinja
    where = directory / CONFIG_FILE
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {
            entry.get("name"): entry.get("template")
            for entry in template
            if isinstance(entry, Mapping)
        }
        if "default" not in named:
            listed = ", ".join(repr(n) for n in named) or "none"
            raise CheckpointError(
                f"{where}: chat_template lists no 'default' template (names: {listed})"
            )
        template = named["default"]
    if not isinstance(template, str) or not template.strip():
        raise CheckpointError(
            f"{where}: chat_template is missing (and there is no {TEMPLATE_FILE}): the adapter "
            "renders prompts with the checkpoint's own template"
        )
    return template, where
