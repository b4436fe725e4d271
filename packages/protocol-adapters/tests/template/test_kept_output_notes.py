"""A kept output is noted on every turn whose prompt holds it, not only where it first showed.

A template that drops the reasoning of earlier turns once a user message follows (Qwen3's own
does) renders every later prompt without it, while bridged prompts keep the model's reasoning as
it was generated. Every one of those prompts differs from the template's render for that reason:
each is counted under ``outputs_kept``, whatever turns the sampled check happened to look at.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from template_session import SPECIAL, ChatSession, agent_session, reference_ids, trait_template

from protocol_adapters._audit import TemplateMode
from protocol_adapters._bridge import Renderer, RendererConfig
from protocol_adapters._bridge.notes import OUTPUT_KEPT, REASONING_KEPT
from protocol_adapters._template import ChatTemplate
from protocol_adapters._tokenizer import Vocabulary
from trajectory_tree import summarize

SMALL = Path(__file__).parent.parent / "fixtures" / "small_tokenizer.json"
REASONING_AFTER_LAST_USER_ONLY = "loop.index0 > ns.last_user"


@pytest.fixture(scope="module")
def small() -> Vocabulary:
    return Vocabulary.from_file(SMALL)


@pytest.mark.parametrize("rate", [1.0, 0.0])
def test_every_prompt_that_keeps_dropped_reasoning_is_noted(small: Vocabulary, rate: float) -> None:
    source = trait_template(reasoning_shown=REASONING_AFTER_LAST_USER_ONLY)
    chat = ChatTemplate("drops-reasoning", source, SPECIAL)
    config = RendererConfig(check_sample_rate=rate, mode=TemplateMode.ACCEPT_DEVIATIONS)
    session = ChatSession(Renderer(small, chat, config), small)
    agent_session(session)
    differs = [
        rendered.ids.tolist() != reference_ids(small, source, prompt)
        for prompt, rendered in session.sent
    ]
    noted = [OUTPUT_KEPT in rendered.notes for _, rendered in session.sent]
    assert any(differs)
    assert noted == differs  # each prompt that differs, and only those
    if rate == 0.0:  # no sampled check: told on every turn by the skeleton render
        notes = {
            rendered.notes.get(OUTPUT_KEPT)
            for (_, rendered), different in zip(session.sent, differs, strict=True)
            if different
        }
        assert notes == {REASONING_KEPT}
    assert sum(summarize(session.tree).outputs_kept.values()) == sum(differs)
