"""The bridge against full renders, turn by turn, with the real Qwen3 vocabulary.

Each scenario drives a real ``SessionTree`` the way the server will: route, render, "generate"
(scripted Qwen3-format output encoded with the real tokenizer: the engine double's job), parse,
record, echo the reply back as the client does. On every turn the renderer runs in check mode and
the ids it sends are compared with transformers' ``apply_chat_template(tokenize=True)`` of the
same conversation: equal, because the scripted outputs are what the template would print.
"""

from __future__ import annotations

import json
import math
import random
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from template_session import ChatSession, results
from transformers import PreTrainedTokenizerFast

from protocol_adapters._audit import TemplateMode
from protocol_adapters._bridge import PromptTooLong, Renderer, RendererConfig
from protocol_adapters._bridge.bridge import _skeleton, segment_ids
from protocol_adapters._bridge.check import Place, _whole, check_reply
from protocol_adapters._bridge.notes import (
    ENDS_ON_REPLY,
    KEPT_EARLIER,
    OUTPUT_KEPT,
    PROMPT_MISMATCH,
    TEMPLATE_MODE,
)
from protocol_adapters._parsing import BuiltinReplyParser
from protocol_adapters._template import ChatTemplate, qwen3_template
from protocol_adapters._template.context import (
    SENTINEL,
    BridgeText,
    Slot,
    TemplateContext,
    bridge_text,
    common_prefix_at,
    label_text,
    names_for,
)
from protocol_adapters._template.messages import template_messages, template_tools
from protocol_adapters._tokenizer import QwenTokenizerConfig, Vocabulary, load_qwen3_vocabulary
from protocol_adapters._tokenizer.token_starts import TokenStarts
from protocol_adapters._types import AdapterError, ErrorKind
from trajectory_tree import (
    BridgedPrompt,
    Completion,
    FinishReason,
    FullPrompt,
    LossReason,
    Media,
    Message,
    Prompt,
    Reasoning,
    Segment,
    SessionTree,
    Text,
    ToolCall,
    ToolSpec,
    linearize,
    tree_from_dict,
    tree_to_dict,
)

TOOLS = (
    ToolSpec(
        "bash",
        "Run a shell command.",
        json.dumps({"type": "object", "properties": {"command": {"type": "string"}}}),
    ),
    ToolSpec(
        "read_file",
        "Read a file.",
        json.dumps({"type": "object", "properties": {"path": {"type": "string"}}}),
    ),
)
CHECK_ALL = RendererConfig(check_sample_rate=1.0)


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> Vocabulary:
    # Built once per test session (~2 s) into the session's base temp dir, shared by modules.
    cache = tmp_path_factory.getbasetemp() / "qwen3-tokenizer"
    return load_qwen3_vocabulary(QwenTokenizerConfig(cache))


@pytest.fixture(scope="module")
def hf(qwen: Vocabulary) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_object=qwen.tokenizer)  # type: ignore[no-untyped-call]


def qwen_output(
    text: str = "", reasoning: str = "", calls: Sequence[tuple[str, dict[str, object]]] = ()
) -> str:
    """What a Qwen3 model prints for a reply (without the end token)."""
    out = f"<think>\n{reasoning}\n</think>\n\n" if reasoning else ""
    out += text
    for index, (name, arguments) in enumerate(calls):
        if text or index:
            out += "\n"
        payload = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
        out += f"<tool_call>\n{payload}\n</tool_call>"
    return out


def hf_full_ids(
    hf: PreTrainedTokenizerFast, template: ChatTemplate, prompt: Prompt, gen: bool = True
) -> list[int]:
    ids = hf.apply_chat_template(
        template_messages(prompt.messages),
        tools=list(template_tools(tuple(prompt.tools))) or None,
        chat_template=template.source,
        add_generation_prompt=gen,
        tokenize=True,
        return_dict=False,
    )
    return list(ids)


@dataclass
class Session:
    """A client + engine double around one tree: what the server will do per turn."""

    renderer: Renderer
    vocabulary: Vocabulary
    tools: Sequence[ToolSpec] = TOOLS
    tree: SessionTree = field(default_factory=SessionTree)
    messages: list[Message] = field(default_factory=list)

    def turn(
        self, new: Sequence[Message], output: str, *, end_token: bool = True
    ) -> tuple[list[int], BridgedPrompt | FullPrompt, Message]:
        self.messages.extend(new)
        prompt = Prompt(tuple(self.messages), tuple(self.tools))
        route = self.tree.route(prompt)
        rendered = self.renderer.render(route)
        output_ids = self.vocabulary.encode(output)
        if end_token:
            output_ids.append(self.vocabulary.token_id("<|im_end|>"))
        finish = FinishReason.STOP if end_token else FinishReason.LENGTH
        reply = BuiltinReplyParser(tools=self.tools).parse_ids(output_ids, self.vocabulary).message
        completion = Completion(output_ids, [-0.5] * len(output_ids), finish)
        turn = self.tree.record(route, rendered.prompt, completion, reply)
        assert list(self.tree.prompt_ids(turn)) == rendered.ids.tolist()
        self.messages.append(reply)
        return rendered.ids.tolist(), rendered.prompt, reply


def tool_result(reply: Message, index: int, text: str) -> Message:
    return Message("tool", (Text(text),), tool_call_id=reply.tool_calls[index].id)


def test_multi_turn_bridge_equals_full_render_every_turn(
    qwen: Vocabulary, hf: PreTrainedTokenizerFast
) -> None:
    template = qwen3_template()
    renderer = Renderer(qwen, template, CHECK_ALL)
    session = Session(renderer, qwen)
    sent_prompts: list[tuple[list[int], BridgedPrompt | FullPrompt]] = []

    def turn(new: list[Message], output: str) -> Message:
        sent, prompt, reply = session.turn(new, output)
        sent_prompts.append((sent, prompt))
        expected = hf_full_ids(hf, template, Prompt(tuple(session.messages[:-1]), TOOLS))
        assert sent == expected, f"turn {len(sent_prompts)}"
        return reply

    def results(reply: Message) -> list[Message]:  # parallel results, grouped in one turn
        return [
            tool_result(reply, i, f"result {i}\n  line two") for i in range(len(reply.tool_calls))
        ]

    reply = turn(
        [Message.text("system", "You are a careful coding agent."), Message.text("user", "Fix it")],
        qwen_output(
            "Let me look.", "The test fails; read it first.", [("bash", {"command": "ls"})]
        ),
    )
    reply = turn(
        results(reply),
        qwen_output("", "", [("read_file", {"path": "a.py"}), ("bash", {"command": "pytest -x"})]),
    )
    reply = turn(
        [
            *results(reply),
            Message.text("system", "Note: 5 minutes left."),
            Message.text("user", "go"),
        ],
        qwen_output("Running tests.", "Results look fine.", [("bash", {"command": "pytest"})]),
    )
    reply = turn(results(reply), qwen_output("Done: the off-by-one is fixed.", "Both pass now."))
    turn([Message.text("user", "thanks 🦜 — ünïcödé")], qwen_output("You're welcome."))
    assert all(isinstance(prompt, BridgedPrompt) for _, prompt in sent_prompts)
    stats = renderer.stats
    assert (stats.bridged, stats.checked, stats.mismatches, stats.full_renders) == (5, 5, 0, 0)
    sample = linearize(session.tree).samples
    assert len(sample) == 1  # one lineage: every turn extended the previous one's tokens


def test_scaffold_after_length_stop_and_segments(
    qwen: Vocabulary, hf: PreTrainedTokenizerFast
) -> None:
    renderer = Renderer(qwen, qwen3_template(), CHECK_ALL)
    session = Session(renderer, qwen)
    _, first, reply = session.turn(
        [Message.text("user", "go")], qwen_output("", "", [("bash", {"command": "ls"})])
    )
    assert isinstance(first, BridgedPrompt)
    assert {s.reason for s in first.segments} >= {LossReason.CONTEXT, LossReason.TEMPLATE_SCAFFOLD}
    # The engine stops on the length limit, without <|im_end|>: the template's whole close is owed.
    _, _, reply = session.turn([tool_result(reply, 0, "a.py b.py")], "I will now", end_token=False)
    sent, second, _ = session.turn([Message.text("user", "continue")], "ok")
    assert isinstance(second, BridgedPrompt)
    scaffold = second.segments[0]
    assert scaffold.reason is LossReason.TEMPLATE_SCAFFOLD
    assert qwen.decode(scaffold.ids) == "<|im_end|>\n"
    assert sent == hf_full_ids(hf, qwen3_template(), Prompt(tuple(session.messages[:-1]), TOOLS))
    assert renderer.stats.mismatches == 0

    # After a normal end of turn only the newline is owed; the tool result is labelled as such.
    fresh = Session(Renderer(qwen, qwen3_template(), CHECK_ALL), qwen)
    _, _, reply = fresh.turn(
        [Message.text("user", "go")], qwen_output("", "", [("bash", {"command": "ls"})])
    )
    _, bridged, _ = fresh.turn([tool_result(reply, 0, "file listing")], "fine")
    assert isinstance(bridged, BridgedPrompt)
    assert qwen.decode(bridged.segments[0].ids) == "\n"
    decoded = {qwen.decode(s.ids): s.reason for s in bridged.segments}
    assert decoded["file listing"] is LossReason.TOOL_OUTPUT
    assert decoded["<|im_start|>user\n<tool_response>\n"] is LossReason.TEMPLATE_SCAFFOLD
    assert qwen.decode(bridged.generation_prompt) == "<|im_start|>assistant\n"


def test_reply_written_unlike_the_template_keeps_engine_tokens_and_is_recorded(
    qwen: Vocabulary, hf: PreTrainedTokenizerFast
) -> None:
    """The model writes its call as compact JSON, which the template would re-serialize with
    spaces: the bridge keeps the engine's ids (a full re-render would drift), and the whole-prompt
    check records the difference as kept model output, not as a template fault."""
    renderer = Renderer(qwen, qwen3_template(), CHECK_ALL)
    session = Session(renderer, qwen)
    compact = '<tool_call>\n{"name":"bash","arguments":{"command":"ls -la"}}\n</tool_call>'
    _, _, reply = session.turn([Message.text("user", "go")], compact)
    # The client re-serializes the arguments, as Claude Code does: routing still matches.
    call = reply.tool_calls[0]
    session.messages[-1] = Message(
        "assistant", (ToolCall(call.id, call.name, '{"command":"ls -la"}'),)
    )
    route = session.tree.route(Prompt((*session.messages, tool_result(reply, 0, "x")), TOOLS))
    rendered = renderer.render(route)
    assert isinstance(rendered.prompt, BridgedPrompt)
    full = hf_full_ids(hf, qwen3_template(), route.prompt)
    assert rendered.ids.tolist() != full  # the re-render would have trained on re-serialized JSON
    first = session.tree.turns[0]
    before = [*session.tree.prompt_ids(first), *session.tree.output_ids(first)]
    assert rendered.ids.tolist()[: len(before)] == before  # the engine's own ids, verbatim
    stats = renderer.stats
    assert (stats.checked, stats.mismatches, stats.kept_outputs) == (2, 0, 1)
    assert "turn 0's output is kept verbatim" in rendered.notes[OUTPUT_KEPT]
    assert PROMPT_MISMATCH not in rendered.notes  # the model's own output: no renderer fault


def test_tool_result_after_tool_result_cannot_bridge_grouping_template(qwen: Vocabulary) -> None:
    """Our template closes a tool group only after its last result: a request that adds a result
    after a recorded one is not an append, so it is rendered in full (and counted)."""
    renderer = Renderer(qwen, qwen3_template(), CHECK_ALL)
    tree = SessionTree()
    call = ToolCall("call_1", "bash", '{"command": "ls"}')
    history = [
        Message.text("user", "go"),
        Message("assistant", (call,)),
        Message("tool", (Text("one"),), tool_call_id="call_1"),
    ]
    route = tree.route(Prompt(tuple(history), TOOLS))
    rendered = renderer.render(route)
    tree.record(
        route,
        rendered.prompt,
        Completion([1], [-0.1], FinishReason.STOP),
        Message.text("assistant", "x"),
    )
    longer = Prompt((*history, Message("tool", (Text("two"),), tool_call_id="call_1")), TOOLS)
    again = renderer.render(tree.route(longer))
    assert isinstance(again.prompt, FullPrompt)
    assert "after a tool message" in again.prompt.reason
    assert renderer.stats.full_renders == 1


def test_request_ending_on_the_reply_is_rendered_in_full(qwen: Vocabulary) -> None:
    renderer = Renderer(qwen, qwen3_template(), CHECK_ALL)
    session = Session(renderer, qwen)
    session.turn([Message.text("user", "go")], "hello")
    route = session.tree.route(Prompt(tuple(session.messages), TOOLS))
    rendered = renderer.render(route)
    assert isinstance(rendered.prompt, FullPrompt)
    assert rendered.prompt.reason == ENDS_ON_REPLY


def test_count_tokens_is_the_full_prompt_length(
    qwen: Vocabulary, hf: PreTrainedTokenizerFast
) -> None:
    renderer = Renderer(qwen, qwen3_template())
    prompt = Prompt((Message.text("system", "s"), Message.text("user", "count me")), TOOLS)
    assert renderer.count_tokens(prompt) == len(hf_full_ids(hf, renderer.template, prompt))


def test_media_is_a_clear_error(qwen: Vocabulary) -> None:
    renderer = Renderer(qwen, qwen3_template())
    prompt = Prompt((Message("user", (Media("image/png", "aGk="),)),))
    with pytest.raises(AdapterError, match="image/png"):
        renderer.render(SessionTree().route(prompt))


def test_renderer_is_safe_across_threads(qwen: Vocabulary) -> None:
    renderer = Renderer(qwen, qwen3_template(), CHECK_ALL)
    results: list[list[int]] = []
    lock = threading.Lock()

    def work(i: int) -> None:
        prompt = Prompt((Message.text("user", f"thread {i % 3}"),), TOOLS)
        ids = renderer.render(SessionTree().route(prompt)).ids.tolist()
        with lock:
            results.append(ids)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({tuple(r) for r in results}) == 3
    assert renderer.stats.bridged == 12
    assert renderer.stats.mismatches == 0


def test_the_whole_prompt_check_places_a_difference_in_the_span_it_falls_in(
    qwen: Vocabulary,
) -> None:
    """Prefix ids: a user message (context, 3 ids), turn 0's generation prompt (2 ids) and its
    output (3 ids); then the new messages. A difference on a span's first or last token is
    that span's, never its neighbour's."""
    tree = SessionTree()
    first = Prompt((Message.text("user", "go"),))
    route = tree.route(first)
    reply = Message.text("assistant", "x")
    bridged = BridgedPrompt([Segment(LossReason.CONTEXT, [11, 12, 13])], [14, 15])
    tree.record(route, bridged, Completion([16, 17, 18], [-0.1] * 3, FinishReason.STOP), reply)
    later = tree.route(Prompt((*first.messages, reply, Message.text("user", "again"))))
    sent = [*later.prefix_ids().tolist(), 19, 20]
    assert sent[:8] == list(range(11, 19))

    def place(at: int) -> tuple[Place, str]:
        full = [*sent[:at], 99, *sent[at + 1 :]]
        mismatch = _whole(later, qwen, sent, full)
        assert mismatch is not None
        # the reason quotes six tokens of each side from the first difference on
        bridged, template = qwen.decode(sent[at : at + 6]), qwen.decode(full[at : at + 6])
        assert f"token {at}: bridged {bridged!r}, template {template!r}" in mismatch.reason
        return mismatch.place, mismatch.reason

    earlier = (Place.TEMPLATE_TEXT, "earlier text")
    generation = (Place.GENERATION_PROMPT, "turn 0's generation prompt")
    output = (Place.OUTPUT, "turn 0's output is kept verbatim")
    new = (Place.TEMPLATE_TEXT, "in the new messages")
    expected = [earlier] * 3 + [generation] * 2 + [output] * 3 + [new] * 2
    for at, (where, words) in enumerate(expected):
        found, reason = place(at)
        assert (found, words in reason) == (where, True), f"token {at}: {reason}"
    assert _whole(later, qwen, sent, list(sent)) is None
    shorter = _whole(later, qwen, sent, sent[:-1])
    assert shorter is not None
    assert "token 9:" in shorter.reason
    assert "in the new messages" in shorter.reason


def fresh_turns(renderer: Renderer, count: int) -> list[bool]:
    """Whether each of ``count`` first turns of new sessions was checked."""
    return [
        renderer.render(
            SessionTree().route(Prompt((Message.text("user", f"n{i}"),), TOOLS))
        ).checked
        for i in range(count)
    ]


def test_check_sample_rate_zero_checks_no_turn_and_one_checks_every_turn(
    qwen: Vocabulary,
) -> None:
    never = Renderer(qwen, qwen3_template(), RendererConfig(check_sample_rate=0.0, seed=1))
    assert fresh_turns(never, 12) == [False] * 12
    assert never.stats.checked == 0
    always = Renderer(qwen, qwen3_template(), RendererConfig(check_sample_rate=1.0, seed=1))
    assert fresh_turns(always, 12) == [True] * 12
    assert (always.stats.checked, always.stats.bridged) == (12, 12)


def test_check_sample_rate_between_checks_that_fraction_of_turns_by_seed(
    qwen: Vocabulary,
) -> None:
    config = RendererConfig(check_sample_rate=0.1, seed=7)
    drawn = fresh_turns(Renderer(qwen, qwen3_template(), config), 60)
    assert 1 <= sum(drawn) <= 15
    assert fresh_turns(Renderer(qwen, qwen3_template(), config), 60) == drawn  # seeded


def test_renderer_config_bounds() -> None:
    for rate in (0.0, 1.0):
        assert RendererConfig(check_sample_rate=rate).check_sample_rate == rate
    for rate in (-0.01, 1.01):
        with pytest.raises(ValueError, match="check_sample_rate"):
            RendererConfig(check_sample_rate=rate)
    assert RendererConfig(context_cache_size=1).context_cache_size == 1
    with pytest.raises(ValueError, match="context_cache_size"):
        RendererConfig(context_cache_size=0)


def test_render_full_is_the_templates_render_counted_under_the_callers_reason(
    qwen: Vocabulary, hf: PreTrainedTokenizerFast
) -> None:
    renderer = Renderer(qwen, qwen3_template())
    prompt = Prompt((Message.text("system", "s"), Message.text("user", "count me")), TOOLS)
    rendered = renderer.render_full(prompt, "the adapter chose a full render")
    assert isinstance(rendered.prompt, FullPrompt)
    assert (
        rendered.ids.tolist()
        == list(rendered.prompt.ids)
        == hf_full_ids(hf, renderer.template, prompt)
    )
    assert rendered.prompt.reason == "the adapter chose a full render"
    header = qwen.encode("<|im_start|>assistant\n")
    assert rendered.prompt.generation_prompt_length == len(header)
    assert rendered.ids.tolist()[len(rendered.ids) - len(header) :] == header
    assert renderer.stats.fallbacks == {"the adapter chose a full render": 1}
    assert not rendered.checked
    fits = renderer.render_full(prompt, "limit", max_tokens=len(rendered.ids))
    assert fits.ids == rendered.ids
    limit = len(rendered.ids) - 1
    with pytest.raises(PromptTooLong, match=r"the prompt holds at least \d+ tokens") as refused:
        renderer.render_full(prompt, "limit", max_tokens=limit)
    assert refused.value.tokens > limit


def test_a_mode_given_by_name_is_that_mode(qwen: Vocabulary) -> None:
    """Configuration read from text (a command line, a file) names the mode: it is served as
    the mode itself."""
    config = RendererConfig(mode="full-render")  # type: ignore[arg-type]
    assert config.mode is TemplateMode.FULL_RENDER
    rendered = Renderer(qwen, qwen3_template(), config).render(
        SessionTree().route(Prompt((Message.text("user", "go"),), TOOLS))
    )
    assert isinstance(rendered.prompt, FullPrompt)
    assert rendered.notes[TEMPLATE_MODE] == "full-render"


def test_a_conversation_without_messages_is_the_clients_error(qwen: Vocabulary) -> None:
    renderer = Renderer(qwen, qwen3_template())
    with pytest.raises(AdapterError, match="no messages") as refused:
        renderer.render(SessionTree().route(Prompt((), TOOLS)))
    assert refused.value.kind is ErrorKind.INVALID_REQUEST


def test_a_retried_first_request_is_its_generation_prompt_on_the_recorded_prefix(
    qwen: Vocabulary, hf: PreTrainedTokenizerFast
) -> None:
    """The client sends its first request again (a retry): every message is on the path, none
    is new, and the prefix does not end on a reply, so only the generation prompt is added."""
    renderer = Renderer(qwen, qwen3_template(), CHECK_ALL)
    session = Session(renderer, qwen)
    session.turn([Message.text("user", "go")], "hello")
    first = Prompt(tuple(session.messages[:1]), TOOLS)
    route = session.tree.route(first)
    assert (route.new_messages, route.previous_generated) == ((), None)
    rendered = renderer.render(route)
    assert isinstance(rendered.prompt, BridgedPrompt)
    assert list(rendered.prompt.segments) == []
    assert qwen.decode(rendered.prompt.generation_prompt) == "<|im_start|>assistant\n"
    assert rendered.ids.tolist() == hf_full_ids(hf, renderer.template, first)


def test_a_bridged_prompt_is_refused_exactly_past_the_limit(qwen: Vocabulary) -> None:
    """The prefix, the closing scaffold and the generation prompt count against the limit as
    much as the new messages: at the prompt's length it is served, one token less is refused
    with a count above the limit, and so is a limit the parts around the new messages fill."""
    renderer = Renderer(qwen, qwen3_template())
    session = Session(renderer, qwen)
    _, _, reply = session.turn(
        [Message.text("user", "go")], qwen_output("", "", [("bash", {"command": "ls"})])
    )
    route = session.tree.route(
        Prompt((*session.messages, tool_result(reply, 0, "a.py b.py")), TOOLS)
    )
    rendered = renderer.render(route)
    assert isinstance(rendered.prompt, BridgedPrompt)
    scaffold = rendered.prompt.segments[0]
    assert scaffold.reason is LossReason.TEMPLATE_SCAFFOLD
    around = route.prefix_length + len(scaffold.ids) + len(rendered.prompt.generation_prompt)
    assert renderer.render(route, max_tokens=len(rendered.ids)).ids == rendered.ids
    for limit in (len(rendered.ids) - 1, around):
        with pytest.raises(PromptTooLong) as refused:
            renderer.render(route, max_tokens=limit)
        assert refused.value.tokens > limit
    # a limit those parts alone pass is refused before the new messages are encoded: the count
    # is theirs
    with pytest.raises(PromptTooLong) as early:
        renderer.render(route, max_tokens=around - 1)
    assert early.value.tokens == around


def test_count_tokens_refuses_past_the_limit(qwen: Vocabulary) -> None:
    renderer = Renderer(qwen, qwen3_template())
    prompt = Prompt((Message.text("system", "s"), Message.text("user", "count me")), TOOLS)
    tokens = renderer.count_tokens(prompt)
    assert renderer.count_tokens(prompt, max_tokens=tokens) == tokens
    with pytest.raises(PromptTooLong) as refused:
        renderer.count_tokens(prompt, max_tokens=tokens - 1)
    assert refused.value.tokens > tokens - 1


def test_a_tool_result_answering_no_call_is_rendered(
    qwen: Vocabulary, hf: PreTrainedTokenizerFast
) -> None:
    """A result whose call is nowhere in the conversation (the client trimmed it): looking for
    the call's name stops at the first message, and the request renders as the template
    renders it."""
    renderer = Renderer(qwen, qwen3_template(), CHECK_ALL)
    orphan = Message("tool", (Text("late output"),), tool_call_id="call_gone")
    prompt = Prompt((Message.text("user", "go"), orphan), TOOLS)
    rendered = renderer.render(SessionTree().route(prompt))
    assert rendered.ids.tolist() == hf_full_ids(hf, renderer.template, prompt)


KEPT = "turn 0's output is kept verbatim where the template renders its reply differently"
COMPACT_CALL = '<tool_call>\n{"name":"bash","arguments":{"command":"ls"}}\n</tool_call>'


@pytest.mark.parametrize("output", ["\n\nhello", COMPACT_CALL], ids=["newlines-first", "compact"])
def test_an_unchecked_turn_notes_a_reply_the_model_wrote_unlike_the_template(
    qwen: Vocabulary, output: str
) -> None:
    """No sampled check: the previous reply alone is compared with the template's rendering
    of it. A difference from the reply's first character on is the model's own output (kept
    verbatim and served), never the generation prompt's; later turns carry the note too."""
    renderer = Renderer(qwen, qwen3_template(), RendererConfig(check_sample_rate=0.0))
    session = ChatSession(renderer, qwen)
    reply = session.turn([Message.text("user", "go")], output)
    new = results(reply, "a.py") if reply.tool_calls else [Message.text("user", "more")]
    session.turn(new, "ok")
    session.turn([Message.text("user", "and now?")], "done")
    (_, first), (_, second), (_, third) = session.sent
    assert [type(r.prompt) for r in (first, second, third)] == [BridgedPrompt] * 3
    assert OUTPUT_KEPT not in first.notes
    assert second.notes[OUTPUT_KEPT].startswith(KEPT)
    assert third.notes[OUTPUT_KEPT] == KEPT_EARLIER
    stats = renderer.stats
    assert (stats.bridged, stats.checked, stats.kept_outputs, stats.full_renders) == (3, 0, 1, 0)


def test_an_unchecked_turn_notes_a_reply_the_client_echoed_otherwise(qwen: Vocabulary) -> None:
    """The client echoes the reply without its reasoning (the same message to routing): the
    template renders that echo unlike what the model wrote, and the note says the client did."""
    renderer = Renderer(qwen, qwen3_template(), RendererConfig(check_sample_rate=0.0))
    session = ChatSession(renderer, qwen)
    reply = session.turn([Message.text("user", "go")], qwen_output("hello", "plan it"))
    assert reply.reasoning
    session.messages[-1] = Message("assistant", (Text("hello"),))
    session.turn([Message.text("user", "more")], "ok")
    rendered = session.sent[-1][1]
    assert isinstance(rendered.prompt, BridgedPrompt)
    assert rendered.notes[OUTPUT_KEPT].startswith(
        "the client echoed turn 0's reply re-serialized or trimmed"
    )
    assert renderer.stats.kept_outputs == 1


@settings(deadline=None)
@given(text=st.text("ab", max_size=10), piece=st.text("ab", max_size=10), data=st.data())
def test_common_prefix_at_is_the_longest_prefix_of_the_piece_found_there(
    text: str, piece: str, data: st.DataObject
) -> None:
    start = data.draw(st.integers(0, len(text)))
    longest = 0
    while longest < len(piece) and text[start + longest : start + longest + 1] == piece[longest]:
        longest += 1
    assert common_prefix_at(text, start, piece) == longest


PLAIN = ChatTemplate(
    "plain",
    "{%- for m in messages %}{{- m.content + '\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '> ' }}{%- endif %}",
    {},
)

QUOTED = ChatTemplate(
    "quoted", "{%- for m in messages %}{{- '>' + m.content + '\\n' }}{%- endfor %}"
)


def test_labels_cover_the_text_from_a_first_character_of_content_to_its_end() -> None:
    """A template without headers puts the first message's content at the very start, where a
    one-character content is still content, and one with a one-character header puts a
    one-character scaffold there; the last label runs to the end of the text whatever follows
    the last message there."""
    user = Message.text("user", "x")
    context = TemplateContext(PLAIN, Prompt((user,)))
    assert label_text(context, [None], [user], "x\n", {}) == [
        (1, LossReason.CONTEXT),
        (2, LossReason.TEMPLATE_SCAFFOLD),
    ]
    two = [user, Message.text("user", "yz")]
    spans = label_text(context, [None, Slot("user")], two, "x\nyz\n~~", {})
    assert spans == [
        (1, LossReason.CONTEXT),
        (2, LossReason.TEMPLATE_SCAFFOLD),
        (4, LossReason.CONTEXT),
        (7, LossReason.TEMPLATE_SCAFFOLD),
    ]
    quoted = TemplateContext(QUOTED, Prompt((user,)))
    assert label_text(quoted, [None], [user], ">x\n", {}) == [
        (1, LossReason.TEMPLATE_SCAFFOLD),
        (2, LossReason.CONTEXT),
        (3, LossReason.TEMPLATE_SCAFFOLD),
    ]


INDEXED = ChatTemplate(
    "indexed",
    "{%- for m in messages %}{{- '<' ~ loop.index0 ~ '>' + m.content + '\\n' }}{%- endfor %}",
)


def test_labels_find_content_where_the_learned_header_is_not_the_messages() -> None:
    """A template that numbers messages: the header learned after a one-message probe is
    ``<1>``, the third message's is ``<2>``; its content is still found where it is, and the
    ``<2>`` before it is scaffold."""
    messages = [Message.text("user", words) for words in ("x", "yz", "w")]
    context = TemplateContext(INDEXED, Prompt(tuple(messages)))
    assert context.header(Slot("user"), "user") == "<1>"
    slots = [None, Slot("user"), Slot("user")]
    scaffold, words = LossReason.TEMPLATE_SCAFFOLD, LossReason.CONTEXT
    assert label_text(context, slots, messages, "<0>x\n<1>yz\n<2>w\n", {}) == [
        (3, scaffold),
        (4, words),
        (5, scaffold),
        (8, scaffold),
        (10, words),
        (11, scaffold),
        (14, scaffold),
        (15, words),
        (16, scaffold),
    ]


def test_a_turn_is_checked_when_the_seeded_draw_falls_below_the_rate(qwen: Vocabulary) -> None:
    """A rate r checks a turn with probability r exactly: when the seeded draw, in [0, 1), is
    below it. A rate equal to the draw does not check that turn; the next rate up does."""
    draw = random.Random(5).random()
    for rate, checked in ((draw, False), (math.nextafter(draw, 1.0), True)):
        config = RendererConfig(check_sample_rate=rate, seed=5)
        assert fresh_turns(Renderer(qwen, qwen3_template(), config), 1) == [checked]


def call(call_id: str, name: str) -> Message:
    return Message("assistant", (ToolCall(call_id, name, "{}"),))


def answer(call_id: str) -> Message:
    return Message("tool", (Text("out"),), tool_call_id=call_id)


def test_a_result_is_named_after_the_nearest_call_with_its_id_before_it() -> None:
    """Call ids can repeat (models and clients that number calls per turn): a new result is
    named after the call with its id that comes last before it, one among the new messages
    first, else the latest earlier one."""
    user = Message.text("user", "go")
    earlier = [user, call("c0", "bash"), answer("c0")]
    both = (ToolCall("c0", "read", "{}"), ToolCall("c1", "grep", "{}"))
    latest = [*earlier, Message("assistant", both)]
    assert names_for([*latest, answer("c0"), answer("c1")], len(latest)) == {
        "c0": "read",
        "c1": "grep",
    }
    matched = [*earlier, Message.text("user", "again")]
    written = [call("c0", "read"), answer("c0")]  # a call the client wrote, then its result
    assert names_for([*matched, *written], len(matched)) == {"c0": "read"}


def test_a_skeleton_keeps_a_messages_shape_and_none_of_its_length() -> None:
    """Texts become one-character stand-ins, arguments an empty mapping, reasoning a marker of
    the message's position; every block keeps its place, whatever its kind."""
    reply = Message(
        "assistant",
        (
            Reasoning("a long plan " * 40),
            Text("a long answer " * 40),
            ToolCall("c0", "bash", '{"command": "ls -la"}'),
        ),
    )
    assert _skeleton(reply, 3).content == (
        Reasoning("@@reasoning-3@@"),
        Text("x"),
        ToolCall("c0", "bash", "{}"),
    )
    image = Media("image/png", "aGk=")
    assert _skeleton(Message("user", (Text("look " * 50), image)), 0).content == (Text("x"), image)


def test_a_slot_is_what_a_probe_must_end_like() -> None:
    """A system message leads only when it opens the conversation; a tool result's slot holds
    the call it answers (its id and its function's name), and its probe conversation makes
    that very call and answers it."""
    user, reply = Message.text("user", "go"), Message.text("assistant", "ok")
    system = Message.text("system", "s")
    assert Slot.of([system, user], 0, {}).leading
    later = Slot.of([user, reply, system], 2, {})
    assert not later.leading
    assert [m.role for m in later.base()] == ["user", "assistant", "system"]
    result = Slot.of([user, call("call_7", "bash"), answer("call_7")], 2, {"call_7": "bash"})
    assert result.calls == (("call_7", "bash"),)
    _, made, answered = result.base()
    assert made.tool_calls == (ToolCall("call_7", "bash", "{}"),)
    assert answered.tool_call_id == "call_7"


SILENT_SYSTEM = ChatTemplate(
    "silent-system",
    "{%- for m in messages if m.role != 'system' %}{{- m.content + '\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '> ' }}{%- endif %}",
)
REPLIES_ONLY = ChatTemplate(
    "replies-only",
    "{%- for m in messages if m.role == 'assistant' %}{{- m.content + '<end>' }}{%- endfor %}",
)
NO_REPLIES = ChatTemplate(
    "no-replies",
    "{%- for m in messages if m.role != 'assistant' %}{{- m.content + '\\n' }}{%- endfor %}",
)
GENERATION_BY_LAST_CONTENT = ChatTemplate(
    "generation-by-last-content",
    "{%- for m in messages %}{{- m.content }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- 'A' if messages[-1].content == '' else 'eA' }}{%- endif %}",
)


def test_a_header_is_the_template_text_before_a_probes_content() -> None:
    """Empty for a template that writes nothing before the first message, unknown (None) for
    one that leaves the probe's content out."""
    context = TemplateContext(qwen3_template(), Prompt((Message.text("user", "go"),)))
    assert context.header(Slot("assistant"), "user") == "<|im_start|>user\n"
    assert context.header(Slot("assistant"), "tool") == "<|im_start|>user\n<tool_response>\n"
    assert TemplateContext(PLAIN, Prompt(())).header(None, "user") == ""
    assert TemplateContext(SILENT_SYSTEM, Prompt(())).header(None, "system") is None


def test_the_assistant_tail_is_what_follows_a_replys_content() -> None:
    """Found wherever the content is, the very start of the render included; a template that
    leaves replies out has none."""
    assert TemplateContext(REPLIES_ONLY, Prompt(())).assistant_tail() == "<end>"
    with pytest.raises(ValueError, match="drops assistant content"):
        TemplateContext(NO_REPLIES, Prompt(())).assistant_tail()


def test_new_messages_are_the_render_between_the_base_and_the_generation_prompt() -> None:
    """A message the template renders as nothing is bridged as nothing; a render shorter than
    the base and the generation prompt together (they overlap) is no append of the two."""
    user, note = Message.text("user", "go"), Message.text("system", "note")
    silent = TemplateContext(SILENT_SYSTEM, Prompt(()))
    assert bridge_text(silent, Slot("user"), [note], Slot.of([user, note], 1, {})) == BridgeText(
        "", "> "
    )
    overlapping = TemplateContext(GENERATION_BY_LAST_CONTENT, Prompt(()))
    empty = Message.text("user", "")
    assert overlapping.generation_prompt(Slot("user")) == "eA"
    assert overlapping.render_after(Slot("user"), [empty], gen=True) == "baseA"
    assert bridge_text(overlapping, Slot("user"), [empty], Slot("user")) is None


def test_ids_are_cut_where_the_spans_end_and_none_is_lost() -> None:
    """Tokens "ab", "c", "de": a span no token starts in gets no segment, and the last span
    takes every id left, even one that starts past its end."""
    ids, starts = [1, 2, 3], [0, 2, 3]
    context, tool = LossReason.CONTEXT, LossReason.TOOL_OUTPUT
    scaffold = LossReason.TEMPLATE_SCAFFOLD
    assert segment_ids(ids, starts, [(1, context), (2, tool), (3, scaffold), (5, context)]) == [
        Segment(context, [1]),
        Segment(scaffold, [2]),
        Segment(context, [3]),
    ]
    assert segment_ids(ids, starts, [(1, context), (3, scaffold)]) == [
        Segment(context, [1]),
        Segment(scaffold, [2, 3]),
    ]


FIRST_MARKED = ChatTemplate(
    "first-marked",
    "{%- for m in messages %}{%- if loop.first %}{{- '[first]' }}{%- endif %}"
    "{{- m.content + '\\n' }}{%- endfor %}",
)


def test_a_reply_that_opens_the_conversation_is_compared_with_its_render_first(
    qwen: Vocabulary,
) -> None:
    """A turn recorded for a request of no messages (the tree takes one): its reply is the
    conversation's first message, rendered with nothing before it."""
    tree = SessionTree()
    reply = Message.text("assistant", "hello")
    first = Completion(qwen.encode("hello"), [-0.1], FinishReason.STOP)
    tree.record(tree.route(Prompt(())), BridgedPrompt((), qwen.encode("[first]")), first, reply)
    later = tree.route(Prompt((reply, Message.text("user", "more"))))
    assert later.previous_generated is not None
    assert check_reply(later, TemplateContext(FIRST_MARKED, later.prompt), qwen, "\n", {}) is None


def test_a_reply_read_without_a_generation_prompt_span_differs_from_its_first_token(
    qwen: Vocabulary,
) -> None:
    """A document may leave out the empty generation prompt's span of a reply: the reply's
    tokens are then all output, and a difference in its first token is the output's (here the
    client echoed it without its reasoning), never a generation prompt's."""
    tree = SessionTree()
    go = Message.text("user", "go")
    output = qwen.encode("<think>\nplan\n</think>\n\nhello")
    reply = Message("assistant", (Reasoning("plan"), Text("hello")))
    sent = BridgedPrompt([Segment(LossReason.CONTEXT, qwen.encode("go\n"))], [])
    completion = Completion(output, [-0.1] * len(output), FinishReason.STOP)
    tree.record(tree.route(Prompt((go,))), sent, completion, reply)
    document = tree_to_dict(tree)
    (entry,) = [node for node in document["nodes"] if "turn" in node]
    assert entry["spans"][0] == [str(LossReason.TEMPLATE_SCAFFOLD), 0]
    entry["spans"] = entry["spans"][1:]
    echo = Message.text("assistant", "hello")
    later = tree_from_dict(document).route(Prompt((go, echo, Message.text("user", "more"))))
    assert later.anchor.spans == ((LossReason.GENERATED, len(output)),)
    mismatch = check_reply(later, TemplateContext(PLAIN, later.prompt), qwen, "\n", {})
    assert mismatch is not None
    assert mismatch.place is Place.OUTPUT
    assert mismatch.reason.startswith("the client echoed turn 0's reply re-serialized or trimmed")


@dataclass
class Work:
    """What a renderer asks of its template and vocabulary: the contents of the messages of
    each render, and each text encoded."""

    renders: list[list[str]] = field(default_factory=list)
    encoded: list[str] = field(default_factory=list)

    def probes(self) -> int:
        """Renders of probe conversations only (every message's content ``base`` or the
        sentinel, whose words are none of a real conversation's here)."""
        return sum(all(c in {"base", SENTINEL} for c in contents) for contents in self.renders)


@pytest.fixture
def work(monkeypatch: pytest.MonkeyPatch) -> Work:
    seen = Work()
    render_raw = ChatTemplate.render_raw
    encode, encode_with_starts = Vocabulary.encode, Vocabulary.encode_with_starts

    def rendered(self: ChatTemplate, messages: Sequence[Any], *args: Any, **kwargs: Any) -> str:
        seen.renders.append([str(m["content"]) for m in messages])
        return render_raw(self, messages, *args, **kwargs)

    def encoded(self: Vocabulary, text: str, **kwargs: Any) -> list[int]:
        seen.encoded.append(text)
        return encode(self, text, **kwargs)

    def encoded_with_starts(
        self: Vocabulary, text: str, **kwargs: Any
    ) -> tuple[list[int], TokenStarts]:
        seen.encoded.append(text)
        return encode_with_starts(self, text, **kwargs)

    monkeypatch.setattr(ChatTemplate, "render_raw", rendered)
    monkeypatch.setattr(Vocabulary, "encode", encoded)
    monkeypatch.setattr(Vocabulary, "encode_with_starts", encoded_with_starts)
    return seen


def test_a_turn_in_a_context_seen_before_renders_and_encodes_only_its_own_messages(
    qwen: Vocabulary, work: Work
) -> None:
    """What the probes taught (texts before and after messages, generation prompts and their
    ids) is kept per request context: a turn like one before (here the client sends another
    message in place of its last) renders the template only with its own messages in it and
    encodes only its closing scaffold and new message."""
    renderer = Renderer(qwen, qwen3_template(), RendererConfig(check_sample_rate=0.0))
    session = Session(renderer, qwen)
    session.turn([Message.text("user", "go")], "hello")
    session.turn([Message.text("user", "more")], "ok")
    other = Prompt((*session.messages[:2], Message.text("user", "other")), TOOLS)
    again = session.tree.route(other)
    work.renders.clear()
    work.encoded.clear()
    rendered = renderer.render(again)
    assert isinstance(rendered.prompt, BridgedPrompt)
    assert work.renders, "the new message and the reply before it are rendered"
    assert all({"go", "hello", "other"} & set(contents) for contents in work.renders)
    assert work.encoded == ["\n", "<|im_start|>user\nother<|im_end|>\n"]


def test_the_probes_of_the_most_recently_used_contexts_are_kept(
    qwen: Vocabulary, work: Work
) -> None:
    """``context_cache_size`` contexts keep what their probes taught: using one keeps it, and a
    new one pushes out the one used longest ago, whose next turn probes the template again."""
    config = RendererConfig(check_sample_rate=0.0, context_cache_size=2)
    renderer = Renderer(qwen, qwen3_template(), config)
    first, second, third = TOOLS[:1], TOOLS[1:], TOOLS

    def probes(tools: Sequence[ToolSpec]) -> int:
        before = work.probes()
        renderer.render(SessionTree().route(Prompt((Message.text("user", "go"),), tools)))
        return work.probes() - before

    assert probes(first) > 0
    assert probes(second) > 0
    assert probes(first) == 0  # kept, and now the most recently used
    assert probes(third) > 0  # pushes out the second
    assert probes(first) == 0
    assert probes(second) > 0
