"""The engine's timeouts are ``serve`` flags: they reach the SGLang client of a running server."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest
from serve_process import serve_command, serving

from protocol_adapters.__main__ import _parser, engine_config, main
from protocol_adapters._engine import SGLangConfig
from protocol_adapters._tokenizer import Vocabulary
from protocol_adapters.testing import EngineDouble, Faults, ScriptedReply
from protocol_adapters.testing.stack import VocabularyTokenizer

REQUIRED = ["serve", "--engine-url", "http://gpu:30000", "--qwen3-cache", "/tmp/q"]


def test_the_flags_default_to_the_clients_defaults_and_set_each_timeout() -> None:
    defaults = SGLangConfig("http://gpu:30000")
    assert engine_config(_parser().parse_args(REQUIRED)) == defaults
    flags = [
        "--engine-connect-timeout",
        "1.5",
        "--engine-request-timeout",
        "30",
        "--engine-stream-idle-timeout",
        "7",
        "--engine-max-connections",
        "64",
    ]
    config = engine_config(_parser().parse_args([*REQUIRED, *flags]))
    assert (
        config.connect_timeout,
        config.request_timeout,
        config.stream_idle_timeout,
        config.max_connections,
    ) == (1.5, 30.0, 7.0, 64)


def test_a_timeout_that_is_not_positive_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*REQUIRED, "--engine-connect-timeout", "0"])
    assert exited.value.code == 2
    assert "connect_timeout must be a positive number of seconds" in capsys.readouterr().err


async def test_the_request_timeout_flag_reaches_the_engine_client(
    tmp_path: Path, tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    admin_file = tmp_path / "admin-token"
    admin_file.write_text("timeout-test-admin\n")
    admin = {"Authorization": "Bearer timeout-test-admin"}
    async with EngineDouble(
        VocabularyTokenizer(qwen_vocabulary),
        [ScriptedReply(text="too late")],
        faults=Faults(latency=30.0),
    ) as double:
        command = serve_command(
            double.url,
            tokenizer_cache,
            "--admin-token-file",
            str(admin_file),
            "--admin-port",
            "0",
            "--engine-request-timeout",
            "0.5",
        )
        async with serving(command) as (url, admin_url, _), aiohttp.ClientSession() as http:
            async with http.post(f"{admin_url}/admin/sessions", json={}, headers=admin) as r:
                token = (await r.json())["token"]
            body = {"model": "p", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
            async with http.post(
                f"{url}/v1/messages", json=body, headers={"x-api-key": token}
            ) as response:
                status, answer = response.status, json.loads(await response.read())
    assert status == 504
    assert answer["error"]["type"] == "timeout_error"
    assert "0.5s (request timeout)" in answer["error"]["message"]
    assert len(double.requests) == 1
