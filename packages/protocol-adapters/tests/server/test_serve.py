"""``protocol_adapters.serve``: the adapter in-process from one import, as the README shows it.

The engine is the SGLang-wire double (no GPU here) with the real Qwen3 tokenizer; the client is
the official anthropic SDK. The test checks what a user relies on: the served reply is the
engine's, the session's tree holds exactly the engine's tokens, and leaving the block stops the
server and closes the engine client.
"""

from __future__ import annotations

import aiohttp
import anthropic
import pytest

from protocol_adapters import (
    AdapterConfig,
    SessionLimits,
    SGLangConfig,
    Vocabulary,
    qwen3_template,
    serve,
)
from protocol_adapters.testing import EngineDouble, ScriptedReply
from protocol_adapters.testing.stack import VocabularyTokenizer
from trajectory_tree import linearize


async def test_serve_runs_the_adapter_in_front_of_an_sglang_engine_then_stops_it(
    qwen_vocabulary: Vocabulary,
) -> None:
    script = [ScriptedReply(text="Hello from the engine.")]
    async with EngineDouble(VocabularyTokenizer(qwen_vocabulary), script) as double:
        config = AdapterConfig(limits=SessionLimits(max_turns=3))
        async with serve(
            SGLangConfig(base_url=double.url), qwen_vocabulary, qwen3_template(), config
        ) as server:
            session = server.sessions.open("episode-1")
            client = anthropic.AsyncAnthropic(
                base_url=server.url, api_key=session.token, max_retries=0
            )
            reply = await client.messages.create(
                model="policy", max_tokens=64, messages=[{"role": "user", "content": "Hi."}]
            )
            await client.close()
            tree = (await server.close_session(session.token)).tree
            url, engine = server.url, server.engine

        assert [block.text for block in reply.content if block.type == "text"] == [
            "Hello from the engine."
        ]
        (sample,) = linearize(tree).samples
        trained = [t for t, m in zip(sample.tokens, sample.loss_mask, strict=True) if m]
        assert qwen_vocabulary.decode(trained) == "Hello from the engine.<|im_end|>"
        assert list(sample.tokens[: sample.prompt_length]) == list(double.requests[0].input_ids)
        assert len(server.sessions) == 0
        with pytest.raises(aiohttp.ClientConnectionError):
            async with aiohttp.ClientSession() as http, http.get(url + "/health"):
                pass
        with pytest.raises(RuntimeError, match="closed"):
            await engine.context_length()
