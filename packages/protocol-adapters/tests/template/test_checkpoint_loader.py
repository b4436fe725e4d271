"""A Hugging Face checkpoint directory -> the adapter's tokenizer, template and stop tokens.

The directories are built here from the small tokenizer fixture and our Qwen3-style template, in
the layouts checkpoints ship; transformers itself loads the same directory as the reference.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from protocol_adapters._checkpoint import CheckpointError, load_checkpoint
from protocol_adapters._template.template import qwen3_template
from trajectory_tree import Message, Text, ToolCall, ToolSpec

SMALL = Path(__file__).parent.parent / "fixtures" / "small_tokenizer.json"
QWEN3_CONFIG = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "bos_token": None,
    "eos_token": "<|im_end|>",
    "pad_token": {"__type": "AddedToken", "content": "<|endoftext|>", "special": True},
    "model_max_length": 131072,
}


def make_checkpoint(
    directory: Path,
    config: dict[str, Any] | None = None,
    *,
    template: str | None = None,
    jinja_file: str | None = None,
    generation: dict[str, Any] | None = None,
) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(SMALL, directory / "tokenizer.json")
    data = dict(QWEN3_CONFIG if config is None else config)
    if template is not None:
        data["chat_template"] = template
    (directory / "tokenizer_config.json").write_text(json.dumps(data))
    if jinja_file is not None:
        (directory / "chat_template.jinja").write_text(jinja_file)
    if generation is not None:
        (directory / "generation_config.json").write_text(json.dumps(generation))
    return directory


def conversation() -> tuple[list[Message], list[ToolSpec]]:
    tools = [ToolSpec("bash", "Run a command", '{"type": "object", "properties": {}}')]
    messages = [
        Message.text("system", "You fix bugs."),
        Message.text("user", "Fix the failing test."),
        Message("assistant", (Text("Looking."), ToolCall("c1", "bash", '{"cmd": "ls"}'))),
        Message("tool", (Text("a.py"),), tool_call_id="c1"),
    ]
    return messages, tools


def test_a_qwen3_style_checkpoint_loads_its_tokenizer_template_and_stop_tokens(
    tmp_path: Path,
) -> None:
    path = make_checkpoint(
        tmp_path / "Qwen3-Small",
        template=qwen3_template().source,
        generation={"eos_token_id": [4002, 4000]},
    )
    checkpoint = load_checkpoint(path)
    vocabulary = checkpoint.vocabulary
    assert vocabulary.name == "Qwen3-Small"
    assert checkpoint.special_tokens == {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    assert checkpoint.stop_tokens == ("<|im_end|>", "<|endoftext|>")
    assert vocabulary.stop_ids == {vocabulary.token_id("<|im_end|>"), 4000}
    assert vocabulary.encode("<tool_call>") == [vocabulary.token_id("<tool_call>")]
    messages, tools = conversation()
    rendered = checkpoint.template.render(messages, tools, add_generation_prompt=True)
    assert rendered == qwen3_template().render(messages, tools, add_generation_prompt=True)


def test_rendering_matches_transformers_on_the_same_directory(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    source = (
        "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
        "{{ eos_token }}\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
        "{% endif %}"
    )
    config = {**QWEN3_CONFIG, "bos_token": "<|im_start|>"}
    path = make_checkpoint(tmp_path / "ckpt", config, jinja_file=source)
    checkpoint = load_checkpoint(path)
    reference = transformers.AutoTokenizer.from_pretrained(str(path))
    plain = [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]
    ours = checkpoint.template.render_raw(plain, None, {}, add_generation_prompt=True)
    theirs = reference.apply_chat_template(plain, tokenize=False, add_generation_prompt=True)
    assert ours == theirs
    assert ours.startswith("<|im_start|><|im_start|>system")
    text = "def f(x):\n    return x  # 请检查 🙂"
    assert checkpoint.vocabulary.encode(text) == reference.encode(text, add_special_tokens=False)


def test_every_named_special_token_reaches_the_template_as_transformers_passes_it(
    tmp_path: Path,
) -> None:
    """transformers 5 renders with all named special tokens (sep, cls, mask and the names of an
    ``extra_special_tokens`` mapping too); so does the checkpoint's template here."""
    transformers = pytest.importorskip("transformers")
    source = (
        "{{ bos_token }}|{{ sep_token }}|{{ cls_token }}|{{ mask_token }}|{{ image_token }}|"
        "{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}"
    )
    config = {
        **QWEN3_CONFIG,
        "bos_token": "<|im_start|>",
        "sep_token": "<|fim_pad|>",
        "cls_token": {"__type": "AddedToken", "content": "<|box_start|>"},
        "mask_token": "<|box_end|>",
        "extra_special_tokens": {"image_token": "<|image_pad|>"},
    }
    path = make_checkpoint(tmp_path / "ckpt", config, jinja_file=source)
    checkpoint = load_checkpoint(path)
    assert checkpoint.special_tokens["image_token"] == "<|image_pad|>"
    plain = [{"role": "user", "content": "hi"}]
    ours = checkpoint.template.render_raw(plain, None, {}, add_generation_prompt=False)
    reference = transformers.AutoTokenizer.from_pretrained(str(path))
    assert ours == reference.apply_chat_template(plain, tokenize=False)
    assert ours == "<|im_start|>|<|fim_pad|>|<|box_start|>|<|box_end|>|<|image_pad|>|hi<|im_end|>"


def test_chat_template_jinja_wins_over_the_config_and_named_templates_are_read(
    tmp_path: Path,
) -> None:
    jinja = make_checkpoint(tmp_path / "a", template="config", jinja_file="file")
    assert load_checkpoint(jinja).template.source == "file"
    listed = [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": "chat"}]
    named = make_checkpoint(tmp_path / "b", template=listed)  # type: ignore[arg-type]
    assert load_checkpoint(named).template.source == "chat"


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: (d / "tokenizer.json").unlink(), r"tokenizer\.json: missing"),
        (lambda d: (d / "tokenizer.json").write_text("{}"), r"tokenizer\.json: not a tokenizer"),
        (lambda d: (d / "tokenizer_config.json").unlink(), r"tokenizer_config\.json: missing"),
        (
            lambda d: (d / "tokenizer_config.json").write_text("[1]"),
            r"tokenizer_config\.json: expected a JSON object",
        ),
        (
            lambda d: _config(d, chat_template=None),
            r"tokenizer_config\.json: chat_template is missing",
        ),
        (lambda d: _config(d, eos_token=None), r"tokenizer_config\.json: eos_token is not set"),
        (
            lambda d: _config(d, eos_token="</s>"),
            r"tokenizer_config\.json: eos_token '</s>' is not a token of tokenizer\.json",
        ),
        (lambda d: _config(d, pad_token=7), r"tokenizer_config\.json: pad_token must be"),
        (
            lambda d: _config(d, pad_token={"__type": "AddedToken", "special": True}),
            r"tokenizer_config\.json: pad_token must be a token's text",
        ),
        (
            lambda d: _config(d, extra_special_tokens={"image_token": "<nope>"}),
            r"image_token '<nope>' is not a token of tokenizer\.json",
        ),
        (
            lambda d: _config(d, extra_special_tokens="<|image_pad|>"),
            r"extra_special_tokens must map names to tokens",
        ),
        (
            lambda d: _config(d, chat_template=[{"name": "tool_use", "template": "x"}]),
            r"chat_template lists no 'default' template \(names: 'tool_use'\)",
        ),
        (
            lambda d: (d / "chat_template.jinja").write_bytes(b"{{ bos_token }}\xff"),
            r"chat_template\.jinja: not readable as UTF-8",
        ),
        (
            lambda d: _config(d, chat_template="{% if %}"),
            r"tokenizer_config\.json: chat template .* does not compile",
        ),
        (
            lambda d: (d / "generation_config.json").write_text('{"eos_token_id": [10**9]}'),
            r"generation_config\.json: not valid JSON",
        ),
        (
            lambda d: (d / "generation_config.json").write_text('{"eos_token_id": 999999}'),
            r"generation_config\.json: eos_token_id 999999 is not a token id",
        ),
    ],
)
def test_a_broken_checkpoint_is_one_error_naming_file_and_field(
    tmp_path: Path, mutate: Any, message: str
) -> None:
    path = make_checkpoint(tmp_path / "ckpt", template=qwen3_template().source)
    mutate(path)
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(path)


def test_a_missing_directory_is_named(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"nope: not a directory"):
        load_checkpoint(tmp_path / "nope")


def _config(directory: Path, **changes: object) -> None:
    path = directory / "tokenizer_config.json"
    data = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(json.dumps(data))
