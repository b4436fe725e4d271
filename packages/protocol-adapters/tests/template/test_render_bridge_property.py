"""Property: over generated agent conversations, every bridged turn equals the full render.

Random scripts (parallel tool calls answered in any order, reasoning, mid-conversation system
notes, user follow-ups, replies cut by the length limit) run through a real ``SessionTree`` with
the small BPE fixture (fast; same pipeline and added tokens as Qwen's). Every turn is verified in
check mode and compared with transformers' ``apply_chat_template(tokenize=True)``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import PreTrainedTokenizerFast

from protocol_adapters._bridge import Renderer, RendererConfig
from protocol_adapters._parsing import BuiltinReplyParser
from protocol_adapters._template import qwen3_template
from protocol_adapters._template.messages import template_messages, template_tools
from protocol_adapters._tokenizer import Vocabulary
from trajectory_tree import (
    BridgedPrompt,
    Completion,
    FinishReason,
    Message,
    Prompt,
    SessionTree,
    Text,
    ToolSpec,
    linearize,
)

SMALL = Path(__file__).parent.parent / "fixtures" / "small_tokenizer.json"
TOOLS = (ToolSpec("bash", "Run a command.", json.dumps({"type": "object"})),)
WORDS = st.sampled_from(
    ["fix", "the", "test", "ünï", "🦜", "42", "x = f(y)", "{'a': 1}", "line\nnext", "  indented"]
)
PHRASE = st.lists(WORDS, min_size=1, max_size=6).map(" ".join)


@pytest.fixture(scope="module")
def small() -> Vocabulary:
    return Vocabulary.from_file(SMALL)


@st.composite
def model_output(draw: st.DrawFn) -> tuple[str, bool]:
    """Qwen3-format output text and whether it ends with <|im_end|> (else: cut by length)."""
    reasoning = draw(st.one_of(st.just(""), PHRASE))
    text = draw(st.one_of(st.just(""), PHRASE))
    calls = draw(st.lists(PHRASE, max_size=3))
    out = f"<think>\n{reasoning}\n</think>\n\n" if reasoning else ""
    out += text
    for index, command in enumerate(calls):
        if text or index:
            out += "\n"
        payload = json.dumps(
            {"name": "bash", "arguments": {"command": command}}, ensure_ascii=False
        )
        out += f"<tool_call>\n{payload}\n</tool_call>"
    if not out:
        out = "ok"
    ended = draw(st.booleans()) or bool(calls)
    return out, ended


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_bridged_turn_equals_the_full_render(small: Vocabulary, data: st.DataObject) -> None:
    template = qwen3_template()
    renderer = Renderer(small, template, RendererConfig(check_sample_rate=1.0))
    hf = PreTrainedTokenizerFast(tokenizer_object=small.tokenizer)  # type: ignore[no-untyped-call]
    tree = SessionTree()
    messages: list[Message] = [Message.text("user", data.draw(PHRASE))]
    if data.draw(st.booleans()):
        messages.insert(0, Message.text("system", data.draw(PHRASE)))
    for _ in range(data.draw(st.integers(min_value=1, max_value=5))):
        prompt = Prompt(tuple(messages), TOOLS)
        route = tree.route(prompt)
        rendered = renderer.render(route)
        assert isinstance(rendered.prompt, BridgedPrompt)
        expected = hf.apply_chat_template(
            template_messages(messages),
            tools=list(template_tools(TOOLS)),
            chat_template=template.source,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        assert rendered.ids.tolist() == list(expected)

        output, ended = data.draw(model_output())
        ids = small.encode(output) + ([small.token_id("<|im_end|>")] if ended else [])
        reply = BuiltinReplyParser(tools=TOOLS).parse_ids(ids, small)
        assert reply.malformed_tool_calls == 0
        finish = FinishReason.STOP if ended else FinishReason.LENGTH
        tree.record(
            route, rendered.prompt, Completion(ids, [-1.0] * len(ids), finish), reply.message
        )
        messages.append(reply.message)

        calls = list(reply.message.tool_calls)
        new: list[Message] = [
            Message("tool", (Text(data.draw(PHRASE)),), tool_call_id=call.id)
            for call in data.draw(st.permutations(calls))
        ]
        if data.draw(st.booleans()):
            new.append(Message.text("system", data.draw(PHRASE)))
        if not calls or data.draw(st.booleans()):
            new.append(Message.text("user", data.draw(PHRASE)))
        messages.extend(new)
    stats = renderer.stats
    assert stats.mismatches == 0
    assert stats.full_renders == 0
    assert len(linearize(tree).samples) == 1
