"""``protocol-adapters serve`` as its own process, sessions managed over the admin API."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

import aiohttp
import anthropic

from protocol_adapters.testing import EngineDouble, ScriptedReply
from protocol_adapters.testing.stack import VocabularyTokenizer
from protocol_adapters.tokenizer import Vocabulary
from trajectory_tree import loads


async def _serving_url(process: asyncio.subprocess.Process) -> str:
    assert process.stderr is not None
    while True:
        line = (await asyncio.wait_for(process.stderr.readline(), 60)).decode()
        assert line, "server exited before serving"
        if match := re.search(r"serving on (http://\S+);", line):
            return match.group(1)


async def test_serve_process_with_admin_sessions(
    tmp_path: Path, tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    admin = tmp_path / "admin-token"
    admin.write_text("s3cret-admin\n")
    script = [ScriptedReply(text="Hello from the policy.")]
    async with EngineDouble(VocabularyTokenizer(qwen_vocabulary), script) as double:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "protocol_adapters",
            "serve",
            "--engine-url",
            double.url,
            "--qwen3-cache",
            str(tokenizer_cache),
            "--port",
            "0",
            "--admin-token-file",
            str(admin),
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            url = await _serving_url(process)
            auth = {"Authorization": "Bearer s3cret-admin"}
            async with aiohttp.ClientSession() as http:
                async with http.post(f"{url}/admin/sessions", json={"session_id": "ep-1"}) as r:
                    assert r.status == 401
                async with http.post(
                    f"{url}/admin/sessions", json={"session_id": "ep-1"}, headers=auth
                ) as r:
                    token = (await r.json())["token"]
                api = anthropic.AsyncAnthropic(base_url=url, api_key=token, max_retries=0)
                reply = await api.messages.create(
                    model="policy", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
                )
                await api.close()
                assert reply.content[0].text == "Hello from the policy."  # type: ignore[union-attr]
                async with http.delete(f"{url}/admin/sessions/{token}", headers=auth) as r:
                    assert r.status == 200
                    tree = loads(await r.text())
                async with http.get(f"{url}/admin/sessions/{token}/tree", headers=auth) as r:
                    assert r.status == 404
            assert tree.session_id == "ep-1"
            assert len(tree.turns) == 1
            assert list(tree.prompt_ids(tree.turns[0])) == list(double.requests[0].input_ids)
        finally:
            process.terminate()
            assert await asyncio.wait_for(process.wait(), 30) == 0
