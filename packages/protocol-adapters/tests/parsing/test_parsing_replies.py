"""Reply parsing: well-formed, malformed, truncated and streamed output, with real Qwen3 ids."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol_adapters._parsing import (
    BuiltinReplyParser,
    IncrementalDecoder,
    ParserBackend,
    ParserConfig,
    SGLangUnavailable,
    ToolCallFormat,
    make_reply_parser,
    new_call_id,
    resolve_backend,
    select,
    sglang_available,
)
from protocol_adapters._server.ports import reply_parsers
from protocol_adapters._tokenizer import QwenTokenizerConfig, Vocabulary, load_qwen3_vocabulary
from protocol_adapters._types import ParsedReply, ReasoningDelta, TextDelta, ToolCallDone
from trajectory_tree import Message, Reasoning, Text, ToolCall, ToolSpec

XML = ParserConfig(tool_format=ToolCallFormat.QWEN3_CODER_XML)
TOOLS = (
    ToolSpec(
        "edit",
        "",
        json.dumps(
            {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "line": {"type": "integer"},
                    "dry": {"type": "boolean"},
                },
            }
        ),
    ),
)


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> Vocabulary:
    # Built once per test session (~2 s) into the session's base temp dir, shared by modules.
    cache = tmp_path_factory.getbasetemp() / "qwen3-tokenizer"
    return load_qwen3_vocabulary(QwenTokenizerConfig(cache))


def counter() -> Callable[[], str]:
    numbers = itertools.count()
    return lambda: f"call_{next(numbers):024x}"


def parse(text: str, config: ParserConfig | None = None) -> ParsedReply:
    return BuiltinReplyParser(config, TOOLS, counter()).parse_text(text)


def test_reasoning_text_and_parallel_calls() -> None:
    text = (
        "<think>\nFirst list files.\n</think>\n\nLooking.\n"
        '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "read", "arguments": {"path": "ä.py"}}\n</tool_call>'
    )
    reply = parse(text)
    assert reply.malformed_tool_calls == 0
    assert reply.message == Message(
        "assistant",
        (
            Reasoning("First list files."),
            Text("Looking."),
            ToolCall("call_" + "0" * 24, "bash", '{"command": "ls"}'),
            ToolCall("call_" + "0" * 23 + "1", "read", '{"path": "ä.py"}'),
        ),
    )


def test_call_ids_look_like_openai_ids() -> None:
    assert re.fullmatch(r"call_[0-9a-f]{24}", new_call_id())
    assert new_call_id() != new_call_id()


@pytest.mark.parametrize(
    "body",
    [
        "{not json}",
        '{"arguments": {}}',  # no name
        '{"name": "x", "arguments": [1]}',  # arguments not an object
        '["name"]',
    ],
)
def test_malformed_call_is_kept_as_text_and_counted(body: str) -> None:
    text = f"Before.\n<tool_call>\n{body}\n</tool_call>\nAfter."
    reply = parse(text)
    assert reply.malformed_tool_calls == 1
    assert reply.message.tool_calls == ()
    assert reply.message.plain_text == text  # every character, as the model wrote it


def test_double_encoded_arguments_are_accepted() -> None:
    reply = parse('<tool_call>{"name": "x", "arguments": "{\\"a\\": 1}"}</tool_call>')
    assert reply.message.tool_calls[0].arguments == '{"a": 1}'


def test_truncated_call_and_reasoning() -> None:
    cut = parse('Trying.\n<tool_call>\n{"name": "bash", "argu')
    assert cut.malformed_tool_calls == 1
    assert cut.message.plain_text == 'Trying.\n<tool_call>\n{"name": "bash", "argu'
    thinking = parse("<think>\nstill thinking about <tool")
    assert thinking.message == Message("assistant", (Reasoning("still thinking about <tool"),))


def test_markers_that_are_not_markers_stay_text() -> None:
    assert parse("a <b> </think> <tool_ c").message.plain_text == "a <b> </think> <tool_ c"
    late = parse("Answer first. <think>not reasoning</think>")
    assert late.message.reasoning == ()
    no_reasoning = parse("<think>x</think>", ParserConfig(reasoning=False))
    assert no_reasoning.message.plain_text == "<think>x</think>"


def test_starts_in_reasoning() -> None:
    reply = parse("plan\n</think>\n\ndo it", ParserConfig(starts_in_reasoning=True))
    assert reply.message.content == (Reasoning("plan"), Text("do it"))


def test_qwen3_coder_xml_with_schema_types() -> None:
    text = (
        "Editing.\n<tool_call>\n<function=edit>\n<parameter=path>\nsrc/a.py\n</parameter>\n"
        "<parameter=line>\n42\n</parameter>\n<parameter=dry>\nfalse\n</parameter>\n"
        "<parameter=note>\n7\n</parameter>\n</function>\n</tool_call>"
    )
    reply = parse(text, XML)
    assert reply.malformed_tool_calls == 0
    (call,) = reply.message.tool_calls
    assert call.name == "edit"
    assert json.loads(call.arguments) == {"path": "src/a.py", "line": 42, "dry": False, "note": "7"}


@pytest.mark.parametrize(
    "body",
    [
        "<function=edit>\n<parameter=path>\nx\n</parameter>\n",  # no </function>
        "<function=edit>\nstray text\n</function>",
        "<function=edit><parameter=a>1</parameter><parameter=a>2</parameter></function>",
        '{"name": "edit", "arguments": {}}',  # JSON where XML is configured
    ],
)
def test_malformed_xml_is_kept(body: str) -> None:
    reply = parse(f"<tool_call>\n{body}\n</tool_call>", XML)
    assert reply.malformed_tool_calls == 1
    assert reply.message.plain_text == f"<tool_call>\n{body}\n</tool_call>"


def test_stream_releases_text_before_the_reply_ends() -> None:
    stream = BuiltinReplyParser(call_id=counter()).stream()
    assert stream.feed("<think>\nok") == [ReasoningDelta("ok")]
    assert stream.feed("\n</thi") == []  # held: could still be the closing marker
    assert stream.feed("nk>\n\nHi there <to") == [TextDelta("Hi there ")]
    events = stream.feed('ol_call>{"name": "f", "arguments": {}}</tool_call> bye')
    assert events == [
        ToolCallDone(ToolCall("call_" + "0" * 24, "f", "{}")),
        TextDelta(" bye"),
    ]
    assert stream.finish() == []
    with pytest.raises(RuntimeError):
        stream.feed("more")


OUTPUT_PIECES = st.sampled_from(
    [
        "plain words ",
        "\n",
        "\n\n",
        "<think>\n",
        "</think>\n\n",
        "<tool_call>\n",
        "</tool_call>",
        '{"name": "bash", "arguments": {"command": "ls <x>"}}',
        "{broken",
        "ünï 🦜",
        "<",
        "<tool",
        "</",
    ]
)


@settings(max_examples=400, deadline=None)
@given(
    pieces=st.lists(OUTPUT_PIECES, max_size=14),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12),
    xml=st.booleans(),
)
def test_chunking_never_changes_the_result(pieces: list[str], cuts: list[int], xml: bool) -> None:
    text = "".join(pieces)
    config = XML if xml else ParserConfig()
    whole = BuiltinReplyParser(config, TOOLS, counter()).parse_text(text)
    stream = BuiltinReplyParser(config, TOOLS, counter()).stream()
    events = []
    previous = 0
    for cut in sorted({min(c, len(text)) for c in cuts}):
        events += stream.feed(text[previous:cut])
        previous = cut
    events += stream.feed(text[previous:])
    events += stream.finish()
    assert stream.reply() == whole
    # Nothing is lost: every non-layout character of the output reaches the client.
    shown = "".join(
        e.text if isinstance(e, (TextDelta, ReasoningDelta)) else e.call.name for e in events
    )
    for kept in ("plain words", "ünï 🦜", "{broken"):
        assert text.count(kept) <= shown.count(kept) + text.count("<tool_call>\n" + kept)


def test_parse_real_qwen_ids(qwen: Vocabulary) -> None:
    output = (
        "<think>\nCheck the tests.\n</think>\n\nRunning them.\n<tool_call>\n"
        '{"name": "bash", "arguments": {"command": "pytest -q"}}\n</tool_call><|im_end|>'
    )
    ids = qwen.encode(output)
    assert 151657 in ids
    assert 151667 in ids
    assert ids[-1] == 151645
    reply = BuiltinReplyParser(call_id=counter()).parse_ids(ids, qwen)
    assert reply.message.content == (
        Reasoning("Check the tests."),
        Text("Running them."),
        ToolCall("call_" + "0" * 24, "bash", '{"command": "pytest -q"}'),
    )


@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=60), max_size=10))
def test_incremental_decoding_equals_whole_decoding(qwen: Vocabulary, cuts: list[int]) -> None:
    text = "Ünïcödé 🦜🧑‍💻 日本語 <tool_call>\n{}\n</tool_call>"
    ids = [*qwen.encode(text), qwen.token_id("<|im_end|>")]
    decoder = IncrementalDecoder(qwen)
    stream = BuiltinReplyParser(call_id=counter()).stream()
    pieces: list[str] = []
    previous = 0
    for cut in [*sorted({min(c, len(ids)) for c in cuts}), len(ids)]:
        delta = decoder.feed(ids[previous:cut])
        assert "\ufffd" not in delta  # never a split character
        pieces.append(delta)
        stream.feed(delta)
        previous = cut
    pieces.append(decoder.finish())
    assert "".join(pieces) == text
    stream.finish()
    assert stream.reply() == BuiltinReplyParser(call_id=counter()).parse_ids(ids, qwen)


def test_backend_selection() -> None:
    assert sglang_available() is False  # not installed on this machine: the builtin path is live
    auto = ParserConfig(backend=ParserBackend.AUTO)
    assert resolve_backend(auto, sglang_installed=False) is ParserBackend.BUILTIN
    assert resolve_backend(auto, sglang_installed=True) is ParserBackend.SGLANG
    assert resolve_backend(ParserConfig(), sglang_installed=True) is ParserBackend.BUILTIN
    sglang = ParserConfig(backend=ParserBackend.SGLANG)
    assert resolve_backend(sglang, sglang_installed=True) is ParserBackend.SGLANG
    with pytest.raises(SGLangUnavailable, match="not installed"):
        resolve_backend(sglang, sglang_installed=False)
    with pytest.raises(SGLangUnavailable):
        make_reply_parser(sglang)
    assert isinstance(make_reply_parser(auto), BuiltinReplyParser)


def test_the_server_asks_whether_sglang_is_installed_once_not_per_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The question searches every ``sys.path`` entry on disk: the factory the server calls for
    each request's tools asks it once, when it is made; a backend that cannot be had is refused
    then, not at the first request."""
    asked: list[bool] = []

    def counted() -> bool:
        asked.append(True)
        return False

    monkeypatch.setattr(select, "sglang_available", counted)
    make = reply_parsers(ParserConfig(backend=ParserBackend.AUTO))
    parsers = [make(()) for _ in range(3)]
    assert all(isinstance(p, BuiltinReplyParser) for p in parsers)
    assert len(asked) == 1
    with pytest.raises(SGLangUnavailable, match="not installed"):
        reply_parsers(ParserConfig(backend=ParserBackend.SGLANG))
