"""Anthropic Messages through the real server, driven by the official ``anthropic`` SDK: what is
not the contract every dialect keeps (``test_contract.py``): the trust check against a tampered
sample, large bodies decoded off the loop, and the engine's routing key."""

from __future__ import annotations

import dataclasses
import json
from array import array
from pathlib import Path

import aiohttp
import anthropic
import pytest
from dialect_drivers import AnthropicDriver

from protocol_adapters._server.config import AdapterConfig
from protocol_adapters._server.sessions import SessionLimits
from protocol_adapters._server.workers import LargeBodies
from protocol_adapters._tokenizer import Vocabulary
from protocol_adapters.testing import ScriptedReply
from protocol_adapters.testing.stack import LocalStack, local_stack
from protocol_adapters.testing.trust import TrustViolation, check_engine_tokens_trained
from trajectory_tree import linearize

SCRIPT = AnthropicDriver.script


def client(stack: LocalStack, token: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=stack.server.url, api_key=token, max_retries=0)


async def test_trust_check_catches_a_tampered_sample(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    async with local_stack(
        SCRIPT, tokenizer_cache=tokenizer_cache, vocabulary=qwen_vocabulary
    ) as stack:
        session = stack.server.sessions.open("tamper")
        async with AnthropicDriver(stack, session.token) as claude:
            first = await claude.ask(stream=False)
            claude.answer()
            second = await claude.ask(stream=False)
        assert min(first.input_tokens, first.output_tokens) > 0
        assert min(second.input_tokens, second.output_tokens) > 0
        lin = linearize(session.tree)
        check_engine_tokens_trained(stack, session.tree, lin)  # the honest one passes
        sample = lin.samples[0]
        trained = next(s for s in sample.spans if s.trained)
        logprobs = array("d", sample.logprobs)
        logprobs[trained.start] += 0.5
        tampered = dataclasses.replace(
            lin, samples=(dataclasses.replace(sample, logprobs=logprobs),)
        )
        with pytest.raises(TrustViolation, match="logprobs are not the engine's"):
            check_engine_tokens_trained(stack, session.tree, tampered)
        tokens = array("i", sample.tokens)
        tokens[trained.start] += 1
        forged = dataclasses.replace(sample, tokens=tokens)
        tampered = dataclasses.replace(lin, samples=(forged,))
        with pytest.raises(TrustViolation, match="not the engine's output ids"):
            check_engine_tokens_trained(stack, session.tree, tampered)


@pytest.mark.parametrize("where", ["pool", "large-body thread"])
async def test_large_bodies_are_decoded_off_the_loop_with_the_same_answers(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary, where: str
) -> None:
    """Bodies past 256 KB are decoded on a worker thread (past ``LargeBodies.threshold``, on the
    large-body thread): a valid one is answered, a broken one gets the same
    invalid_request_error as a small one would, with the same message, whichever path it took."""
    threshold = 256 * 1024 if where == "large-body thread" else LargeBodies().threshold
    config = AdapterConfig(
        limits=SessionLimits(context_tokens=262144), large_bodies=LargeBodies(threshold)
    )
    stack_of = local_stack(
        SCRIPT,
        tokenizer_cache=tokenizer_cache,
        vocabulary=qwen_vocabulary,
        config=config,
        engine_context_length=262144,
    )
    async with stack_of as stack:
        session = stack.server.sessions.open("large")
        api = client(stack, session.token)
        listing = "\n".join(f"src/module_{i}/file_{i}.py: 120 lines" for i in range(9000))
        assert len(listing) > 256 * 1024
        reply = await api.messages.create(
            model="policy", max_tokens=64, messages=[{"role": "user", "content": listing}]
        )
        assert reply.usage.input_tokens == len(stack.double.requests[0].input_ids)
        broken = b'{"model": "policy", "messages": [' + b" " * (300 * 1024)
        not_unicode = json.dumps(
            {"model": "policy", "messages": [{"role": "user", "content": listing + "\ud800"}]}
        ).encode()
        answers = []
        async with aiohttp.ClientSession() as http:
            for data in (broken, not_unicode):
                async with http.post(
                    stack.server.url + "/v1/messages",
                    data=data,
                    headers={"x-api-key": session.token, "content-type": "application/json"},
                ) as response:
                    assert response.status == 400
                    answers.append((await response.json())["error"])
        assert [a["type"] for a in answers] == ["invalid_request_error"] * 2
        assert "not valid JSON" in answers[0]["message"]
        assert answers[1]["message"] == (
            "messages.0.content: is not valid Unicode (lone surrogate U+D800)"
        )
        await api.close()


async def test_the_engine_routes_by_session_id_never_by_the_token(
    qwen_vocabulary: Vocabulary, tmp_path: Path
) -> None:
    async with local_stack(
        [ScriptedReply(text="one"), ScriptedReply(text="two")],
        tokenizer_cache=tmp_path,
        vocabulary=qwen_vocabulary,
    ) as stack:
        named = stack.server.sessions.open("episode-7")
        unnamed = stack.server.sessions.open()
        for session in (named, unnamed):
            await client(stack, session.token).messages.create(
                model="policy", max_tokens=16, messages=[{"role": "user", "content": "hi"}]
            )
        keys = [request.headers.get("x-smg-routing-key") for request in stack.double.requests]
    assert keys == ["episode-7", unnamed.tree.session_id]
    assert unnamed.tree.session_id.startswith("session-")
    assert unnamed.token not in unnamed.tree.session_id  # a credential never names a tree
