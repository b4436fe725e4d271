"""The jinja2 environment renders Hugging Face templates as transformers does."""

from __future__ import annotations

import pytest

from protocol_adapters.rendering import ChatTemplate, TemplateError, qwen3_template
from trajectory_tree import Message, ToolSpec


def test_hf_template_features() -> None:
    source = (
        "{% for m in messages %}{% if m.role == 'user' %}{{ m.content | tojson }}"
        "{% else %}{% generation %}{{ m.content }}{% endgeneration %}{% endif %}"
        "{% if loop.index > 1 %}{% break %}{% endif %}{% endfor %}"
        "{% if tools %}{{ tools[0].function.parameters | tojson(sort_keys=true) }}{% endif %}"
    )
    template = ChatTemplate("features", source)
    text = template.render(
        [Message.text("user", "<ä>"), Message.text("assistant", "hi"), Message.text("user", "x")],
        [ToolSpec("t", "", '{"b": 1, "a": 2}')],
    )
    assert text == '"<ä>"hi{"a": 2, "b": 1}'  # no HTML escaping, no ASCII escaping


def test_template_errors_are_clear() -> None:
    refusing = ChatTemplate("refusing", "{{ raise_exception('no system messages') }}")
    with pytest.raises(TemplateError, match=r"refusing.*no system messages"):
        refusing.render([Message.text("system", "s")])
    with pytest.raises(TemplateError, match="does not compile"):
        ChatTemplate("broken", "{% for %}")


def test_qwen3_template_layout() -> None:
    text = qwen3_template().render(
        [Message.text("user", "hi")],
        options={"enable_thinking": "false"},
        add_generation_prompt=True,
    )
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
