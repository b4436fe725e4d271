"""Side requests and structured output through the real server.

A client's housekeeping call (Claude Code's session title) is answered like any other, recorded,
and excluded from training as ``side_request``; the JSON schema a client asks the reply to follow
reaches SGLang as its ``json_schema`` constraint in every dialect, instead of being dropped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from server_checks import assert_engine_tokens_trained
from server_clients import (
    DIALECTS,
    PATHS,
    Dialect,
    assert_error_body,
    minimal_body,
    raw_request,
    sdk_post,
)

from protocol_adapters._server.config import AdapterConfig
from protocol_adapters._server.side_requests import CLAUDE_CODE_SESSION_TITLE, SideRequestRule
from protocol_adapters._tokenizer import Vocabulary
from protocol_adapters.testing import ScriptedReply
from protocol_adapters.testing.stack import LocalStack, local_stack
from trajectory_tree import Exclusion, LossReason, linearize, summarize

SESSION_ID = {"x-claude-code-session-id": "2f0c5a7e-title-test"}
TITLE_SCHEMA = {
    "type": "object",
    "properties": {"title": {"type": "string"}},
    "required": ["title"],
    "additionalProperties": False,
}
MAIN = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 32000,
    "system": [{"type": "text", "text": "You are Claude Code, a coding agent."}],
    "tools": [
        {
            "name": "Bash",
            "description": "Run a shell command",
            "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
        }
    ],
    "messages": [{"role": "user", "content": "Fix the failing parser test."}],
    "stream": True,
}
TITLE = {
    "model": "claude-sonnet-4-5",  # the main agent's model and max_tokens
    "max_tokens": 32000,
    "system": [
        {
            "type": "text",
            "text": "You are naming a coding session so the user can pick it out of a long list "
            "of sessions. The title is a name for what the session is about, not a sentence.",
        }
    ],
    "tools": [],
    "messages": [
        {
            "role": "user",
            "content": "<session>\nFix the failing parser test.\n</session>\n\nWrite the title in "
            "the predominant language of the session.",
        }
    ],
    "output_config": {"format": {"type": "json_schema", "schema": TITLE_SCHEMA}},
    "stream": True,
}


async def post(stack: LocalStack, token: str, body: dict[str, Any]) -> int:
    """Claude Code's way: streamed, with its session id header."""
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            stack.server.url + "/v1/messages",
            json=body,
            headers={"x-api-key": token, **SESSION_ID},
        ) as response,
    ):
        await response.read()
        return response.status


async def test_claude_codes_title_request_is_answered_and_never_trained(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    script = [ScriptedReply(text="Looking at the test."), ScriptedReply(text='{"title": "Parser"}')]
    async with local_stack(
        script, tokenizer_cache=tokenizer_cache, vocabulary=qwen_vocabulary
    ) as stack:
        session = stack.server.sessions.open("title")
        assert await post(stack, session.token, MAIN) == 200
        assert await post(stack, session.token, TITLE) == 200
    main, title = session.tree.turns
    assert not main.meta.side_request
    assert title.meta.side_request
    assert title.meta.extra["side_request"] == "claude_code_session_title"
    title_request = stack.double.requests[1]
    assert json.loads(str(title_request.sampling_params["json_schema"])) == TITLE_SCHEMA
    assert "json_schema" not in stack.double.requests[0].sampling_params
    lin = linearize(session.tree)
    assert lin.exclusions == (Exclusion(title.id, LossReason.SIDE_REQUEST, title.output_length),)
    assert [s.trained_turns for s in lin.samples] == [(main.id,)]
    assert summarize(session.tree, lin).side_requests == 1
    assert_engine_tokens_trained(stack, session.tree, lin)


async def test_side_request_rules_are_configuration(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    """Without the rule the title is trained like any call; a rule of one's own is applied."""
    mine = SideRequestRule(name="my-summary", last_user_starts_with="Summarize:")
    for rules, marked in (((), None), ((mine, CLAUDE_CODE_SESSION_TITLE), "my-summary")):
        config = AdapterConfig(side_requests=rules)
        async with local_stack(
            [ScriptedReply(text="ok")] * 2,
            tokenizer_cache=tokenizer_cache,
            vocabulary=qwen_vocabulary,
            config=config,
        ) as stack:
            session = stack.server.sessions.open("rules")
            assert await post(stack, session.token, TITLE) == 200
            summary = {**MAIN, "messages": [{"role": "user", "content": "Summarize: the log"}]}
            assert await post(stack, session.token, summary) == 200
        title, summarized = session.tree.turns
        assert title.meta.side_request is (marked is not None)
        assert summarized.meta.extra.get("side_request") == marked


def title_near_misses() -> list[dict[str, Any]]:
    """The title's shape minus one feature each: not side requests."""
    with_tools = {**TITLE, "tools": MAIN["tools"]}
    no_schema = {key: value for key, value in TITLE.items() if key != "output_config"}
    other_user = {**TITLE, "messages": [{"role": "user", "content": "Name this session."}]}
    return [with_tools, no_schema, other_user]


@pytest.mark.parametrize("body", title_near_misses(), ids=["tools", "no-schema", "other-user"])
async def test_only_the_whole_shape_is_a_side_request(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary, body: dict[str, Any]
) -> None:
    async with local_stack(
        [ScriptedReply(text="ok")], tokenizer_cache=tokenizer_cache, vocabulary=qwen_vocabulary
    ) as stack:
        session = stack.server.sessions.open("near-miss")
        assert await post(stack, session.token, body) == 200
    assert not session.tree.turns[0].meta.side_request


SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
STRUCTURED: dict[Dialect, dict[str, Any]] = {
    "anthropic": {"output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}},
    "openai_chat": {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True},
        }
    },
    "openai_responses": {
        "text": {"format": {"type": "json_schema", "name": "answer", "schema": SCHEMA}}
    },
}


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_structured_output_reaches_the_engine_as_its_json_schema(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary, dialect: Dialect
) -> None:
    async with local_stack(
        [ScriptedReply(text='{"answer": 42}')],
        tokenizer_cache=tokenizer_cache,
        vocabulary=qwen_vocabulary,
    ) as stack:
        session = stack.server.sessions.open("structured")
        body = minimal_body(dialect, "What is the answer?") | STRUCTURED[dialect]
        assert await sdk_post(stack, dialect, session.token, body) == '{"answer": 42}'
    sent = stack.double.requests[0].sampling_params
    assert json.loads(str(sent["json_schema"])) == SCHEMA
    assert session.tree.turns[0].meta.extra["json_schema"] == sent["json_schema"]


@pytest.mark.parametrize(
    ("dialect", "extra", "schema"),
    [
        ("openai_chat", {"response_format": {"type": "json_object"}}, {"type": "object"}),
        ("openai_chat", {"response_format": {"type": "text"}}, None),
        ("openai_responses", {"text": {"format": {"type": "json_object"}}}, {"type": "object"}),
        ("openai_responses", {"text": {"format": {"type": "text"}, "verbosity": "low"}}, None),
    ],
)
async def test_json_object_and_text_formats(
    tokenizer_cache: Path,
    qwen_vocabulary: Vocabulary,
    dialect: Dialect,
    extra: dict[str, Any],
    schema: object,
) -> None:
    async with local_stack(
        [ScriptedReply(text="{}")], tokenizer_cache=tokenizer_cache, vocabulary=qwen_vocabulary
    ) as stack:
        session = stack.server.sessions.open("formats")
        await sdk_post(stack, dialect, session.token, minimal_body(dialect, "json?") | extra)
    sent = stack.double.requests[0].sampling_params.get("json_schema")
    assert (None if sent is None else json.loads(str(sent))) == schema


@pytest.mark.parametrize(
    ("dialect", "extra", "named"),
    [
        (
            "anthropic",
            {"output_config": {"format": {"type": "regex"}}},
            "output_config.format.type",
        ),
        ("anthropic", {"output_config": {"format": {"type": "json_schema"}}}, "schema"),
        ("openai_chat", {"response_format": {"type": "grammar"}}, "response_format.type"),
        ("openai_chat", {"response_format": {"type": "json_schema"}}, "json_schema"),
        ("openai_responses", {"text": {"format": {"type": "xml"}}}, "text.format.type"),
    ],
)
async def test_unknown_formats_are_400(
    tokenizer_cache: Path,
    qwen_vocabulary: Vocabulary,
    dialect: Dialect,
    extra: dict[str, Any],
    named: str,
) -> None:
    async with local_stack(
        [ScriptedReply(text="{}")], tokenizer_cache=tokenizer_cache, vocabulary=qwen_vocabulary
    ) as stack:
        session = stack.server.sessions.open("bad-format")
        body = minimal_body(dialect, "json?") | extra
        answer = await raw_request(
            stack, PATHS[dialect], json.dumps(body).encode(), token=session.token
        )
    assert named in assert_error_body(dialect, answer.status, answer.body, "invalid")
    assert stack.double.requests == []
