"""``protocol-adapters serve`` as its own process, sessions managed over the admin API, which
listens on its own port: the agent-facing port (the one forwarded into sandboxes) has none."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import aiohttp
import anthropic
import pytest
from serve_process import serve_command, serving

from protocol_adapters._tokenizer import Vocabulary
from protocol_adapters.testing import EngineDouble, ScriptedReply
from protocol_adapters.testing.stack import VocabularyTokenizer
from trajectory_tree import loads

ADMIN_TOKEN = "s3cret-admin"


async def test_serve_process_with_admin_sessions_on_their_own_listener(
    tmp_path: Path, tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    admin_file = tmp_path / "admin-token"
    admin_file.write_text(ADMIN_TOKEN + "\n")
    script = [ScriptedReply(text="Hello from the policy.")]
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with EngineDouble(
        VocabularyTokenizer(qwen_vocabulary), script, context_length=20480
    ) as double:
        command = serve_command(
            double.url, tokenizer_cache, "--admin-token-file", str(admin_file), "--admin-port", "0"
        )
        async with serving(command) as (url, admin_url, context), aiohttp.ClientSession() as http:
            assert context == 20480  # learned from the engine
            assert url != admin_url
            # The agent-facing listener has no session API, whatever the credentials.
            async with http.post(f"{url}/admin/sessions", json={}, headers=admin) as r:
                assert r.status == 404
            async with http.post(f"{admin_url}/admin/sessions", json={"session_id": "ep"}) as r:
                assert r.status == 401
            async with http.post(
                f"{admin_url}/admin/sessions", json={"session_id": "ep-1"}, headers=admin
            ) as r:
                token = (await r.json())["token"]
            async with http.post(
                f"{admin_url}/admin/sessions", json={"context_tokens": 40960}, headers=admin
            ) as r:
                assert r.status == 400  # larger than the engine's context
                assert "20480" in (await r.json())["error"]["message"]
            # A session token is no admin credential, not even for its own session.
            tree_url = f"{admin_url}/admin/sessions/{token}/tree"
            for guess in (token, "sess-guessed", ADMIN_TOKEN + "x"):
                async with http.get(tree_url, headers={"Authorization": f"Bearer {guess}"}) as r:
                    assert r.status == 401
            api = anthropic.AsyncAnthropic(base_url=url, api_key=token, max_retries=0)
            reply = await api.messages.create(
                model="policy", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
            )
            await api.close()
            assert reply.content[0].text == "Hello from the policy."  # type: ignore[union-attr]
            async with http.get(f"{url}/admin/sessions/{token}/tree", headers=admin) as r:
                assert r.status == 404
            async with http.delete(f"{admin_url}/admin/sessions/{token}", headers=admin) as r:
                assert r.status == 200
                tree = loads(await r.text())
            async with http.get(f"{admin_url}/admin/sessions/{token}/tree", headers=admin) as r:
                assert r.status == 404
            async with http.delete(f"{admin_url}/admin/sessions/{token}", headers=admin) as r:
                assert r.status == 404  # closing again changes nothing
    assert tree.session_id == "ep-1"
    assert len(tree.turns) == 1
    assert list(tree.prompt_ids(tree.turns[0])) == list(double.requests[0].input_ids)


async def test_serve_refuses_a_context_larger_than_the_engines(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    tokenizer = VocabularyTokenizer(qwen_vocabulary)
    async with EngineDouble(tokenizer, [], context_length=8192) as double:
        command = serve_command(double.url, tokenizer_cache, "--context-tokens", "16384")
        process = await asyncio.create_subprocess_exec(*command, stderr=asyncio.subprocess.PIPE)
        try:
            _, stderr = await asyncio.wait_for(process.communicate(), 60)
        finally:  # a server that wrongly starts must not outlive the test
            if process.returncode is None:
                process.kill()
                await process.wait()
    assert process.returncode == 1
    message = stderr.decode()
    assert "refusing to start" in message
    assert "16384" in message
    assert "8192" in message


async def test_serve_captures_routing_and_hands_it_out_with_the_tree(
    tmp_path: Path, tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    admin_file = tmp_path / "admin-token"
    admin_file.write_text(ADMIN_TOKEN)
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    script = [ScriptedReply(text="Routed.")]
    async with EngineDouble(VocabularyTokenizer(qwen_vocabulary), script) as double:
        command = serve_command(
            double.url,
            tokenizer_cache,
            "--admin-token-file",
            str(admin_file),
            "--admin-port",
            "0",
            "--routed-experts",
            f"{double.routed_layers}x{double.routed_topk}",
        )
        async with serving(command) as (url, admin_url, _), aiohttp.ClientSession() as http:
            sessions = f"{admin_url}/admin/sessions"
            async with http.post(sessions, json={}, headers=admin) as r:
                token = (await r.json())["token"]
            api = anthropic.AsyncAnthropic(base_url=url, api_key=token, max_retries=0)
            await api.messages.create(
                model="policy", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
            )
            await api.close()
            async with http.delete(f"{sessions}/{token}?routing=1", headers=admin) as r:
                body = await r.read()
                split = int(r.headers["Tree-Json-Bytes"])
    tree = loads(body[:split].decode(), routing=body[split:])
    (turn,) = tree.turns
    assert double.requests[0].routed_experts_start_len == 0
    assert turn.routed_experts is not None
    sequence = [*tree.prompt_ids(turn), *tree.output_ids(turn)]
    assert turn.routed_experts.experts == double.expected_routing(sequence, 0)


@pytest.mark.parametrize("shape", ["48", "0x8", "48x", "axb"])
def test_serve_refuses_a_routing_shape_that_is_not_one(shape: str) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "protocol_adapters",
            "serve",
            "--engine-url",
            "http://x",
            "--routed-experts",
            shape,
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "expected LAYERSxTOPK" in done.stderr
