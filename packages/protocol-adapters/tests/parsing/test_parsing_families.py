"""Tool-call parsing for every family the adapter claims: GLM-4.5, Llama JSON, Mistral and
DeepSeek (Hermes/Qwen3 JSON and Qwen3-Coder XML: ``test_parsing_replies.py``; MiniMax-M1, OLMo 3,
Phi-4-mini and Gemma 4: ``test_parsing_families_more.py``). Each keeps a
malformed call as text and counts it, and a stream cut anywhere gives the same reply."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from parsing_kit import call, parse, streamed

from protocol_adapters._parsing import ParserConfig, ToolCallFormat
from protocol_adapters._parsing.config import SGLANG_TOOL_PARSERS
from trajectory_tree import Message, Reasoning, Text

B, S = "\uff5c", "\u2581"  # DeepSeek's full-width bar and its space
DS_CALLS = f"<{B}tool{S}calls{S}begin{B}>"
DS_CALLS_END = f"<{B}tool{S}calls{S}end{B}>"
DS_CALL = f"<{B}tool{S}call{S}begin{B}>"
DS_CALL_END = f"<{B}tool{S}call{S}end{B}>"
DS_SEP = f"<{B}tool{S}sep{B}>"


GLM = ToolCallFormat.GLM45
LLAMA = ToolCallFormat.LLAMA_JSON
MISTRAL = ToolCallFormat.MISTRAL
DEEPSEEK = ToolCallFormat.DEEPSEEK

WELL_FORMED = [
    (
        GLM,
        "<think>\nRead first.\n</think>\n\nOpening it.\n<tool_call>edit\n<arg_key>path</arg_key>\n"
        "<arg_value>a.py</arg_value>\n<arg_key>line</arg_key>\n<arg_value>5</arg_value>\n"
        "</tool_call><tool_call>bash\n<arg_key>command</arg_key>\n<arg_value>ls -la</arg_value>\n"
        '<arg_key>env</arg_key>\n<arg_value>{"A": 1}</arg_value>\n</tool_call>',
        (
            Reasoning("Read first."),
            Text("Opening it."),
            call(0, "edit", {"path": "a.py", "line": 5}),
            call(1, "bash", {"command": "ls -la", "env": {"A": 1}}),
        ),
    ),
    (
        LLAMA,
        '{"name": "edit", "parameters": {"path": "a.py", "line": 5}}',
        (call(0, "edit", {"path": "a.py", "line": 5}),),
    ),
    (
        LLAMA,
        '<|python_tag|>{"name": "edit", "parameters": {"path": "a;b"}}; '
        '{"name": "bash", "arguments": {"command": "ls"}}',
        (call(0, "edit", {"path": "a;b"}), call(1, "bash", {"command": "ls"})),
    ),
    (
        MISTRAL,
        'Two at once.[TOOL_CALLS] [{"name": "edit", "arguments": {"path": "a.py"}}, '
        '{"name": "bash", "arguments": {"command": "ls"}}]',
        (
            Text("Two at once."),
            call(0, "edit", {"path": "a.py"}),
            call(1, "bash", {"command": "ls"}),
        ),
    ),
    (
        MISTRAL,
        '[TOOL_CALLS]edit[ARGS]{"path": "a.py"}[TOOL_CALLS]bash[ARGS]{"command": "ls"}',
        (call(0, "edit", {"path": "a.py"}), call(1, "bash", {"command": "ls"})),
    ),
    (
        DEEPSEEK,
        f"Checking.{DS_CALLS}{DS_CALL}edit{DS_SEP}"
        '{"path": "a.py"}'
        f"{DS_CALL_END}{DS_CALL}bash{DS_SEP}"
        '{"command": "ls"}'
        f"{DS_CALL_END}{DS_CALLS_END}",
        (Text("Checking."), call(0, "edit", {"path": "a.py"}), call(1, "bash", {"command": "ls"})),
    ),
    (
        DEEPSEEK,  # V3 / R1: a type before the separator, arguments in a json code block
        f'{DS_CALLS}{DS_CALL}function{DS_SEP}edit\n```json\n{{"path": "a.py"}}\n```'
        f"{DS_CALL_END}{DS_CALLS_END}",
        (call(0, "edit", {"path": "a.py"}),),
    ),
]


@pytest.mark.parametrize(("tool_format", "text", "blocks"), WELL_FORMED)
def test_well_formed_calls(tool_format: ToolCallFormat, text: str, blocks: tuple[object]) -> None:
    reply = parse(text, tool_format)
    assert reply.malformed_tool_calls == 0
    assert reply.message == Message("assistant", blocks)  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_a_stream_cut_anywhere_gives_the_same_reply(data: st.DataObject) -> None:
    tool_format, text, _ = data.draw(st.sampled_from(WELL_FORMED))
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=8))
    assert streamed(text, tool_format, cuts) == parse(text, tool_format)


MALFORMED = [
    (GLM, "<tool_call>edit\n<arg_key>path</arg_key>\n<arg_value>a.py</tool_call>"),
    (GLM, "<tool_call>edit\nstray text<arg_key>path</arg_key><arg_value>a</arg_value></tool_call>"),
    (LLAMA, '{"name": "edit", "parameters": {"path": "a.py"'),
    (LLAMA, '<|python_tag|>{"name": "edit", "parameters": [1]}'),
    (MISTRAL, '[TOOL_CALLS] [{"name": "edit", "arguments": {"path": "a.py"}'),
    (MISTRAL, "[TOOL_CALLS]edit{}"),
    (DEEPSEEK, f"{DS_CALLS}{DS_CALL}edit{DS_SEP}{{not json}}{DS_CALL_END}{DS_CALLS_END}"),
    (DEEPSEEK, f"{DS_CALLS}{DS_CALL}edit{DS_SEP}{{}}{DS_CALL_END}"),  # cut off: no section end
]


@pytest.mark.parametrize(("tool_format", "text"), MALFORMED)
def test_malformed_calls_are_kept_as_text_and_counted(
    tool_format: ToolCallFormat, text: str
) -> None:
    reply = parse(text, tool_format)
    assert reply.malformed_tool_calls == 1
    assert reply.message.tool_calls == ()
    assert reply.message.plain_text == text  # every character, markers included


def test_a_llama_reply_that_is_json_but_no_call_is_plain_text() -> None:
    """Llama calls have no markers: a JSON answer (a session title, say) is text, not a failed
    call, and is not counted."""
    for text in ('{"title": "Fix the parser"}', "{not json at all", "Plain answer {with braces}"):
        reply = parse(text, LLAMA)
        assert reply.malformed_tool_calls == 0
        assert reply.message.plain_text == text


def test_only_the_configured_family_is_read() -> None:
    """Another family's markup is text: a Hermes call is not a Mistral call."""
    text = '<tool_call>\n{"name": "edit", "arguments": {}}\n</tool_call>'
    reply = parse(text, MISTRAL)
    assert (reply.malformed_tool_calls, reply.message.plain_text) == (0, text)


def test_every_family_names_an_sglang_parser_where_sglang_has_one() -> None:
    no_sglang_parser = {
        ToolCallFormat.MINIMAX_M1,
        ToolCallFormat.OLMO3,
        ToolCallFormat.PHI4_MINI,
    }  # SGLang's backend leaves their calls to ours (test_parsing_families_more.py)
    assert set(SGLANG_TOOL_PARSERS) == set(ToolCallFormat) - no_sglang_parser
    assert ParserConfig(tool_format=DEEPSEEK).sglang_tool_parser_name == "deepseekv31"
    override = ParserConfig(tool_format=DEEPSEEK, sglang_tool_parser="deepseekv3")
    assert override.sglang_tool_parser_name == "deepseekv3"
