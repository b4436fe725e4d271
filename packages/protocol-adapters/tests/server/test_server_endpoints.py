"""The smaller surfaces, through the SDKs: ``?beta=true``, ``count_tokens``, ``/v1/models``,
``/health``, and the ``role: "system"`` entries Claude Code puts inside ``messages``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
from server_checks import assert_engine_tokens_trained
from server_clients import always_ok, anthropic_client, openai_client, raw_request

from protocol_adapters._server.config import AdapterConfig
from protocol_adapters._tokenizer import Vocabulary
from protocol_adapters.testing import ScriptedReply
from protocol_adapters.testing.stack import local_stack
from trajectory_tree import linearize

TOOLS: list[Any] = [
    {
        "name": "Bash",
        "description": "Run a shell command",
        "input_schema": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    }
]
REQUEST: dict[str, Any] = {
    "model": "policy",
    "max_tokens": 64,
    "system": "You are Claude Code.",
    "tools": TOOLS,
    "messages": [{"role": "user", "content": "Count me."}],
}


async def test_beta_query_is_accepted_and_count_tokens_is_the_prompt_the_engine_gets(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    async with local_stack(
        always_ok, tokenizer_cache=tokenizer_cache, vocabulary=qwen_vocabulary
    ) as stack:
        session = stack.server.sessions.open("count")
        async with anthropic_client(stack, session.token) as api:
            to_count = {k: v for k, v in REQUEST.items() if k != "max_tokens"}
            counted = await api.messages.count_tokens(**to_count)
            beta_counted = await api.beta.messages.count_tokens(**to_count)
            message = await api.beta.messages.create(**REQUEST)  # POST /v1/messages?beta=true
            async with api.beta.messages.stream(**REQUEST) as events:
                streamed = await events.get_final_message()
        # Explicitly, as Claude Code sends it:
        raw = await raw_request(
            stack, "/v1/messages?beta=true", json.dumps(REQUEST).encode(), token=session.token
        )
        assert raw.status == 200
        assert raw.body["content"] == [{"type": "text", "text": "ok"}]
        assert message.content[0].text == "ok"
        assert streamed.content[0].text == "ok"  # type: ignore[union-attr]
        sent = stack.double.requests[0]
        assert counted.input_tokens == len(sent.input_ids)
        assert beta_counted.input_tokens == counted.input_tokens
        assert message.usage.input_tokens == counted.input_tokens
        assert streamed.usage.input_tokens == counted.input_tokens
        # count_tokens is not a model call: nothing recorded, the turn cap untouched.
        assert len(session.tree.turns) == 3
        assert session.answered == 3


async def test_models_and_health_shapes(tokenizer_cache: Path, qwen_vocabulary: Vocabulary) -> None:
    config = AdapterConfig(models=("policy", "claude-sonnet-4-5"))
    async with local_stack(
        always_ok, tokenizer_cache=tokenizer_cache, vocabulary=qwen_vocabulary, config=config
    ) as stack:
        session = stack.server.sessions.open("models")
        async with anthropic_client(stack, session.token) as api:
            listed = [m async for m in api.models.list()]
        assert [(m.id, m.type, m.display_name) for m in listed] == [
            ("policy", "model", "policy"),
            ("claude-sonnet-4-5", "model", "claude-sonnet-4-5"),
        ]
        async with openai_client(stack, session.token) as oai:
            models = [m async for m in oai.models.list()]
        assert [(m.id, m.object) for m in models] == [
            ("policy", "model"),
            ("claude-sonnet-4-5", "model"),
        ]
        async with (
            aiohttp.ClientSession() as http,
            http.get(stack.server.url + "/health") as response,
        ):
            assert response.status == 200
            assert await response.json() == {"status": "ok", "sessions": 1}


async def test_system_entries_inside_messages_render_and_keep_the_branch(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    """Claude Code sends ``role: "system"`` messages (environment listing, mid-turn notes)."""
    script = [
        ScriptedReply(text="Listing.", tool_calls=[("Bash", {"command": "ls"})]),
        ScriptedReply(text="Two files."),
    ]
    async with local_stack(
        script, tokenizer_cache=tokenizer_cache, vocabulary=qwen_vocabulary
    ) as stack:
        session = stack.server.sessions.open("system-notes")
        messages: list[Any] = [
            {"role": "user", "content": "What is here?"},
            {"role": "system", "content": "Environment: /repo, 2 files."},
        ]
        async with anthropic_client(stack, session.token) as api:
            first = await api.messages.create(**{**REQUEST, "messages": messages})
            use = first.content[1]
            assert use.type == "tool_use"
            messages.append(
                {"role": "assistant", "content": [b.model_dump() for b in first.content]}
            )
            messages.append(
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "a b"}],
                }
            )
            messages.append({"role": "system", "content": "Note: the user is waiting."})
            second = await api.messages.create(**{**REQUEST, "messages": messages})
        assert second.content[0].text == "Two files."
        tree = session.tree
        roles = [m.role for m in tree.request_messages(tree.turns[1])]
        assert roles == ["system", "user", "system", "assistant", "tool", "system"]
        prompt = qwen_vocabulary.decode(list(stack.double.requests[1].input_ids))
        assert "Environment: /repo, 2 files." in prompt
        assert "Note: the user is waiting." in prompt
        lin = linearize(tree)
        assert len(lin.samples) == 1
        assert_engine_tokens_trained(stack, tree, lin)
        assert stack.renderer.stats.full_renders == 0
