"""Every prompt the adapter sends equals transformers' render of the client's own raw request.

The reference is built from the request exactly as the client sent it, never from the adapter's
converted messages: the Chat Completions body goes to ``apply_chat_template`` the way SGLang's and
vLLM's chat endpoints pass it (tool-call arguments decoded from their JSON text, everything else,
tool schemas included, as sent: key order and all). Tools whose schema keys are not in
alphabetical order make any sorting on the way visible. For the Anthropic dialect, whose bodies no
chat template reads as they are, the tool list the prompt prints is checked against the client's
schemas directly.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anthropic
import openai
from transformers import PreTrainedTokenizerFast

from protocol_adapters._template.template import qwen3_template
from protocol_adapters._tokenizer import Vocabulary
from protocol_adapters.testing import ScriptedReply
from protocol_adapters.testing.stack import local_stack
from trajectory_tree import linearize

# Keys in an order no sorting keeps: "type" before "properties", "workdir" before "cmd".
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "workdir": {"type": "string", "description": "Where to run it"},
        "cmd": {"type": "string", "description": "The command"},
        "timeout": {"type": "integer"},
    },
    "required": ["cmd"],
    "additionalProperties": False,
}
CHAT_TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {"name": "exec_command", "description": "Run a command", "parameters": SCHEMA},
    }
]
SCRIPT = [
    ScriptedReply(
        text="Listing first.",
        tool_calls=[("exec_command", {"workdir": "/repo", "cmd": "ls", "timeout": 10})],
    ),
    ScriptedReply(tool_calls=[("exec_command", {"cmd": "cat a.py"})]),
    ScriptedReply(text="a.py is empty."),
]
SPECIAL = {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"}


def as_engine_passes_it(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The raw Chat messages as SGLang's and vLLM's chat endpoints hand them to the template:
    assistant tool-call arguments decoded from their JSON text (key order kept); nothing else
    touched."""
    out: list[dict[str, Any]] = json.loads(json.dumps(list(messages)))
    for message in out:
        for call in message.get("tool_calls") or ():
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    return out


def reference_ids(vocabulary: Vocabulary, body: dict[str, Any]) -> list[int]:
    hf = PreTrainedTokenizerFast(tokenizer_object=vocabulary.tokenizer)  # type: ignore[no-untyped-call]
    ids = hf.apply_chat_template(
        as_engine_passes_it(body["messages"]),
        tools=body.get("tools"),
        chat_template=qwen3_template().source,
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
        bos_token=SPECIAL["bos_token"],
        eos_token=SPECIAL["eos_token"],
    )
    return list(ids)


async def test_chat_prompts_equal_the_template_render_of_the_raw_request(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    async with local_stack(
        SCRIPT, tokenizer_cache=tokenizer_cache, vocabulary=qwen_vocabulary
    ) as stack:
        session = stack.server.sessions.open("parity-chat")
        api = openai.AsyncOpenAI(
            base_url=stack.server.url + "/v1", api_key=session.token, max_retries=0
        )
        messages: list[Any] = [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "What is in the repository?"},
        ]
        bodies: list[dict[str, Any]] = []
        for _ in SCRIPT:
            body = {"model": "policy", "messages": messages, "tools": CHAT_TOOLS}
            bodies.append(json.loads(json.dumps(body)))
            completion = await api.chat.completions.create(
                model="policy", messages=messages, tools=CHAT_TOOLS, max_tokens=512
            )
            message = completion.choices[0].message
            messages = [*messages, message.model_dump(exclude_none=True)]
            for call in message.tool_calls or ():
                messages.append({"role": "tool", "tool_call_id": call.id, "content": "a.py"})
        await api.close()
        sent = [list(request.input_ids) for request in stack.double.requests]
    assert len(sent) == len(bodies) == 3
    for turn, (body, ids) in enumerate(zip(bodies, sent, strict=True)):
        assert ids == reference_ids(qwen_vocabulary, body), f"turn {turn}"
    assert len(linearize(session.tree).samples) == 1  # and every turn bridged onto the last


async def test_anthropic_tool_schemas_reach_the_prompt_as_the_client_sent_them(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    tools: list[Any] = [
        {"name": "exec_command", "description": "Run a command", "input_schema": SCHEMA}
    ]
    async with local_stack(
        [ScriptedReply(text="Hello.")], tokenizer_cache=tokenizer_cache, vocabulary=qwen_vocabulary
    ) as stack:
        session = stack.server.sessions.open("parity-anthropic")
        api = anthropic.AsyncAnthropic(
            base_url=stack.server.url, api_key=session.token, max_retries=0
        )
        await api.messages.create(
            model="policy",
            max_tokens=256,
            messages=[{"role": "user", "content": "Hi"}],
            tools=tools,
        )
        await api.close()
        prompt = qwen_vocabulary.decode(list(stack.double.requests[0].input_ids))
    # The template prints each tool with `tojson`: the schema as the client ordered it.
    expected = json.dumps(SCHEMA, ensure_ascii=False)
    assert expected in prompt, prompt
    assert json.dumps(SCHEMA, sort_keys=True, ensure_ascii=False) not in prompt
