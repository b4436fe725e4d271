"""The jinja2 environment renders Hugging Face templates as transformers does."""

from __future__ import annotations

import pytest

from protocol_adapters._template import ChatTemplate, TemplateError, qwen3_template
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


def test_a_template_failing_in_its_own_code_is_a_template_error() -> None:
    """Template code fails like any code (a string plus a number): one TemplateError naming the
    template and the failure, not a TypeError from deep inside jinja2."""
    broken = ChatTemplate("adds", "{{ messages[0].content + 1 }}")
    with pytest.raises(TemplateError, match=r"'adds': TypeError"):
        broken.render([Message.text("user", "hi")])


def test_render_variables_match_transformers() -> None:
    """As transformers 5 renders: ``documents`` is None, reasoning is also ``thinking``, tool
    results carry the name of the function they answer, arguments are a mapping."""
    transformers = pytest.importorskip("transformers")
    from protocol_adapters._template.messages import template_messages
    from trajectory_tree import Reasoning, Text, ToolCall

    source = (
        "{{ documents is none }}|{% for m in messages %}{{ m.role }}:{{ m.thinking }}"
        "{% for c in m.tool_calls or [] %}{{ c.function.arguments.path }}{% endfor %}"
        "{{ m.name }};{% endfor %}"
    )
    messages = [
        Message("assistant", (Reasoning("hmm"), ToolCall("c1", "read", '{"path": "a.py"}'))),
        Message("tool", (Text("x"),), tool_call_id="c1"),
    ]
    ours = ChatTemplate("vars", source).render(messages)
    hf = transformers.utils.chat_template_utils.render_jinja_template(
        [template_messages(messages)], chat_template=source
    )[0][0]
    assert ours == hf == "True|assistant:hmma.py;tool:read;"


def test_json_escaping_a_lone_surrogate_never_reaches_a_template_decoded() -> None:
    """``{"arg": "\\ud800"}`` is valid JSON text whose decoding is not Unicode (no tokenizer
    takes it): such arguments reach the template as the text the client sent; such tool
    parameters are the client's error."""
    from protocol_adapters._template.messages import template_messages, template_tools
    from protocol_adapters._types import AdapterError
    from trajectory_tree import ToolCall

    escaped = '{"arg": "\\ud800"}'
    call = Message("assistant", (ToolCall("c1", "read", escaped),))
    (converted,) = template_messages([call])
    assert converted["tool_calls"][0]["function"]["arguments"] == escaped
    fine = Message("assistant", (ToolCall("c1", "read", '{"arg": "\\u00e4"}'),))
    assert template_messages([fine])[0]["tool_calls"][0]["function"]["arguments"] == {"arg": "ä"}
    with pytest.raises(AdapterError, match="'t': parameters are not JSON of valid Unicode"):
        template_tools((ToolSpec("t", "", '{"description": "\\udfff"}'),))
