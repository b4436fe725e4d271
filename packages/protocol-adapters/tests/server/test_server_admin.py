"""The session API on its own listener, in process: what the agent-facing port refuses, what the
admin port demands, and that closing a session never loses its tree."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from server_clients import always_ok, sdk_post

from protocol_adapters._server import admin as admin_module
from protocol_adapters._server.config import AdapterConfig, AdminConfig
from protocol_adapters._tokenizer import Vocabulary
from protocol_adapters.testing import Faults, ScriptedReply
from protocol_adapters.testing.stack import LocalStack, local_stack
from trajectory_tree import FinishReason, SessionTree, dumps, loads

ADMIN = AdminConfig(token="admin-s3cret")
BEARER = {"Authorization": f"Bearer {ADMIN.token}"}


@asynccontextmanager
async def admin_stack(
    tokenizer_cache: Path, vocabulary: Vocabulary, script: Any = always_ok
) -> AsyncIterator[tuple[LocalStack, aiohttp.ClientSession, str]]:
    async with (
        local_stack(
            script,
            tokenizer_cache=tokenizer_cache,
            vocabulary=vocabulary,
            config=AdapterConfig(admin=ADMIN),
        ) as stack,
        aiohttp.ClientSession() as http,
    ):
        admin_url = stack.server.admin_url
        assert admin_url is not None
        yield stack, http, admin_url


async def open_session(http: aiohttp.ClientSession, admin_url: str, **body: Any) -> str:
    async with http.post(f"{admin_url}/admin/sessions", json=body, headers=BEARER) as r:
        assert r.status == 200, await r.text()
        return str((await r.json())["token"])


async def test_the_agent_port_has_no_session_api(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    async with admin_stack(tokenizer_cache, qwen_vocabulary) as (stack, http, admin_url):
        token = await open_session(http, admin_url)
        agent = stack.server.url
        assert agent != admin_url
        for method, path in (
            ("POST", "/admin/sessions"),
            ("GET", f"/admin/sessions/{token}/tree"),
            ("DELETE", f"/admin/sessions/{token}"),
        ):
            for headers in (BEARER, {"Authorization": f"Bearer {token}"}, {}):
                async with http.request(method, agent + path, headers=headers) as r:
                    assert r.status == 404, (method, path)
        assert stack.server.sessions.get(token).closed is False


async def test_the_admin_port_wants_the_admin_token_and_nothing_else(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    async with admin_stack(tokenizer_cache, qwen_vocabulary) as (stack, http, admin_url):
        token = await open_session(http, admin_url, session_id="ep-1")
        await sdk_post(
            stack,
            "anthropic",
            token,
            {"model": "p", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
        )
        tree_url = f"{admin_url}/admin/sessions/{token}/tree"
        for offered in (None, token, "sess-guess", ADMIN.token[:-1], ADMIN.token + "x"):
            headers = {} if offered is None else {"Authorization": f"Bearer {offered}"}
            for method, url in (
                ("GET", tree_url),
                ("DELETE", f"{admin_url}/admin/sessions/{token}"),
            ):
                async with http.request(method, url, headers=headers) as r:
                    assert r.status == 401
            async with http.post(f"{admin_url}/admin/sessions", json={}, headers=headers) as r:
                assert r.status == 401
        # The model-call API is not served here, whatever the token.
        async with http.post(f"{admin_url}/v1/messages", json={}, headers=BEARER) as r:
            assert r.status == 404
        async with http.get(tree_url, headers=BEARER) as r:
            assert r.status == 200
            assert loads(await r.text()).session_id == "ep-1"
        assert len(stack.server.sessions) == 1


async def test_a_session_token_reaches_only_its_own_session(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    body = {"model": "p", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    async with admin_stack(tokenizer_cache, qwen_vocabulary) as (stack, http, admin_url):
        mine = await open_session(http, admin_url, session_id="mine")
        theirs = await open_session(http, admin_url, session_id="theirs")
        await sdk_post(stack, "anthropic", mine, body)
        registry = stack.server.sessions
        assert [len(registry.get(t).tree.turns) for t in (mine, theirs)] == [1, 0]


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"session_id": "\ud800"}, "session_id"),
        ({"context_tokens": 10**9}, "larger than the engine's"),
        ({"max_turns": "7"}, "max_turns"),
        ({"max_turns": True}, "max_turns"),
        ({"context_tokens": 2}, "context_tokens"),
    ],
)
async def test_bad_session_requests_are_400(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary, body: dict[str, Any], named: str
) -> None:
    async with admin_stack(tokenizer_cache, qwen_vocabulary) as (stack, http, admin_url):
        async with http.post(
            f"{admin_url}/admin/sessions", data=json.dumps(body), headers=BEARER
        ) as r:
            assert r.status == 400
            assert named in (await r.json())["error"]["message"]
        assert len(stack.server.sessions) == 0


async def test_a_close_that_fails_to_serialize_keeps_the_session(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tree is serialized before the session is forgotten: whatever goes wrong on the way,
    the session and every turn of it are still there to read and to close again."""
    body = {"model": "p", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    failures = [RuntimeError("disk on fire")]

    async def tree_json_once_broken(tree: SessionTree) -> str:
        if failures:
            raise failures.pop()
        return dumps(tree)

    async with admin_stack(tokenizer_cache, qwen_vocabulary) as (stack, http, admin_url):
        token = await open_session(http, admin_url)
        await sdk_post(stack, "anthropic", token, body)
        monkeypatch.setattr(admin_module, "tree_json", tree_json_once_broken)
        async with http.delete(f"{admin_url}/admin/sessions/{token}", headers=BEARER) as r:
            assert r.status == 500
        async with http.get(f"{admin_url}/admin/sessions/{token}/tree", headers=BEARER) as r:
            assert r.status == 200
            assert len(loads(await r.text()).turns) == 1
        async with http.delete(f"{admin_url}/admin/sessions/{token}", headers=BEARER) as r:
            assert r.status == 200
            assert len(loads(await r.text()).turns) == 1
        async with http.delete(f"{admin_url}/admin/sessions/{token}", headers=BEARER) as r:
            assert r.status == 404


async def test_closing_waits_for_the_generation_it_aborts_to_be_recorded(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    """A session closed mid-generation: the tree it returns already holds the aborted turn (the
    tokens the engine produced before the abort), not a tree that changes after it was sent."""
    long = ScriptedReply(text=" ".join(f"word{i}" for i in range(200)))
    body = {
        "model": "p",
        "max_tokens": 512,
        "stream": True,
        "messages": [{"role": "user", "content": "talk"}],
    }
    async with admin_stack(tokenizer_cache, qwen_vocabulary, [long]) as (stack, http, admin_url):
        stack.double.faults = Faults(chunk_delay=0.05)
        token = await open_session(http, admin_url)
        headers = {"Authorization": f"Bearer {token}"}
        async with http.post(stack.server.url + "/v1/messages", json=body, headers=headers) as r:
            assert r.status == 200
            while b"text_delta" not in await r.content.readany():
                pass
            async with http.delete(f"{admin_url}/admin/sessions/{token}", headers=BEARER) as d:
                assert d.status == 200
                tree = loads(await d.text())
            rest = await asyncio.wait_for(r.read(), 10)
    assert b"event: error" in rest  # the client learns its reply was cut off
    assert len(tree.turns) == 1
    (turn,) = tree.turns
    assert turn.finish_reason is FinishReason.ABORT
    assert turn.output_length > 0
    assert stack.double.aborts == [turn.meta.request_id]
