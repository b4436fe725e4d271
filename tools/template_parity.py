"""Raw-request parity per published chat template: does the adapter send what vLLM/SGLang would?

    uv run tools/template_parity.py TEMPLATES_DIR [--tokenizer PATH] [-v]

Run by hand, never in CI. ``TEMPLATES_DIR`` holds chat templates (``*.jinja``), e.g. vLLM's
``examples/tool_chat_template_*.jinja``: third-party files, kept outside this repository
(``packages/protocol-adapters/docs/chat-templates.md`` says how to fetch them, and what this
measured for them). ``--tokenizer`` is where the offline Qwen3 tokenizer is built once (or a
``tokenizer.json`` to use instead).

Why: the policy must be trained on the prompt it sees when SGLang or vLLM serves it behind the
same agent CLIs. vLLM's chat endpoint renders the client's raw request with transformers'
``apply_chat_template``: assistant tool-call arguments JSON-decoded into a mapping (key order
kept; SGLang's too), null content as "", everything else as sent (tool schemas in the client's
key order, a tool result with the name the client gave it or none), here with bos/eos
``<s>``/``</s>``. That render is the reference. (SGLang's passes its request models' dumps
instead: ``None`` for every field a message lacks, each tool's function with ``description``
first and ``strict: false``; a template that prints tools as JSON or tests ``is defined``
renders differently there.) The tests prove the bridge exact for templates written there with
one published trait each; this measures the published templates themselves.

How: each template is audited as ``protocol-adapters check-template`` audits it and served in the
mode its verdict needs (bridge-exact: ``exact``; bridge-with-deviation: ``accept-deviations``;
full-render-only: ``full-render``; unusable: listed with its fatal findings). Four conversations
go through the real adapter server over Chat Completions with the official ``openai`` SDK to the
SGLang-wire engine double: an agent (tools whose schema keys are not in alphabetical order, call
arguments that are not either, text beside a call, calls alone, several tool results, a user
follow-up), the same agent reasoning, tool results that name their function (Hermes refuses them
without), and a chat without tools. The "model" writes what a model trained on the template
writes: the template's own rendering of the planned reply after the prompt, up to the family's
end token (reasoning the template does not render comes first as a ``<think>`` block; calls whose
history form the family's parser cannot read are written as the template's tool prompt asks). The
Qwen3 vocabulary gets the family's markers as special tokens, as the family's tokenizer has them,
and the server reads calls in the family's format.

Every engine request's ``input_ids`` are compared with the reference. Each differing region is
located in the turn's own spans (the session tree) and counts as explained only by what the turn
recorded in ``TurnMeta.extra`` (see :func:`regions`): an earlier reply kept verbatim where the
template renders it differently or leaves out its reasoning (``output_kept``), or the
generation-prompt deviation its mode accepted (``template_deviations``). Anything else is
unexplained: printed with the first differing token and the text around it, exit status 1. A
request transformers refuses has no reference: counted apart, with the template's words.

The renderer's sampled whole-prompt check is off by default (``--check-rate 0``): a failed check
renders its turn in full, which would hide a bridge error from this comparison. The reference
sees the instant a date-printing template was frozen at (the turn's ``template_clock``).
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import hashlib
import json
import logging
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, tzinfo
from pathlib import Path
from typing import Any

import openai
import transformers.utils.chat_template_utils as hf_templates
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from tokenizers import AddedToken, Tokenizer
from transformers import PreTrainedTokenizerFast

from protocol_adapters._audit import FindingKind, TemplateMode, Verdict, audit_source
from protocol_adapters._audit.verdict import GENERATION_PROMPT_DIFFERS
from protocol_adapters._bridge import Renderer, RendererConfig
from protocol_adapters._bridge.notes import (
    OUTPUT_KEPT,
    PROMPT_MISMATCH,
    REASONING_KEPT,
    TEMPLATE_CLOCK,
    TEMPLATE_DEVIATIONS,
    TEMPLATE_MODE,
)
from protocol_adapters._engine import SGLangConfig, SGLangEngine
from protocol_adapters._parsing import BuiltinReplyParser, ParserConfig, ToolCallFormat
from protocol_adapters._server.config import AdapterConfig
from protocol_adapters._server.ports import reply_parsers
from protocol_adapters._server.runner import AdapterServer
from protocol_adapters._template import ChatTemplate
from protocol_adapters._tokenizer import Vocabulary
from protocol_adapters._tokenizer.qwen import QwenTokenizerConfig, load_qwen3_vocabulary
from protocol_adapters.testing import EngineDouble, Qwen3ReplyEncoder, ScriptedReply
from protocol_adapters.testing.scripted import QWEN3_MARKERS
from protocol_adapters.testing.stack import VocabularyTokenizer
from trajectory_tree import LossReason, SessionTree, ToolSpec, Turn

SPECIAL = {"bos_token": "<s>", "eos_token": "</s>"}
MODE_FOR = {
    Verdict.BRIDGE_EXACT: TemplateMode.EXACT,
    Verdict.BRIDGE_WITH_DEVIATION: TemplateMode.ACCEPT_DEVIATIONS,
    Verdict.FULL_RENDER_ONLY: TemplateMode.FULL_RENDER,
}
BLANK = "\u2063"
"""Content of the assistant message whose render tells the header from the reply."""
SHOWN = 48
"""Characters of context printed on each side of an unexplained difference."""


# -- the families: how each model's tokenizer and parser see its template --------------------------


@dataclass(frozen=True, slots=True)
class Family:
    """What the template's model family brings besides the template: the tool-call format its
    parser reads, the tokens that end a reply, and the markers its tokenizer holds as single
    tokens (added to the Qwen3 vocabulary so that text splits where the family's does)."""

    tool_format: ToolCallFormat
    stops: tuple[str, ...]
    specials: tuple[str, ...] = ()


_B, _S = "\uff5c", "\u2581"  # DeepSeek's full-width bar and its "space"
_DEEPSEEK = tuple(
    f"<{_B}{name.replace(' ', _S)}{_B}>"
    for name in (
        "User",
        "Assistant",
        "end of sentence",
        "tool calls begin",
        "tool calls end",
        "tool call begin",
        "tool call end",
        "tool sep",
        "tool output begin",
        "tool output end",
    )
)
QWEN = Family(ToolCallFormat.HERMES_JSON, ("<|im_end|>",))
FAMILIES: dict[str, Family] = {
    "hermes": QWEN,
    "qwen3coder": Family(ToolCallFormat.QWEN3_CODER_XML, ("<|im_end|>",)),
    "llama3": Family(
        ToolCallFormat.LLAMA_JSON,
        ("<|eot_id|>", "<|eom_id|>"),
        ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"),
    ),
    "llama4": Family(
        ToolCallFormat.LLAMA_JSON,
        ("<|eot|>", "<|eom|>"),
        ("<|header_start|>", "<|header_end|>", "<|eot|>", "<|eom|>", "<|python_start|>"),
    ),
    "minimax": Family(
        ToolCallFormat.MINIMAX_M1,
        ("<end_of_sentence>",),
        ("<begin_of_document>", "<beginning_of_sentence>", "<end_of_sentence>"),
    ),
    "olmo3": Family(ToolCallFormat.OLMO3, ("<|im_end|>",)),
    "deepseek": Family(ToolCallFormat.DEEPSEEK, (_DEEPSEEK[2],), _DEEPSEEK),
    "mistral": Family(
        ToolCallFormat.MISTRAL,
        ("</s>",),
        (
            "<s>",
            "</s>",
            "[INST]",
            "[/INST]",
            "[SYSTEM_PROMPT]",
            "[/SYSTEM_PROMPT]",
            "[AVAILABLE_TOOLS]",
            "[/AVAILABLE_TOOLS]",
            "[TOOL_CALLS]",
            "[TOOL_RESULTS]",
            "[/TOOL_RESULTS]",
        ),
    ),
    "phi4": Family(
        ToolCallFormat.PHI4_MINI,
        ("<|end|>",),
        ("<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|end|>"),
    ),
    "gemma4": Family(
        ToolCallFormat.GEMMA4,
        ("<turn|>", "<|tool_response>"),
        (
            "<|turn>",
            "<turn|>",
            "<|tool>",
            "<tool|>",
            "<|tool_call>",
            "<tool_call|>",
            "<|tool_response>",
            "<tool_response|>",
            '<|"|>',
            "<|channel>",
            "<channel|>",
            "<|think|>",
        ),
    ),
}


def family_of(name: str) -> Family:
    """The family a template file's name starts with (vLLM's file names); Qwen's otherwise."""
    return next((f for prefix, f in FAMILIES.items() if name.startswith(prefix)), QWEN)


def write_phi4_calls(calls: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """Calls as Phi-4-mini's tool prompt asks for them (its history form lacks the marker)."""
    return "functools" + json.dumps([{"name": n, "arguments": a} for n, a in calls])


CALL_WRITERS: dict[ToolCallFormat, Callable[[Sequence[tuple[str, dict[str, Any]]]], str]] = {
    ToolCallFormat.PHI4_MINI: write_phi4_calls,
}
"""For formats whose template renders history calls in a form their parser does not read."""


# -- the conversations -----------------------------------------------------------------------------


def _tool(name: str, description: str, properties: dict[str, Any], required: list[str]) -> Any:
    schema = {"type": "object", "properties": properties, "required": required}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": schema},
    }


# Keys in an order no sorting keeps: "type" before "properties", "workdir" before "cmd", ...
TOOLS: list[Any] = [
    _tool(
        "exec_command",
        "Run a shell command",
        {
            "workdir": {"type": "string", "description": "Where to run it"},
            "cmd": {"type": "string", "description": "The command"},
            "timeout": {"type": "integer", "description": "Seconds"},
        },
        ["cmd"],
    ),
    _tool(
        "write_file",
        "Write a file",
        {
            "path": {"type": "string", "description": "The file"},
            "content": {"type": "string", "description": "Its new text"},
            "mode": {"type": "string", "enum": ["overwrite", "append"], "description": "How"},
        },
        ["path", "content"],
    ),
]


@dataclass(frozen=True, slots=True)
class Reply:
    """A reply the model is scripted to give; ``calls`` keep their arguments' key order."""

    text: str = ""
    reasoning: str = ""
    calls: tuple[tuple[str, dict[str, Any]], ...] = ()


@dataclass(frozen=True, slots=True)
class Step:
    """One model call: its reply, the tool results answering its calls in order, then an optional
    user message."""

    reply: Reply
    results: tuple[str, ...] = ()
    then: str = ""


@dataclass(frozen=True, slots=True)
class Conversation:
    name: str
    opening: tuple[tuple[str, str], ...]
    steps: tuple[Step, ...]
    tools: bool = True
    named_results: bool = False


def _agent_steps(reasoning: bool) -> tuple[Step, ...]:
    def think(text: str) -> str:
        return text if reasoning else ""

    return (
        Step(
            Reply(
                "Listing first.",
                think("Look at the files."),
                (("exec_command", {"workdir": "/repo", "cmd": "ls", "timeout": 10}),),
            ),
            ("a.py test_a.py",),
        ),
        Step(
            Reply(
                "",
                think("Read a.py."),
                (("exec_command", {"cmd": "cat a.py", "workdir": "/repo"}),),
            ),
            ("x = 0",),
        ),
        Step(
            Reply(
                "Writing the fix.",
                think("x must be 1."),
                (("write_file", {"path": "a.py", "content": "x = 1\n", "mode": "overwrite"}),),
            ),
            ("ok",),
        ),
        Step(
            Reply("", "", (("exec_command", {"timeout": 60, "cmd": "pytest -q"}),)), ("1 passed",)
        ),
        Step(Reply("Fixed: x is now 1.", think("The test passes.")), then="Anything else?"),
        Step(Reply("No, that was all.")),
    )


CONVERSATIONS = (
    Conversation(
        "agent",
        (("system", "You are a coding agent."), ("user", "Fix the failing test.")),
        _agent_steps(reasoning=False),
    ),
    Conversation(
        "reasoning",
        (("system", "You are a coding agent."), ("user", "Fix the failing test.")),
        _agent_steps(reasoning=True),
    ),
    Conversation(
        "named-results",
        (("user", "How many files are there?"),),
        (
            Step(Reply("", "", (("exec_command", {"workdir": "/", "cmd": "ls | wc -l"}),)), ("2",)),
            Step(Reply("Checking hidden ones.", "", (("exec_command", {"cmd": "ls -A"}),)), ("a",)),
            Step(Reply("There are two.")),
        ),
        named_results=True,
    ),
    Conversation(
        "no-tools",
        (("system", "Answer briefly."), ("user", "What is 2 + 2?")),
        (Step(Reply("4."), then="And 3 + 3?"), Step(Reply("6."))),
        tools=False,
    ),
)


# -- the reference: transformers' render of the raw request ----------------------------------------


def as_engine_passes_it(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """The raw Chat messages as vLLM's chat endpoint hands them to the template: assistant
    tool-call arguments decoded from their JSON text (key order kept), null content as "" (its
    string content form, and SGLang's); nothing else touched (a tool result keeps the name the
    client sent, or has none)."""
    out: list[dict[str, Any]] = json.loads(json.dumps(list(messages)))
    for message in out:
        if message.get("content") is None:
            message["content"] = ""
        for call in message.get("tool_calls") or ():
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    return out


@contextmanager
def transformers_clock(now: datetime | None) -> Iterator[None]:
    """transformers' ``strftime_now`` answering for ``now`` (its kwargs cannot pass a function:
    it turns them into plain data first)."""
    if now is None:
        yield
        return
    instant = now

    class Frozen(datetime):
        @classmethod
        def now(cls, tz: tzinfo | None = None) -> Frozen:
            return cls.fromtimestamp(instant.timestamp(), tz)

    module = vars(hf_templates)  # an attribute mypy does not see exported
    saved = module["datetime"]
    module["datetime"] = Frozen
    try:
        yield
    finally:
        module["datetime"] = saved


@dataclass
class Reference:
    """transformers' rendering with one template and tokenizer, bos/eos ``<s>``/``</s>``."""

    hf: PreTrainedTokenizerFast
    source: str

    def text(self, messages: list[dict[str, Any]], tools: Any, *, generation: bool) -> str:
        rendered = self.hf.apply_chat_template(
            messages,
            tools=tools,
            chat_template=self.source,
            add_generation_prompt=generation,
            tokenize=False,
            bos_token=SPECIAL["bos_token"],
            eos_token=SPECIAL["eos_token"],
        )
        assert isinstance(rendered, str)
        return rendered

    def ids(self, body: dict[str, Any], clock: datetime | None) -> list[int]:
        """The reference: the raw request as the engines pass it, at the session's instant."""
        with transformers_clock(clock):
            ids = self.hf.apply_chat_template(
                as_engine_passes_it(body["messages"]),
                tools=body.get("tools"),
                chat_template=self.source,
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
                bos_token=SPECIAL["bos_token"],
                eos_token=SPECIAL["eos_token"],
            )
        return list(ids)


# -- the model: what one trained on the template writes --------------------------------------------


def renderable(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """The raw messages as the model's own history: null content as "" and tool results named
    after their calls, so that templates which refuse the client's form still show the model
    what it was trained on (the reference is rendered from the raw form, untouched)."""
    out = as_engine_passes_it(messages)
    names: dict[str, str] = {}
    for message in out:
        if message.get("content") is None:
            message["content"] = ""
        for call in message.get("tool_calls") or ():
            names[call["id"]] = call["function"]["name"]
        if message["role"] == "tool" and message["tool_call_id"] in names:
            message.setdefault("name", names[message["tool_call_id"]])
    return out


def template_reply(reply: Reply) -> dict[str, Any]:
    """The planned reply as a template message (call ids long enough for Mistral's)."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.text}
    if reply.reasoning:
        message["reasoning_content"] = reply.reasoning
    if reply.calls:
        message["tool_calls"] = [
            {"id": f"call_{i:024d}", "type": "function", "function": {"name": n, "arguments": a}}
            for i, (n, a) in enumerate(reply.calls)
        ]
    return message


def _cut_at_stop(text: str, stops: Sequence[str]) -> str:
    ends = [text.index(s) + len(s) for s in stops if s in text]
    return text[: min(ends)] if ends else text


def model_output(
    reference: Reference,
    family: Family,
    messages: list[dict[str, Any]],
    tools: Any,
    reply: Reply,
    parser: BuiltinReplyParser,
) -> str:
    """The text after the prompt in the template's own render of ``reply`` in history, through
    the family's end token: what a model trained on the template writes."""
    render = reference.text
    prompt = render(messages, tools, generation=True)
    full = render([*messages, template_reply(reply)], tools, generation=False)
    out = _after(prompt, full)
    if out is None:  # the generation prompt is not the header history renders: skip that header
        blank = {"role": "assistant", "content": BLANK}
        other = render([*messages, blank], tools, generation=False)
        out = full[common_prefix(full, other) :]
    out = _cut_at_stop(out, family.stops)
    if reply.reasoning and reply.reasoning not in out:
        out = f"<think>\n{reply.reasoning}\n</think>\n\n{out}"
    wanted = [(n, dict(a)) for n, a in reply.calls]
    parsed = parser.parse_text(_strip_stop(out, family.stops)).message.tool_calls
    writer = CALL_WRITERS.get(family.tool_format)
    if [(c.name, json.loads(c.arguments)) for c in parsed] != wanted and writer is not None:
        think = f"<think>\n{reply.reasoning}\n</think>\n\n" if reply.reasoning else ""
        out = think + reply.text + writer(reply.calls) + family.stops[0]
    return out


def _after(prompt: str, full: str) -> str | None:
    """``full``'s text after ``prompt``, whose generation prompt may differ from the header
    ``full`` has in whitespace only (DeepSeek V3.2's); None when it differs in more."""
    if full.startswith(prompt):
        return full[len(prompt) :]
    common = common_prefix(prompt, full)
    pieces = prompt[common:].split()
    found = re.match(r"\s*" + r"\s*".join(map(re.escape, pieces)), full[common:])
    return full[common + found.end() :] if pieces and found else None


def common_prefix(a: str, b: str) -> int:
    """How many leading characters ``a`` and ``b`` share."""
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def _strip_stop(text: str, stops: Sequence[str]) -> str:
    return next((text[: -len(s)] for s in stops if text.endswith(s)), text)


class PlannedOutput(Qwen3ReplyEncoder):
    """The engine double's encoder, answering each request with the ids planned for it."""

    def __init__(self, tokenizer: VocabularyTokenizer) -> None:
        super().__init__(tokenizer)
        self.ids: list[int] = []

    def encode(self, reply: ScriptedReply) -> list[int]:
        del reply  # the plan decides
        return list(self.ids)

    @property
    def end_of_turn_id(self) -> int:
        return self.ids[-1] if self.ids else super().end_of_turn_id


# -- the vocabulary --------------------------------------------------------------------------------


def load_vocabulary(path: Path, family: Family, name: str) -> Vocabulary:
    """Qwen3's vocabulary (or ``path``'s tokenizer.json) with the family's markers and Qwen3's
    (which the engine double needs) as single tokens, and the family's end tokens as stops."""
    if path.suffix == ".json":
        base = Tokenizer.from_file(str(path))
    else:
        base = load_qwen3_vocabulary(QwenTokenizerConfig(path)).tokenizer
    tokenizer = Tokenizer.from_str(base.to_str())
    known = tokenizer.get_vocab(with_added_tokens=True)
    wanted = [t for t in (*QWEN3_MARKERS, *family.specials) if t not in known]
    tokenizer.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in wanted])
    return Vocabulary(tokenizer, name, family.stops)


# -- driving one template --------------------------------------------------------------------------


@dataclass
class Sent:
    """One engine request: the raw body the client sent, the ids the engine got, its turn."""

    conversation: str
    index: int
    body: dict[str, Any]
    ids: list[int]
    turn: Turn
    tree: SessionTree


@dataclass
class Refusal:
    conversation: str
    index: int
    body: dict[str, Any]
    message: str


@dataclass
class Driven:
    sent: list[Sent] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)


def _echo(message: Any) -> dict[str, Any]:
    """The reply as an SDK user passes it back (``messages.append(message)``: the fields the
    server set, ``content: null`` beside calls included)."""
    echoed: dict[str, Any] = message.model_dump(exclude_unset=True, mode="json")
    return echoed


async def drive(
    chat: ChatTemplate,
    mode: TemplateMode,
    family: Family,
    vocabulary: Vocabulary,
    reference: Reference,
    check_rate: float,
) -> Driven:
    """Every conversation through the real server, one session each."""
    renderer = Renderer(vocabulary, chat, RendererConfig(check_sample_rate=check_rate, mode=mode))
    tokenizer = VocabularyTokenizer(vocabulary)
    specs = tuple(
        ToolSpec(
            t["function"]["name"],
            t["function"]["description"],
            json.dumps(t["function"]["parameters"]),
        )
        for t in TOOLS
    )
    parser = BuiltinReplyParser(ParserConfig(tool_format=family.tool_format), specs)
    driven = Driven()
    async with EngineDouble(
        tokenizer, lambda _: ScriptedReply(), incremental_streaming=True
    ) as double:
        planned = double.encoder = PlannedOutput(tokenizer)
        async with (
            SGLangEngine(SGLangConfig(base_url=double.url)) as engine,
            AdapterServer(
                AdapterConfig(),
                engine,
                renderer,
                vocabulary,
                reply_parsers(ParserConfig(tool_format=family.tool_format)),
            ) as server,
        ):
            for conversation in CONVERSATIONS:
                session = server.sessions.open(f"{chat.name}-{conversation.name}")
                api = openai.AsyncOpenAI(
                    base_url=server.url + "/v1", api_key=session.token, max_retries=0
                )
                try:
                    await _converse(
                        api,
                        conversation,
                        session.tree,
                        double,
                        planned,
                        family,
                        reference,
                        parser,
                        vocabulary,
                        driven,
                    )
                finally:
                    await api.close()
    return driven


async def _converse(
    api: openai.AsyncOpenAI,
    conversation: Conversation,
    tree: SessionTree,
    double: EngineDouble,
    planned: PlannedOutput,
    family: Family,
    reference: Reference,
    parser: BuiltinReplyParser,
    vocabulary: Vocabulary,
    driven: Driven,
) -> None:
    tools = TOOLS if conversation.tools else None
    messages: list[Any] = [{"role": r, "content": c} for r, c in conversation.opening]
    for index, step in enumerate(conversation.steps):
        body = json.loads(json.dumps({"messages": messages, "tools": tools}))
        text = model_output(reference, family, renderable(messages), tools, step.reply, parser)
        planned.ids = vocabulary.encode(text)
        before = len(double.requests)
        try:
            if tools is None:
                completion = await api.chat.completions.create(
                    model="policy", messages=messages, max_tokens=1024
                )
            else:
                completion = await api.chat.completions.create(
                    model="policy", messages=messages, tools=tools, max_tokens=1024
                )
        except openai.BadRequestError as exc:
            driven.refusals.append(Refusal(conversation.name, index, body, str(exc)))
            return
        assert len(double.requests) == before + 1, "one engine request per call"
        ids = list(double.requests[-1].input_ids)
        turn = tree.turns[-1]
        assert list(tree.prompt_ids(turn)) == ids, "the tree records what the engine got"
        driven.sent.append(Sent(conversation.name, index, body, ids, turn, tree))
        message = completion.choices[0].message
        messages = [*messages, _echo(message)]
        calls = message.tool_calls or []
        for call, result in zip(calls, (*step.results, *["ok"] * len(calls)), strict=False):
            answer: dict[str, Any] = {"role": "tool", "tool_call_id": call.id, "content": result}
            if conversation.named_results and call.type == "function":
                answer["name"] = call.function.name
            messages.append(answer)
        if step.results and not calls:
            messages.append({"role": "user", "content": "Go on."})
        if step.then:
            messages.append({"role": "user", "content": step.then})


# -- comparing -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Region:
    """One stretch where the sent ids and the reference differ, and what the turn says of it."""

    start: int
    end: int
    ref_start: int
    ref_end: int
    where: str
    why: str


@dataclass
class Verdicts:
    """Per template: requests compared, equal, differing for reasons the turns recorded (by
    reason), differing without one (with their regions), and without a reference (by why)."""

    compared: int = 0
    equal: int = 0
    explained_requests: int = 0
    explained: Counter[str] = field(default_factory=Counter)
    unexplained: list[tuple[Sent, list[int], list[Region]]] = field(default_factory=list)
    no_reference: Counter[str] = field(default_factory=Counter)
    refused: list[str] = field(default_factory=list)
    details: list[str] = field(default_factory=list)


Span = tuple[int, int, LossReason, Turn | None]
NOTED_OUTPUT = re.compile(r"turn (\d+)'s (?:output|reply)")
"""How the renderer's check names the turn whose output it kept."""
NOTED_GENERATION = re.compile(r"turn (\d+)'s generation prompt")
"""How it names the turn whose generation prompt history renders differently."""
THINKING = re.compile(r"<think>.*?</think>\s*", re.DOTALL)
"""A reasoning block as the model writes it, with the whitespace that ends it."""
TURN_NOTES = (OUTPUT_KEPT, PROMPT_MISMATCH, TEMPLATE_DEVIATIONS, TEMPLATE_MODE, TEMPLATE_CLOCK)


def prompt_spans(tree: SessionTree, turn: Turn) -> list[Span]:
    """``(start, end, reason, owner)`` of each span of ``turn``'s prompt; ``owner`` is the turn
    whose generation prompt or output the span is, else None."""
    spans: list[Span] = []
    at = 0
    for node in tree.node(turn.node).path():
        for reason, length in node.spans if node.delta is not None else ():
            if at < turn.prompt_length:
                spans.append((at, min(at + length, turn.prompt_length), reason, node.turn))
            at += length
    return spans


@dataclass(frozen=True, slots=True)
class Notes:
    """What the session's turns recorded about earlier replies: outputs kept verbatim (turn id
    -> the notes naming it), whose reasoning a later turn kept where the template leaves it out,
    and whose generation prompt history renders differently."""

    outputs: dict[int, str]
    reasoning: frozenset[int]
    generation: frozenset[int]

    @classmethod
    def of(cls, tree: SessionTree) -> Notes:
        outputs: dict[int, list[str]] = {}
        reasoning: set[int] = set()
        generation: set[int] = set()
        for turn in tree.turns:
            kept = turn.meta.extra.get(OUTPUT_KEPT, "")
            found = NOTED_OUTPUT.search(kept)
            if found and kept not in outputs.setdefault(int(found.group(1)), []):
                outputs[int(found.group(1))].append(kept)
            if kept == REASONING_KEPT:
                path = tree.node(turn.node).path()
                reasoning.update(n.turn.id for n in path if n.turn is not None)
            found = NOTED_GENERATION.search(turn.meta.extra.get(PROMPT_MISMATCH, ""))
            if found:
                generation.add(int(found.group(1)))
        joined = {turn: "\n".join(notes) for turn, notes in outputs.items()}
        return cls(joined, frozenset(reasoning), frozenset(generation))


def placements(
    tag: str, sent: Sequence[int], reference: Sequence[int], at: tuple[int, int, int, int]
) -> list[tuple[int, int, int, int]]:
    """Every place an inserted or deleted stretch can sit: ``ab|cab`` and ``abc|ab`` delete the
    same text, and the diff picks one; the difference is explained if one of them is. A
    replacement has one place."""
    i1, i2, j1, j2 = at
    if tag == "delete":
        ids, low, high = sent, i1, i2
    elif tag == "insert":
        ids, low, high = reference, j1, j2
    else:
        return [at]
    while low > 0 and ids[low - 1] == ids[high - 1]:
        low, high = low - 1, high - 1
    found: list[tuple[int, int, int, int]] = []
    while True:
        shift = low - (i1 if tag == "delete" else j1)
        if tag == "delete":
            found.append((low, high, j1 + shift, j2 + shift))
        else:
            found.append((i1 + shift, i2 + shift, low, high))
        if high >= len(ids) or ids[low] != ids[high]:
            return found
        low, high = low + 1, high + 1


@dataclass(frozen=True, slots=True)
class Context:
    """What a difference in one request is judged by: the session's notes, and this turn's own
    (an output kept verbatim is noted; its mode accepted the generation-prompt deviation)."""

    notes: Notes
    kept: bool
    accepted: bool


def regions(sent: Sent, reference: list[int], vocabulary: Vocabulary) -> list[Region]:
    """Every differing stretch, located in the turn's spans, with the reason recorded for it
    ("" when none). A stretch in an earlier turn's generation prompt is explained when this
    turn's mode accepted the generation-prompt deviation; one in an earlier turn's output when
    this turn is noted for keeping an output (``output_kept``) and a turn recorded why that one
    was kept (the template renders it differently, leaves out its reasoning), or, whitespace
    only and right after that turn's generation prompt, when the deviation was accepted and
    noted for that turn (the header's whitespace). Nothing else is: the template's own text, the
    new messages and this turn's generation prompt must be equal."""
    spans = prompt_spans(sent.tree, sent.turn)
    extra = sent.turn.meta.extra
    context = Context(
        Notes.of(sent.tree),
        OUTPUT_KEPT in extra,
        GENERATION_PROMPT_DIFFERS in extra.get(TEMPLATE_DEVIATIONS, ""),
    )
    found: list[Region] = []
    matcher = difflib.SequenceMatcher(None, sent.ids, reference, autojunk=False)
    for tag, *at in matcher.get_opcodes():
        if tag == "equal":
            continue
        here: list[Region] = []
        for i1, i2, j1, j2 in placements(tag, sent.ids, reference, (at[0], at[1], at[2], at[3])):
            low, high = (i1, i2) if i2 > i1 else (max(i1 - 1, 0), i1 + 1)
            touched = [s for s in spans if s[0] < high and s[1] > low]
            ours, theirs = vocabulary.decode(sent.ids[i1:i2]), vocabulary.decode(reference[j1:j2])
            why = [_why(span, i1, ours, theirs, context) for span in touched]
            explained = bool(why) and (any(why) if i1 == i2 else all(why))
            where = ", ".join(
                reason.value + (f" of turn {owner.id}" if owner is not None else "")
                for *_, reason, owner in touched
            )
            reason = "; ".join(sorted({w for w in why if w})) if explained else ""
            shown = f"{ours[:40]!r} vs {theirs[:40]!r}"
            here.append(Region(i1, i2, j1, j2, f"{where or 'the end'} ({shown})", reason))
        found.append(next((r for r in here if r.why), here[0]))
    return found


def _why(span: Span, start: int, ours: str, theirs: str, context: Context) -> str:
    """The recorded reason for a difference (``ours`` where the reference has ``theirs``,
    starting at token ``start``) in one span of an earlier turn's reply, or ""."""
    begin, _, reason, owner = span
    if owner is None:
        return ""
    if reason is not LossReason.GENERATED:
        return "generation prompt: the accepted deviation" if context.accepted else ""
    notes = context.notes
    why: list[str] = []
    rest = THINKING.sub("", ours)
    if rest != ours:
        if not (context.kept and (owner.id in notes.reasoning or owner.id in notes.outputs)):
            return ""
        why.append("reply kept: the template leaves out its reasoning")
    if not rest and not theirs:
        return "; ".join(why)
    if context.kept and owner.id in notes.outputs:
        who = "the client echoed" if "echoed" in notes.outputs[owner.id] else "the template renders"
        why.append(f"reply kept: {who} it differently")
    elif (
        not rest.strip()
        and not theirs.strip()
        and start <= begin
        and context.accepted
        and owner.id in notes.generation
    ):
        why.append("generation prompt: the accepted deviation (the header's whitespace)")
    else:
        return ""
    return "; ".join(why)


def compare(driven: Driven, reference: Reference, vocabulary: Vocabulary) -> Verdicts:
    """Each sent prompt against transformers' render of its raw request."""
    verdicts = Verdicts()
    for sent in driven.sent:
        clock = sent.turn.meta.extra.get(TEMPLATE_CLOCK)
        label = f"{sent.conversation}#{sent.index}"
        try:
            expected = reference.ids(sent.body, datetime.fromisoformat(clock) if clock else None)
        except Exception as exc:  # the template refuses the raw request
            verdicts.no_reference[_first_line(exc)] += 1
            verdicts.details.append(f"{label}: no reference: {_first_line(exc)}")
            continue
        verdicts.compared += 1
        if expected == sent.ids:
            verdicts.equal += 1
            continue
        found = regions(sent, expected, vocabulary)
        if any(not r.why for r in found):
            verdicts.unexplained.append((sent, expected, found))
        else:
            verdicts.explained_requests += 1
            verdicts.explained.update({why for r in found for why in r.why.split("; ")})
        verdicts.details.append(
            f"{label}: differs in {len(found)} region(s): "
            + "; ".join(f"{r.where}: {r.why or 'UNEXPLAINED'}" for r in found)
        )
    for refusal in driven.refusals:
        try:
            reference.ids(refusal.body, None)
        except Exception as exc:
            verdicts.no_reference[f"both refuse: {_first_line(exc)}"] += 1
            continue
        verdicts.refused.append(
            f"{refusal.conversation}#{refusal.index}: the adapter refused a request the template "
            f"renders: {refusal.message}"
        )
    return verdicts


def describe(sent: Sent, reference: list[int], found: list[Region], vocab: Vocabulary) -> str:
    """The first unexplained difference: where, the turn's notes, the text on both sides."""
    first = next(r for r in found if not r.why)
    notes = {k: v for k, v in sent.turn.meta.extra.items() if k in TURN_NOTES}
    others = sum(1 for r in found if not r.why) - 1
    return (
        f"{sent.conversation}#{sent.index}: first differing token {first.start} "
        f"(reference {first.ref_start}), in {first.where}"
        + (f" (+{others} more unexplained region(s))" if others else "")
        + f"; notes {notes}\n"
        f"    sent:      {_excerpt(vocab, sent.ids, first.start, first.end)}\n"
        f"    reference: {_excerpt(vocab, reference, first.ref_start, first.ref_end)}"
    )


def _excerpt(vocabulary: Vocabulary, ids: Sequence[int], start: int, end: int) -> str:
    before = vocabulary.decode(ids[:start])[-SHOWN:]
    middle = vocabulary.decode(ids[start:end])
    after = vocabulary.decode(ids[end:])[:SHOWN]
    return f"{before!r} [[{middle!r}]] {after!r}"


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:120]


# -- the run ---------------------------------------------------------------------------------------


@dataclass
class Row:
    """One template's line of the table, and its unexplained differences spelled out."""

    name: str
    digest: str
    verdict: str
    mode: str
    verdicts: Verdicts | None = None
    why_not: str = ""
    unexplained: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return bool(self.unexplained)


def run_template(path: Path, tokenizer: Path, check_rate: float) -> Row:
    """Audit, serve and compare one template file."""
    source = path.read_text("utf-8")
    name = path.stem.removeprefix("tool_chat_template_")
    digest = hashlib.sha256(source.encode("utf-8")).hexdigest()[:12]
    audit = audit_source(name, source, SPECIAL)  # what check-template prints
    mode = MODE_FOR.get(audit.verdict)
    if mode is None:
        fatal = "; ".join(f.feature for f in audit.of_kind(FindingKind.FATAL))
        return Row(name, digest, audit.verdict.value, "-", why_not=fatal)
    family = family_of(name)
    vocabulary = load_vocabulary(tokenizer, family, f"qwen3+{name}")
    hf = PreTrainedTokenizerFast(tokenizer_object=vocabulary.tokenizer)  # type: ignore[no-untyped-call]
    reference = Reference(hf, source)
    chat = ChatTemplate(name, source, SPECIAL)
    driven = asyncio.run(drive(chat, mode, family, vocabulary, reference, check_rate))
    verdicts = compare(driven, reference, vocabulary)
    unexplained = [describe(s, r, f, vocabulary) for s, r, f in verdicts.unexplained]
    return Row(
        name, digest, audit.verdict.value, mode.value, verdicts, "", unexplained + verdicts.refused
    )


def report(rows: Sequence[Row], console: Console, verbose: bool) -> None:
    """Every unexplained difference (and with ``verbose`` every difference), then the table."""
    for row in rows:
        for line in row.verdicts.details if verbose and row.verdicts else ():
            console.print(f"{row.name} {escape(line)}")
        for line in row.unexplained:
            console.print(f"[bold red]unexplained[/] {row.name} {escape(line)}")
    table = Table(title="Raw-request parity per chat template", show_lines=True)
    for column in ("template", "verdict", "mode", "requests", "identical", "explained"):
        table.add_column(column, overflow="fold")
    table.add_column("unexplained", overflow="fold")
    table.add_column("no reference / unusable because", overflow="fold")
    for row in rows:
        name = f"{row.name}\n[dim]sha256 {row.digest}[/]"
        v = row.verdicts
        if v is None:
            table.add_row(name, row.verdict, "-", "-", "-", "-", "-", escape(row.why_not))
            continue
        explained = str(v.explained_requests) + "".join(
            f"\n{escape(reason)} ({n})" for reason, n in sorted(v.explained.items())
        )
        missing = "\n".join(f"{n}x {escape(why)}" for why, n in v.no_reference.items())
        failed = len(v.unexplained) + len(v.refused)
        table.add_row(
            name,
            row.verdict,
            row.mode,
            str(v.compared + len(v.refused)),
            str(v.equal),
            explained,
            f"[bold red]{failed}[/]" if failed else "0",
            missing,
        )
    console.print(table)
    console.print(
        "requests: engine requests compared with the reference (and requests the adapter "
        "refused that the template renders: unexplained); explained: requests whose every "
        "difference the turn recorded (per reason; a request may have several); no reference: "
        "transformers refuses the raw request"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("templates", type=Path, help="a directory of chat templates (*.jinja)")
    parser.add_argument(
        "--tokenizer",
        type=Path,
        default=Path.home() / ".cache" / "agent-rl" / "qwen3-tokenizer",
        help="where the offline Qwen3 tokenizer is built once, or a tokenizer.json to use",
    )
    parser.add_argument(
        "--check-rate",
        type=float,
        default=0.0,
        help="the renderer's sampled whole-prompt check (a failed check renders in full)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="every difference, and why")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    paths = sorted(args.templates.glob("*.jinja"))
    if not paths:
        parser.error(f"no *.jinja files in {args.templates}")
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    started = time.perf_counter()
    rows = [run_template(path, args.tokenizer, args.check_rate) for path in paths]
    report(rows, console, args.verbose)
    console.print(f"{len(rows)} templates in {time.perf_counter() - started:.1f} s")
    return 1 if any(row.failed for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
