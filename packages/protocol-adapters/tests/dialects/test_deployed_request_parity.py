"""The prompt the adapter sends is the one vLLM renders when it serves the trained model.

Its chat endpoint hands the client's raw Chat Completions request to transformers'
``apply_chat_template``: assistant tool-call arguments JSON-decoded into a mapping (SGLang's too),
null content as "", everything else as sent (a tool result has the ``name`` the client gave it,
or none).
Training on anything else trains a prompt the deployed model never sees. Each template here is
written for one trait of a published template (vLLM's tool-calling examples) that made the
adapter send something else; every conversation goes through the real server with the official
``openai`` SDK to the SGLang-wire engine double, and every engine request is compared with
transformers' render of the raw request.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import openai
import pytest
from transformers import PreTrainedTokenizerFast

from protocol_adapters._audit import FindingKind, TemplateMode, Verdict, audit_template
from protocol_adapters._bridge import Renderer, RendererConfig
from protocol_adapters._bridge.notes import OUTPUT_KEPT, PROMPT_MISMATCH
from protocol_adapters._engine import SGLangConfig, SGLangEngine
from protocol_adapters._server.config import AdapterConfig
from protocol_adapters._server.ports import reply_parsers
from protocol_adapters._server.runner import AdapterServer
from protocol_adapters._template import ChatTemplate, ToolResultNames
from protocol_adapters._tokenizer import Vocabulary
from protocol_adapters.testing import EngineDouble, ScriptedReply
from protocol_adapters.testing.stack import VocabularyTokenizer
from trajectory_tree import SessionTree, summarize

SPECIAL = {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"}

BASE = """
{%- if messages[0].role == 'system' or tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}{{- messages[0].content }}{%- endif %}
    {%- for t in tools or [] %}{{- '\\n' + (t | tojson) }}{%- endfor %}
    {{- '<|im_end|>\\n' }}
{%- endif %}
{%- for m in messages %}
    {%- if m.role == 'user' %}
        {{- '<|im_start|>user\\n' + m.content + '<|im_end|>\\n' }}
    {%- elif m.role == 'assistant' %}
        {{- '<|im_start|>assistant\\n' }}
        @@REASONING@@
        {{- m.content }}
        {%- for c in m.tool_calls or [] %}
            {%- if m.content or not loop.first %}{{- '\\n' }}{%- endif %}
            {{- '<tool_call>\\n{"name": "' + c.function.name + '", "arguments": ' }}
            @@ARGUMENTS@@
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif m.role == 'tool' %}
        {{- '<|im_start|>tool\\n' }}
        @@RESULT_NAME@@
        {{- m.content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
@@GENERATION@@
"""
DEFAULTS = {
    "@@REASONING@@": (
        "{%- if m.reasoning_content %}"
        "{{- '<think>\\n' + m.reasoning_content + '\\n</think>\\n\\n' }}{%- endif %}"
    ),
    "@@ARGUMENTS@@": "{{- c.function.arguments | tojson }}",
    "@@RESULT_NAME@@": "",
    "@@GENERATION@@": (
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    ),
}
ARGUMENTS_AS_THEY_COME = "{{- c.function.arguments }}"
"""Phi-4-mini's trait: a mapping prints as Python (``{'cmd': 'ls'}``), the JSON text as JSON."""
NAMED_RESULT = (
    "{%- if m.name is defined %}{{- 'Function ' + m.name + ' returned:\\n' }}{%- endif %}"
)
"""OLMo 3's trait: a tool result the client named says so, one it did not name does not."""
NO_REASONING = ""
SPACED_GENERATION = (
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n\\n' }}{%- endif %}"
)
"""With NO_REASONING, DeepSeek V3.2's traits: a generation prompt whose whitespace history does
not repeat (an accepted deviation), and reasoning never rendered."""

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "exec_command",
            "description": "Run a command",
            "parameters": {
                "type": "object",
                "properties": {"workdir": {"type": "string"}, "cmd": {"type": "string"}},
                "required": ["cmd"],
            },
        },
    }
]
AGENT = (
    ScriptedReply(text="Listing.", tool_calls=[("exec_command", {"workdir": "/r", "cmd": "ls"})]),
    ScriptedReply(tool_calls=[("exec_command", {"cmd": "cat a.py", "workdir": "/r"})]),
    ScriptedReply(text="Done."),
)


def template(name: str, **traits: str) -> ChatTemplate:
    source = BASE
    for key, default in DEFAULTS.items():
        source = source.replace(key, traits.get(key.strip("@").lower(), default))
    return ChatTemplate(name, source, SPECIAL)


def as_engine_passes_it(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """The raw messages as SGLang's and vLLM's chat endpoints pass them to the template."""
    out: list[dict[str, Any]] = json.loads(json.dumps(list(messages)))
    for message in out:
        if message.get("content") is None:
            message["content"] = ""
        for call in message.get("tool_calls") or ():
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    return out


def deployed_ids(vocabulary: Vocabulary, chat: ChatTemplate, body: dict[str, Any]) -> list[int]:
    """transformers' render of the raw request, as the deployed engine tokenizes it."""
    hf = PreTrainedTokenizerFast(tokenizer_object=vocabulary.tokenizer)  # type: ignore[no-untyped-call]
    ids = hf.apply_chat_template(
        as_engine_passes_it(body["messages"]),
        tools=body["tools"],
        chat_template=chat.source,
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
        bos_token=SPECIAL["bos_token"],
        eos_token=SPECIAL["eos_token"],
    )
    return list(ids)


@dataclass
class Conversation:
    """What the client sent each turn, what the engine got, and the session's tree."""

    bodies: list[dict[str, Any]]
    sent: list[list[int]]
    tree: SessionTree


async def converse(
    vocabulary: Vocabulary,
    chat: ChatTemplate,
    mode: TemplateMode,
    *,
    named_results: bool = False,
    script: Sequence[ScriptedReply] = AGENT,
    check_rate: float = 0.0,
) -> Conversation:
    """The script through the real server; the client echoes each reply as the SDK returns it
    and answers each call (naming the result after its function when ``named_results``)."""
    renderer = Renderer(vocabulary, chat, RendererConfig(check_sample_rate=check_rate, mode=mode))
    async with (
        EngineDouble(VocabularyTokenizer(vocabulary), script, incremental_streaming=True) as double,
        SGLangEngine(SGLangConfig(base_url=double.url)) as engine,
        AdapterServer(AdapterConfig(), engine, renderer, vocabulary, reply_parsers()) as server,
    ):
        session = server.sessions.open(chat.name)
        api = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=session.token, max_retries=0)
        messages: list[Any] = [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "Fix it."},
        ]
        bodies: list[dict[str, Any]] = []
        for _ in script:
            bodies.append(json.loads(json.dumps({"messages": messages, "tools": TOOLS})))
            completion = await api.chat.completions.create(
                model="policy", messages=messages, tools=TOOLS, max_tokens=256
            )
            message = completion.choices[0].message
            messages = [*messages, message.model_dump(exclude_unset=True, mode="json")]
            for call in message.tool_calls or ():
                result: dict[str, Any] = {"role": "tool", "tool_call_id": call.id}
                if named_results and call.type == "function":
                    result["name"] = call.function.name
                messages.append({**result, "content": "a.py"})
        await api.close()
        sent = [list(request.input_ids) for request in double.requests]
        return Conversation(bodies, sent, session.tree)


def assert_deployed(vocabulary: Vocabulary, chat: ChatTemplate, conversation: Conversation) -> None:
    assert len(conversation.sent) == len(conversation.bodies)
    for turn, (body, ids) in enumerate(zip(conversation.bodies, conversation.sent, strict=True)):
        expected = deployed_ids(vocabulary, chat, body)
        assert ids == expected, (
            f"turn {turn}:\n{vocabulary.decode(ids)!r}\n{vocabulary.decode(expected)!r}"
        )


async def test_arguments_a_template_prints_as_they_come_are_the_mapping_the_engines_pass(
    qwen_vocabulary: Vocabulary,
) -> None:
    """Phi-4-mini prints ``{{ arguments }}``: the engines decode the client's JSON text first,
    so the deployed model sees a Python dict. Served in full, every prompt is that render; the
    adapter once passed this template the JSON text, and trained on JSON the model never sees."""
    chat = template("arguments-as-they-come", arguments=ARGUMENTS_AS_THEY_COME)
    conversation = await converse(qwen_vocabulary, chat, TemplateMode.FULL_RENDER)
    assert_deployed(qwen_vocabulary, chat, conversation)
    assert "{'workdir': '/r', 'cmd': 'ls'}" in qwen_vocabulary.decode(conversation.sent[1])
    notes = {f.feature for f in audit_template(chat).of_kind(FindingKind.NOTE)}
    assert "prints tool-call arguments as a Python mapping" in notes


@pytest.mark.parametrize("check_rate", [0.0, 1.0])
async def test_a_bridged_reply_the_engines_would_print_as_a_python_dict_is_noted(
    qwen_vocabulary: Vocabulary, check_rate: float
) -> None:
    """Bridged, the same template keeps the model's JSON call where the deployed prompt has the
    Python dict: an output kept verbatim, which every later turn must record (the JSON text made
    the check pass, and the difference went unrecorded)."""
    chat = template("arguments-as-they-come", arguments=ARGUMENTS_AS_THEY_COME)
    assert audit_template(chat).verdict is Verdict.BRIDGE_EXACT
    conversation = await converse(qwen_vocabulary, chat, TemplateMode.EXACT, check_rate=check_rate)
    turns = conversation.tree.turns
    assert OUTPUT_KEPT not in turns[0].meta.extra
    for turn in turns[1:]:
        assert OUTPUT_KEPT in turn.meta.extra, turn.id
    deployed = qwen_vocabulary.decode(deployed_ids(qwen_vocabulary, chat, conversation.bodies[1]))
    assert "{'workdir': '/r', 'cmd': 'ls'}" in deployed
    assert '{"workdir": "/r", "cmd": "ls"}' in qwen_vocabulary.decode(conversation.sent[1])


@pytest.mark.parametrize("named_results", [False, True])
async def test_tool_results_carry_the_name_the_client_sent_or_none(
    qwen_vocabulary: Vocabulary, named_results: bool
) -> None:
    """OLMo 3 prints "Function NAME returned:" for a result that has a name. vLLM passes the
    name the client sent, or none: the adapter once named every result after its call (as
    Hermes needs), and the Chat dialect dropped the client's own."""
    chat = template("named-results", result_name=NAMED_RESULT)
    audit = audit_template(chat)
    assert audit.result_names is ToolResultNames.AS_SENT
    assert audit.verdict is Verdict.BRIDGE_EXACT, audit.report()
    conversation = await converse(
        qwen_vocabulary, chat, TemplateMode.EXACT, named_results=named_results
    )
    assert_deployed(qwen_vocabulary, chat, conversation)
    last = qwen_vocabulary.decode(conversation.sent[-1])
    assert ("Function exec_command returned:" in last) is named_results


@pytest.mark.parametrize("check_rate", [0.0, 1.0])
async def test_reasoning_a_template_never_renders_is_noted_behind_a_generation_prompt_deviation(
    qwen_vocabulary: Vocabulary, check_rate: float
) -> None:
    """DeepSeek V3.2 never renders reasoning, and its generation prompt's whitespace is not the
    history header's. The reply check names the first difference only (the accepted generation
    prompt), so the reasoning the bridged prompt keeps, and the deployed prompt lacks, went
    unrecorded: every turn that keeps it must say so."""
    chat = template("spaced-no-reasoning", reasoning=NO_REASONING, generation=SPACED_GENERATION)
    assert audit_template(chat).verdict is Verdict.BRIDGE_WITH_DEVIATION
    script = (
        ScriptedReply(
            text="Listing.", reasoning="Look first.", tool_calls=[("exec_command", {"cmd": "ls"})]
        ),
        ScriptedReply(text="Done."),
    )
    conversation = await converse(
        qwen_vocabulary,
        chat,
        TemplateMode.ACCEPT_DEVIATIONS,
        script=script,
        check_rate=check_rate,
    )
    later = conversation.tree.turns[1]
    assert "turn 0's generation prompt" in later.meta.extra[PROMPT_MISMATCH]
    assert OUTPUT_KEPT in later.meta.extra
    assert summarize(conversation.tree).outputs_kept
    deployed = qwen_vocabulary.decode(deployed_ids(qwen_vocabulary, chat, conversation.bodies[1]))
    assert "Look first." in qwen_vocabulary.decode(conversation.sent[1])
    assert "Look first." not in deployed
