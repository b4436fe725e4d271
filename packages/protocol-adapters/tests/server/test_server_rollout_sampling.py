"""The rollout's sampling reaches the engine: min-p and stop strings too, whoever decides the
rest, the rollout's stop strings sent beside the client's, each turn recording what applied."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from server_clients import DIALECTS, Dialect, always_ok, minimal_body, sdk_post

from protocol_adapters import AdapterConfig, RolloutSampling, Vocabulary
from protocol_adapters.testing.stack import local_stack


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_min_p_and_stop_strings_of_the_rollout_reach_the_engine(
    tokenizer_cache: Path, qwen_vocabulary: Vocabulary, dialect: Dialect
) -> None:
    sampling = RolloutSampling(
        temperature=0.6, top_p=0.95, top_k=20, max_new_tokens=300, min_p=0.05, stop=("</done>",)
    )
    async with local_stack(
        always_ok,
        tokenizer_cache=tokenizer_cache,
        vocabulary=qwen_vocabulary,
        config=AdapterConfig(sampling=sampling),
    ) as stack:
        session = stack.server.sessions.open("sampling")
        body = {**minimal_body(dialect, "hi", max_tokens=1000), "temperature": 1.5}
        if dialect == "anthropic":
            body["stop_sequences"] = ["STOP", "</done>"]
        elif dialect == "openai_chat":
            body["stop"] = ["STOP"]
        assert await sdk_post(stack, dialect, session.token, body) == "ok"
    sent = stack.double.requests[0].sampling_params
    assert (sent["temperature"], sent["top_p"], sent["top_k"]) == (0.6, 0.95, 20)
    assert (sent["min_p"], sent["max_new_tokens"]) == (0.05, 300)
    client_stop = {"anthropic": ["STOP"], "openai_chat": ["STOP"]}.get(dialect, [])
    assert sent["stop"] == [*client_stop, "</done>"]  # each string once, the client's first
    extra = session.tree.turns[0].meta.extra
    assert extra["min_p"] == "0.05"
    assert json.loads(extra["rollout_stop"]) == ["</done>"]


def test_rollout_sampling_refuses_what_the_engine_would() -> None:
    with pytest.raises(ValueError, match=r"min_p must be in \[0, 1\], got 1.5"):
        RolloutSampling(min_p=1.5)
    with pytest.raises(ValueError, match="stop must be a tuple of non-empty strings"):
        RolloutSampling(stop=("",))
    with pytest.raises(ValueError, match="stop must be a tuple of non-empty strings"):
        RolloutSampling(stop="</done>")  # type: ignore[arg-type]
