"""A chat session driven through the renderer as the server drives it, for template tests.

Each turn routes the conversation in a real ``SessionTree``, renders it, "generates" (scripted
output encoded with the real tokenizer: the engine double's job), parses the reply with the
built-in parser and records it, then the client echoes the reply back. The reference for every
prompt is transformers' ``apply_chat_template(tokenize=True)`` of the same conversation.

Also: the trait templates, written for these tests (Qwen3-style markup the built-in parser reads),
each a base template with one published template's trait swapped in.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedTokenizerFast

from protocol_adapters._bridge import Renderer
from protocol_adapters._bridge.renderer import RenderedPrompt
from protocol_adapters._parsing import BuiltinReplyParser, new_call_id
from protocol_adapters._parsing.tool_markup import CallIdFactory
from protocol_adapters._template.messages import template_messages, template_tools
from protocol_adapters._tokenizer import Vocabulary
from trajectory_tree import (
    Completion,
    FinishReason,
    Message,
    Prompt,
    SessionTree,
    Text,
    ToolSpec,
    TurnMeta,
)

SPECIAL = {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"}
TOOLS = (
    ToolSpec(
        "bash",
        "Run a shell command.",
        json.dumps({"type": "object", "properties": {"command": {"type": "string"}}}),
    ),
)


def output(text: str = "", reasoning: str = "", commands: Sequence[str] = ()) -> str:
    """What a model trained on the trait templates prints (without the end token)."""
    out = f"<think>\n{reasoning}\n</think>\n\n" if reasoning else ""
    out += text
    for index, command in enumerate(commands):
        if text or index:
            out += "\n"
        payload = json.dumps({"name": "bash", "arguments": {"command": command}})
        out += f"<tool_call>\n{payload}\n</tool_call>"
    return out


def results(reply: Message, *texts: str) -> list[Message]:
    """Tool results answering the reply's calls in order (no ``name``: clients rarely send one)."""
    return [
        Message("tool", (Text(text),), tool_call_id=call.id)
        for call, text in zip(reply.tool_calls, texts, strict=True)
    ]


def reference_ids(
    vocabulary: Vocabulary,
    source: str,
    prompt: Prompt,
    variables: Mapping[str, str] = SPECIAL,
    **kwargs: Any,
) -> list[int]:
    """transformers' own render and encoding of ``prompt`` with ``source``."""
    hf = PreTrainedTokenizerFast(tokenizer_object=vocabulary.tokenizer)  # type: ignore[no-untyped-call]
    template_kwargs: dict[str, Any] = {**variables, **kwargs}
    ids = hf.apply_chat_template(
        template_messages(prompt.messages),
        tools=list(template_tools(tuple(prompt.tools))) or None,
        chat_template=source,
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
        **template_kwargs,
    )
    return list(ids)


@dataclass
class ChatSession:
    """A client and an engine double around one tree."""

    renderer: Renderer
    vocabulary: Vocabulary
    tools: Sequence[ToolSpec] = TOOLS
    tree: SessionTree = field(default_factory=SessionTree)
    messages: list[Message] = field(default_factory=list)
    sent: list[tuple[Prompt, RenderedPrompt]] = field(default_factory=list)
    call_id: CallIdFactory = new_call_id
    """The ids the engine double's parser gives calls (fresh random ones by default)."""

    def prompt(self, new: Sequence[Message] = ()) -> Prompt:
        return Prompt((*self.messages, *new), tuple(self.tools))

    def turn(self, new: Sequence[Message], text: str) -> Message:
        """Send the conversation plus ``new``, answer with ``text`` + ``<|im_end|>``, echo it."""
        self.messages.extend(new)
        prompt = self.prompt()
        route = self.tree.route(prompt)
        rendered = self.renderer.render(route)
        self.sent.append((prompt, rendered))
        ids = [*self.vocabulary.encode(text), self.vocabulary.token_id("<|im_end|>")]
        parser = BuiltinReplyParser(tools=self.tools, call_id=self.call_id)
        parsed = parser.parse_ids(ids, self.vocabulary)
        assert parsed.malformed_tool_calls == 0
        completion = Completion(ids, [-0.5] * len(ids), FinishReason.STOP)
        meta = TurnMeta(extra=dict(rendered.notes))  # as the server records them
        turn = self.tree.record(route, rendered.prompt, completion, parsed.message, meta)
        assert list(self.tree.prompt_ids(turn)) == rendered.ids.tolist()
        self.messages.append(parsed.message)
        return parsed.message


def agent_session(session: ChatSession) -> None:
    """Seven turns of a coding agent: calls with and without text and reasoning, results, a
    user follow-up, a final answer."""
    reply = session.turn(
        [Message.text("system", "You fix bugs."), Message.text("user", "The test fails.")],
        output("Let me look.", "Read the test first.", ["cat test_x.py"]),
    )
    reply = session.turn(results(reply, "def test(): assert f(1) == 2"), output(commands=["ls"]))
    reply = session.turn(
        results(reply, "x.py test_x.py"), output("", "f is off by one.", ["cat x.py"])
    )
    reply = session.turn(results(reply, "def f(x): return x"), output("Fixing.", "", ["fix x.py"]))
    reply = session.turn(results(reply, "ok"), output("Fixed: f(x) returns x + 1.", "Done."))
    reply = session.turn([Message.text("user", "Run the tests too.")], output(commands=["pytest"]))
    session.turn(results(reply, "1 passed"), output("All tests pass."))


BASE = """
{%- set ns = namespace(last_user=-1) %}
{%- for m in messages %}
    {%- if m.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}
{%- endfor %}
{%- if bos_token is not defined or eos_token is not defined %}
    {{- raise_exception('this template needs bos_token and eos_token') }}
{%- endif %}
{{- bos_token }}
{%- if messages[0].role == 'system' or tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}{{- messages[0].content }}{%- endif %}
    @@SYSTEM_EXTRA@@
    {%- if tools and @@TOOLS_IN_SYSTEM@@ %}
        {%- for t in tools %}{{- '\\n' + (t | tojson) }}{%- endfor %}
    {%- endif %}
    {{- '<|im_end|>\\n' }}
{%- endif %}
{%- for m in messages %}
    {%- if m.role == 'system' %}
        {%- if not loop.first %}@@LATER_SYSTEM@@{%- endif %}
    {%- elif m.role == 'user' %}
        {{- '<|im_start|>user\\n' }}
        {%- if tools and not @@TOOLS_IN_SYSTEM@@ and loop.index0 == ns.last_user %}
            {%- for t in tools %}{{- (t | tojson) + '\\n' }}{%- endfor %}
        {%- endif %}
        {{- m.content + '<|im_end|>\\n' }}
    {%- elif m.role == 'assistant' %}
        {%- if not (@@RESULTS_IN_TURN@@ and loop.previtem and loop.previtem.role == 'tool') %}
            {{- '<|im_start|>assistant\\n' }}
        {%- endif %}
        {%- if m.reasoning_content and @@REASONING_SHOWN@@ %}
            {{- '<think>\\n' + m.reasoning_content + '\\n</think>\\n\\n' }}
        {%- endif %}
        {{- m.content }}
        @@CALLS_CHECK@@
        {%- for c in m.tool_calls or [] %}
            {%- if c.function.arguments is not mapping %}
                {{- raise_exception('tool-call arguments must be a mapping') }}
            {%- endif %}
            {%- if m.content or not loop.first %}{{- '\\n' }}{%- endif %}
            {{- '<tool_call>\\n{"name": "' + c.function.name + '", "arguments": ' }}
            {{- (c.function.arguments | tojson) + '}\\n</tool_call>' }}
        {%- endfor %}
        {%- if not (@@RESULTS_IN_TURN@@ and m.tool_calls) %}{{- eos_token + '\\n' }}{%- endif %}
    {%- elif m.role == 'tool' %}
        {%- if m.name is not defined %}
            {{- raise_exception('a tool result needs the name of its function') }}
        {%- endif %}
        {%- if @@RESULTS_IN_TURN@@ %}
            {{- '<tool_response>\\n' + m.content + '\\n</tool_response>' }}
            {%- if loop.last or loop.nextitem.role != 'tool' %}{{- eos_token + '\\n' }}{%- endif %}
        {%- else %}
            {{- '<|im_start|>user\\n<tool_response>\\n' + m.content }}
            {{- '\\n</tool_response><|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
@@GENERATION@@
"""

DEFAULTS = {
    "@@SYSTEM_EXTRA@@": "",
    "@@TOOLS_IN_SYSTEM@@": "true",
    "@@LATER_SYSTEM@@": "{{- '<|im_start|>system\\n' + m.content + '<|im_end|>\\n' }}",
    "@@RESULTS_IN_TURN@@": "false",
    "@@REASONING_SHOWN@@": "true",
    "@@CALLS_CHECK@@": "",
    "@@GENERATION@@": (
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    ),
}


def trait_template(**traits: str) -> str:
    """The base template with ``traits`` (keys of :data:`DEFAULTS` without the @@) swapped in."""
    source = BASE
    for key, default in DEFAULTS.items():
        source = source.replace(key, traits.get(key.strip("@").lower(), default))
    return source
