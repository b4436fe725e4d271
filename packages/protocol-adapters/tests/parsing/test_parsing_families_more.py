"""Tool-call parsing for MiniMax-M1, OLMo 3, Phi-4-mini and Gemma 4, as ``test_parsing_families``
tests the others: well-formed calls, malformed ones kept as text and counted, a stream cut
anywhere giving the same reply; and, for each, calls written the way the family's published chat
template writes them (vLLM's ``examples/tool_chat_template_*.jinja``) read back exactly."""

from __future__ import annotations

import json
import os
import sys
import types
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from parsing_kit import TOOLS, call, ids, parse, streamed

from protocol_adapters._parsing import BuiltinReplyParser, ParserConfig, ToolCallFormat
from protocol_adapters._parsing.config import SGLANG_TOOL_PARSERS
from protocol_adapters._parsing.syntax import SYNTAX
from protocol_adapters._parsing.tool_markup import parse_olmo3
from trajectory_tree import Message, Reasoning, Text

MINIMAX = ToolCallFormat.MINIMAX_M1
OLMO3 = ToolCallFormat.OLMO3
PHI4 = ToolCallFormat.PHI4_MINI
GEMMA4 = ToolCallFormat.GEMMA4
Q = '<|"|>'  # Gemma 4's string delimiter

WELL_FORMED = [
    (
        MINIMAX,
        "<think>\nPlan.\n</think>\n\nLooking.\n<tool_calls>\n"
        '{"name": "edit", "arguments": {"path": "a.py", "line": 5}}\n'
        '{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_calls>',
        (
            Reasoning("Plan."),
            Text("Looking."),
            call(0, "edit", {"path": "a.py", "line": 5}),
            call(1, "bash", {"command": "ls -la"}),
        ),
    ),
    (
        MINIMAX,  # arguments the template got as a JSON string come out encoded twice
        '<tool_calls>\n{"name": "edit", "arguments": "{\\"path\\": \\"a b\\"}"}\n</tool_calls>'
        "\nDone.",
        (call(0, "edit", {"path": "a b"}), Text("Done.")),
    ),
    (
        OLMO3,
        "Let me look.\n<function_calls>\nedit(path='a.py', line=5, create=false, mode=null)\n"
        'bash(command=\'ls -la\', env={"A": 1, "B": [true, null]}, args=["-l", 2.5], n=-3)\n'
        "</function_calls>",
        (
            Text("Let me look."),
            call(0, "edit", {"path": "a.py", "line": 5, "create": False, "mode": None}),
            call(
                1,
                "bash",
                {
                    "command": "ls -la",
                    "env": {"A": 1, "B": [True, None]},
                    "args": ["-l", 2.5],
                    "n": -3,
                },
            ),
        ),
    ),
    (
        OLMO3,  # quotes and backslashes inside a string: written as they are, read as they are
        "<function_calls>\nbash(command='echo 'hi' > C:\\new\\file', note='it\\'s', "
        'quoted="a\\"b")\n</function_calls>\nDone.',
        (
            call(
                0,
                "bash",
                {"command": "echo 'hi' > C:\\new\\file", "note": "it\\'s", "quoted": 'a"b'},
            ),
            Text("Done."),
        ),
    ),
    (
        OLMO3,  # a string over several lines, one ending in ')': the reading that fits the block
        "<function_calls>\nwrite(path='a.py', content='print('hi')\nrun(1)\n')\nls()\n"
        "</function_calls>",
        (
            call(0, "write", {"path": "a.py", "content": "print('hi')\nrun(1)\n"}),
            call(1, "ls", {}),
        ),
    ),
    (
        OLMO3,  # commas and parentheses inside strings
        "<function_calls>\nbash(command='f(a, b)', note='x), y')\n</function_calls>",
        (call(0, "bash", {"command": "f(a, b)", "note": "x), y"}),),
    ),
    (
        PHI4,
        'Two at once. functools[{"name": "edit", "arguments": {"path": "a.py", "line": 5}}, '
        '{"name": "bash", "arguments": {"command": "ls"}}]',
        (
            Text("Two at once. "),
            call(0, "edit", {"path": "a.py", "line": 5}),
            call(1, "bash", {"command": "ls"}),
        ),
    ),
    (
        PHI4,
        'functools[{"name": "edit", "parameters": {"path": "a.py"}}]\n',
        (call(0, "edit", {"path": "a.py"}),),
    ),
    (
        GEMMA4,
        f"Opening it.<|tool_call>call:edit{{path:{Q}a.py{Q},line:5}}<tool_call|>"
        f"<|tool_call>call:bash{{command:{Q}ls -la{Q},dry:true}}<tool_call|>",
        (
            Text("Opening it."),
            call(0, "edit", {"path": "a.py", "line": 5}),
            call(1, "bash", {"command": "ls -la", "dry": True}),
        ),
    ),
    (
        GEMMA4,  # nested objects and lists, numbers, booleans, a string with , } : in it
        f"<|tool_call>call:configure{{opts:{{depth:2,ratio:-0.5,big:1e+16,on:false,"
        f"tags:[{Q}a{Q},1,true,{{k:{Q}v{Q}}},[]]}},text:{Q}x, y}} z: w{Q},none:None,empty:{{}}}}"
        "<tool_call|>\nDone.",
        (
            call(
                0,
                "configure",
                {
                    "opts": {
                        "depth": 2,
                        "ratio": -0.5,
                        "big": 1e16,
                        "on": False,
                        "tags": ["a", 1, True, {"k": "v"}, []],
                    },
                    "text": "x, y} z: w",
                    "none": None,
                    "empty": {},
                },
            ),
            Text("Done."),
        ),
    ),
    (
        GEMMA4,  # the thought channel is no reasoning here (only <think> is): it stays text
        "<|channel>thought\nList first.\n<channel|>Listing.<|tool_call>call:ls{}<tool_call|>",
        (Text("<|channel>thought\nList first.\n<channel|>Listing."), call(0, "ls", {})),
    ),
]


@pytest.mark.parametrize(("tool_format", "text", "blocks"), WELL_FORMED)
def test_well_formed_calls(tool_format: ToolCallFormat, text: str, blocks: tuple[object]) -> None:
    reply = parse(text, tool_format)
    assert reply.malformed_tool_calls == 0
    assert reply.message == Message("assistant", blocks)  # type: ignore[arg-type]


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_a_stream_cut_anywhere_gives_the_same_reply(data: st.DataObject) -> None:
    tool_format, text, _ = data.draw(st.sampled_from(WELL_FORMED + MALFORMED_REPLIES))
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=8))
    assert streamed(text, tool_format, cuts) == parse(text, tool_format)


MALFORMED = [
    (MINIMAX, '<tool_calls>\n{"name": "edit", "arguments": {"path": }}\n</tool_calls>'),
    (MINIMAX, '<tool_calls>\n{"tool": "edit", "input": {}}\n</tool_calls>'),
    (MINIMAX, '<tool_calls>\n{"name": "ls", "arguments": {}}\nthen this\n</tool_calls>'),
    (MINIMAX, '<tool_calls>\n{"name": "ls", "arguments": [1]}\n</tool_calls>'),
    (MINIMAX, "<tool_calls>\n</tool_calls>"),
    (MINIMAX, '<tool_calls>\n{"name": "edit", "arguments": {}}\n'),  # cut off
    (OLMO3, "<function_calls>\n__import__('os').system('x')\n</function_calls>"),
    (OLMO3, "<function_calls>\nedit('a.py')\n</function_calls>"),  # positional
    (OLMO3, "<function_calls>\nedit(path=os.sep)\n</function_calls>"),  # a name, not a value
    (OLMO3, "<function_calls>\nedit(path=open('x').read())\n</function_calls>"),
    (OLMO3, "<function_calls>\nedit(path='a.py)\n</function_calls>"),  # unterminated string
    (OLMO3, "<function_calls>\nedit(line={\"a\": }, path='x')\n</function_calls>"),  # bad JSON
    (OLMO3, "<function_calls>\nedit(line=1, line=2)\n</function_calls>"),
    (OLMO3, "<function_calls>\nedit(line=NaN)\n</function_calls>"),
    (OLMO3, "<function_calls>\nedit(line=1e999)\n</function_calls>"),
    (OLMO3, "<function_calls>\nls() ls()\n</function_calls>"),
    (OLMO3, "<function_calls>\nls()\nnot a call\n</function_calls>"),
    (OLMO3, "<function_calls>\n</function_calls>"),
    (OLMO3, "<function_calls>\nedit(path='a.py', line=5)\n"),  # cut off
    (PHI4, 'functools[{"name": "edit", "arguments": {]'),
    (PHI4, 'functools[{"tool": "edit"}]'),
    (PHI4, 'functools[{"name": "ls", "arguments": {}}] and then some text'),
    (PHI4, "functools[]"),
    (PHI4, 'functools[{"name": "edit", "arguments": {"path": "a'),  # cut off
    (GEMMA4, "<|tool_call>call:edit{path:a.py}<tool_call|>"),  # a bare string
    (GEMMA4, "<|tool_call>edit{}<tool_call|>"),  # no call:
    (GEMMA4, f"<|tool_call>call:edit{{path:{Q}a.py}}<tool_call|>"),  # unterminated string
    (GEMMA4, "<|tool_call>call:edit{a:{b:1}<tool_call|>"),  # unbalanced
    (GEMMA4, "<|tool_call>call:edit{a:1,,b:2}<tool_call|>"),
    (GEMMA4, "<|tool_call>call:edit{a:1,a:2}<tool_call|>"),
    (GEMMA4, "<|tool_call>call:edit{a:1}extra<tool_call|>"),
    (GEMMA4, "<|tool_call>call:edit{a:inf}<tool_call|>"),
    (GEMMA4, "<|tool_call>call:edit{a:" + "[" * 40 + "]" * 40 + "}<tool_call|>"),  # too deep
    (GEMMA4, f"<|tool_call>call:edit{{path:{Q}a.py{Q}}}"),  # cut off
]
MALFORMED_REPLIES = [(f, "Before.\n" + text, None) for f, text in MALFORMED]


@pytest.mark.parametrize(("tool_format", "text"), MALFORMED)
def test_malformed_calls_are_kept_as_text_and_counted(
    tool_format: ToolCallFormat, text: str
) -> None:
    reply = parse(text, tool_format)
    assert reply.malformed_tool_calls == 1
    assert reply.message.tool_calls == ()
    assert reply.message.plain_text == text  # every character, markers included
    after_text = parse("Before.\n" + text, tool_format)
    assert after_text.malformed_tool_calls == 1
    assert after_text.message.plain_text == "Before.\n" + text


def test_a_well_formed_call_after_a_malformed_one_is_still_read() -> None:
    text = "<function_calls>\nls(\n</function_calls><function_calls>\nls()\n</function_calls>"
    reply = parse(text, OLMO3)
    assert reply.malformed_tool_calls == 1
    assert reply.message.content == (
        Text("<function_calls>\nls(\n</function_calls>"),
        call(0, "ls", {}),
    )


def test_olmo3_calls_are_read_never_evaluated(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[str] = []

    def system(command: str) -> int:
        ran.append(command)
        return 0

    monkeypatch.setattr(os, "system", system)
    for body in (
        "__import__('os').system('touch pwned')",
        "edit(path=__import__('os').system('touch pwned'))",
        "edit(path=open('/etc/passwd').read())",
        "edit(path=(lambda: os.system('x'))())",
        "os.system('touch pwned')",
        "edit(path=exec('1'))",
    ):
        assert parse_olmo3(body, ids()) is None, body
    assert ran == []


def test_phi4_word_functools_in_plain_text_is_text() -> None:
    """Only ``functools[`` opens a call: Python talk about functools is text, not counted."""
    text = "Use functools.partial, or functools.lru_cache (see functools docs)."
    reply = parse(text, PHI4)
    assert (reply.malformed_tool_calls, reply.message.plain_text) == (0, text)


def test_only_the_configured_family_is_read() -> None:
    hermes = '<tool_call>\n{"name": "edit", "arguments": {}}\n</tool_call>'
    for tool_format in (MINIMAX, OLMO3, PHI4, GEMMA4):
        reply = parse(hermes, tool_format)
        assert (reply.malformed_tool_calls, reply.message.plain_text) == (0, hermes)


# -- calls as each family's chat template writes them, read back --------------------------------

TEXT = "ab '\"\\{}[]:=\n\t é"
"""Characters for string values: quotes, backslashes, brackets and newlines included, but not ``<``
(no marker can appear inside) nor ``,`` and ``)`` (with them an unescaped OLMo 3 string can be
read two ways: the one ambiguity of that format)."""

names = st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True)
leaves = (
    st.none()
    | st.booleans()
    | st.integers(-(10**20), 10**20)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(TEXT, max_size=12)
)
values = st.recursive(
    leaves,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(names, inner, max_size=3),
    max_leaves=8,
)
calls = st.lists(
    st.tuples(names, st.dictionaries(names, values, max_size=4)), min_size=1, max_size=3
)


def minimax_m1_template(found: list[tuple[str, dict[str, Any]]]) -> str:
    lines = "".join(
        f'{{"name": "{name}", "arguments": {json.dumps(arguments, ensure_ascii=False)}}}\n'
        for name, arguments in found
    )
    return f"<tool_calls>\n{lines}</tool_calls>"


def olmo3_template(found: list[tuple[str, dict[str, Any]]]) -> str:
    def value(v: Any) -> str:
        if isinstance(v, str):
            return f"'{v}'"  # unescaped, as the template writes it
        if v is None or isinstance(v, bool):
            return json.dumps(v)
        return json.dumps(v, ensure_ascii=False)

    lines = [
        name + "(" + ", ".join(f"{k}={value(v)}" for k, v in arguments.items()) + ")"
        for name, arguments in found
    ]
    return "<function_calls>\n" + "\n".join(lines) + "\n</function_calls>"


def phi4_mini_template(found: list[tuple[str, dict[str, Any]]]) -> str:
    items = [{"name": name, "arguments": arguments} for name, arguments in found]
    return "functools" + json.dumps(items, ensure_ascii=False)


def gemma4_template(found: list[tuple[str, dict[str, Any]]]) -> str:
    def value(v: Any) -> str:
        if isinstance(v, str):
            return Q + v + Q
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, dict):
            return "{" + ",".join(f"{k}:{value(v[k])}" for k in sorted(v)) + "}"
        if isinstance(v, list):
            return "[" + ",".join(value(item) for item in v) + "]"
        return str(v)  # numbers, and None as Jinja prints it

    return "".join(
        f"<|tool_call>call:{name}{value(arguments)}<tool_call|>" for name, arguments in found
    )


TEMPLATES: dict[ToolCallFormat, Callable[[list[tuple[str, dict[str, Any]]]], str]] = {
    MINIMAX: minimax_m1_template,
    OLMO3: olmo3_template,
    PHI4: phi4_mini_template,
    GEMMA4: gemma4_template,
}


@settings(max_examples=150, deadline=None)
@given(
    tool_format=st.sampled_from(sorted(TEMPLATES)),
    found=calls,
    before=st.sampled_from(["", "Calling.\n", "Calling. "]),
    cuts=st.lists(st.integers(0, 10_000), max_size=6),
)
def test_calls_as_the_template_writes_them_are_read_back(
    tool_format: ToolCallFormat,
    found: list[tuple[str, dict[str, Any]]],
    before: str,
    cuts: list[int],
) -> None:
    text = before + TEMPLATES[tool_format](found)
    reply = parse(text, tool_format)
    assert reply.malformed_tool_calls == 0, text
    read = [(c.name, json.loads(c.arguments)) for c in reply.message.tool_calls]
    assert read == found, text
    assert reply.message.plain_text.strip() == before.strip()
    assert streamed(text, tool_format, [c % (len(text) + 1) for c in cuts]) == reply


# -- configuration --------------------------------------------------------------------------------


def test_every_new_family_has_markers_and_an_sglang_name_where_sglang_has_one() -> None:
    assert {MINIMAX, OLMO3, PHI4, GEMMA4} <= set(SYNTAX)
    assert ParserConfig(tool_format=GEMMA4).sglang_tool_parser_name == "gemma4"
    for tool_format in (MINIMAX, OLMO3, PHI4):
        assert tool_format not in SGLANG_TOOL_PARSERS
        assert ParserConfig(tool_format=tool_format).sglang_tool_parser_name is None
    override = ParserConfig(tool_format=OLMO3, sglang_tool_parser="pythonic")
    assert override.sglang_tool_parser_name == "pythonic"


def test_the_sglang_backend_leaves_calls_it_has_no_parser_for_to_ours(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With SGLang selected, an OLMo 3 reply with calls is the built-in parser's (SGLang is faked
    here: its function-call parser must not even be built)."""
    from protocol_adapters._parsing.sglang_backend import SGLangReplyParser

    class ReasoningParser:
        def __init__(self, model_type: str, stream_reasoning: bool) -> None:
            pass

        def parse_non_stream(self, text: str) -> tuple[str, str]:
            return "", text

    class FunctionCallParser:
        def __init__(self, **kwargs: object) -> None:
            raise AssertionError("SGLang has no OLMo 3 parser")

    class Named:
        def __init__(self, **kwargs: object) -> None:
            self.__dict__.update(kwargs)

    fakes: dict[str, dict[str, object]] = {
        "sglang.srt.parser.reasoning_parser": {"ReasoningParser": ReasoningParser},
        "sglang.srt.function_call.function_call_parser": {"FunctionCallParser": FunctionCallParser},
        "sglang.srt.entrypoints.openai.protocol": {"Tool": Named, "Function": Named},
    }
    for name, attributes in fakes.items():
        module = types.ModuleType(name)
        module.__dict__.update(attributes)
        monkeypatch.setitem(sys.modules, name, module)
    config = ParserConfig(tool_format=OLMO3)
    text = "Looking.\n<function_calls>\nedit(path='a.py')\n</function_calls>"
    sglang = SGLangReplyParser(config, TOOLS, ids()).parse_text(text)
    assert sglang == BuiltinReplyParser(config, TOOLS, ids()).parse_text(text)
    assert sglang.message.tool_calls == (call(0, "edit", {"path": "a.py"}),)
    plain = SGLangReplyParser(config, TOOLS, ids()).parse_text("No calls.")
    assert (plain.message.plain_text, plain.malformed_tool_calls) == ("No calls.", 0)
