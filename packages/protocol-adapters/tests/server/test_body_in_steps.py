"""Large bodies are parsed in steps (huge strings decoded a slice at a time): the result is
``json.loads``'s, escapes, surrogate pairs, lone surrogates and long keys included."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol_adapters._server import body as body_module
from protocol_adapters._server.body import decode_body, loads_in_steps
from protocol_adapters._types import AdapterError

# Characters whose escapes are long (\uXXXX, surrogate pairs) or short (\n, \\, \"), mixed with
# plain text, so slices fall next to and inside escapes.
CHARS = st.sampled_from(
    ['"', "\\", "\n", "\t", "\x01", "a", " ", "é", "猫", "\U0001f600", "\ud800"]
)
STRINGS = st.lists(CHARS, max_size=80).map("".join)
JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), STRINGS),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(STRINGS, inner, max_size=4)
    ),
    max_leaves=12,
)


@pytest.fixture
def short_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Steps of a few characters, so that every string of the test counts as huge."""
    monkeypatch.setattr(body_module, "STEP_CHARS", 7)


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(value=JSON, ascii_only=st.booleans())
def test_parsing_in_steps_gives_what_json_loads_gives(
    short_steps: None, value: Any, ascii_only: bool
) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only)
    assert loads_in_steps(text) == json.loads(text)


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=st.text(max_size=60))
def test_invalid_json_fails_as_json_loads_fails(short_steps: None, text: str) -> None:
    assert outcome(loads_in_steps, text) == outcome(json.loads, text)


def outcome(parse: Any, text: str) -> tuple[str, object]:
    try:
        return "value", parse(text)
    except json.JSONDecodeError as error:
        return "error", str(error)


def test_a_huge_string_of_nothing_but_escapes(short_steps: None) -> None:
    value = {"content": '\U0001f600\ud83d\\"' * 50 + "\ud800"}
    for ascii_only in (True, False):
        text = json.dumps(value, ensure_ascii=ascii_only)
        assert loads_in_steps(text) == value


def test_a_large_body_decoded_in_steps_is_the_same_request(short_steps: None) -> None:
    content = 'line one\n\tline "two" é 猫 \U0001f600\n' * 40
    raw = json.dumps(
        {"model": "policy", "max_tokens": 8, "messages": [{"role": "user", "content": content}]}
    ).encode()
    assert decode_body("anthropic", raw, in_steps=True) == decode_body("anthropic", raw)
    bad = raw.replace(b"line one", b"line \\ud800", 1)
    for in_steps in (False, True):
        with pytest.raises(AdapterError, match=r"^messages\.0\.content: .*U\+D800"):
            decode_body("anthropic", bad, in_steps=in_steps)
