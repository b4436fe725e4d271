"""Chat-template traits of published model families, reproduced in templates written here, each
audited and served: exact where the bridge can be exact, otherwise refused loudly at start or
served only in a mode the user chose, with every turn recording it.

Every prompt a session sends is compared with transformers' own render of the same conversation
(``apply_chat_template(tokenize=True)``), with the renderer's check at rate 1.0.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import transformers.utils.chat_template_utils as hf_templates
from template_session import (
    SPECIAL,
    TOOLS,
    ChatSession,
    agent_session,
    output,
    reference_ids,
    results,
    trait_template,
)

from protocol_adapters._audit import (
    FindingKind,
    TemplateMode,
    TemplateRefused,
    Verdict,
    audit_template,
)
from protocol_adapters._bridge import RenderedPrompt, Renderer, RendererConfig
from protocol_adapters._bridge.notes import (
    FAILED_CHECK,
    FULL_RENDER_MODE,
    OUTPUT_KEPT,
    PROBE_REFUSED,
    PROMPT_MISMATCH,
    REASONING_KEPT,
    TEMPLATE_CLOCK,
    TEMPLATE_DEVIATIONS,
    TEMPLATE_MODE,
)
from protocol_adapters._template import ChatTemplate, qwen3_template
from protocol_adapters._template.context import MAX_SCAFFOLD_CHARS
from protocol_adapters._template.messages import template_messages
from protocol_adapters._tokenizer import Vocabulary
from protocol_adapters._types import AdapterError
from trajectory_tree import (
    BridgedPrompt,
    Completion,
    FinishReason,
    FullPrompt,
    LossReason,
    Message,
    Prompt,
    SessionTree,
    Text,
    ToolCall,
    ToolSpec,
    linearize,
    summarize,
)

SMALL = Path(__file__).parent.parent / "fixtures" / "small_tokenizer.json"

GENERATION_ADDS_EMPTY_THINKING = (
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
)
REASONING_AFTER_LAST_USER_ONLY = "loop.index0 > ns.last_user"
TODAY = "{{- '\\nToday is ' + strftime_now('%Y-%m-%d') + '.' }}"
SYSTEM_FIRST_ONLY = "{{- raise_exception('system messages must come first') }}"
ONE_CALL_PER_TURN = (
    "{%- if (m.tool_calls or []) | length > 1 %}"
    "{{- raise_exception('only one tool call per turn') }}{%- endif %}"
)
ALWAYS_ASSISTANT_HEADER = "{{- '<|im_start|>assistant\\n' }}"
GENERATION_IN_TURN = (
    "{%- if add_generation_prompt and messages[-1].role != 'tool' %}"
    "{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@pytest.fixture(scope="module")
def small() -> Vocabulary:
    return Vocabulary.from_file(SMALL)


def template(name: str, **traits: str) -> ChatTemplate:
    return ChatTemplate(name, trait_template(**traits), SPECIAL)


def serve(
    small: Vocabulary, chat: ChatTemplate, mode: TemplateMode = TemplateMode.EXACT
) -> ChatSession:
    return ChatSession(
        Renderer(small, chat, RendererConfig(check_sample_rate=1.0, mode=mode)), small
    )


def assert_exact(session: ChatSession, chat: ChatTemplate, **kwargs: object) -> None:
    """Every prompt the session sent is transformers' render of its conversation."""
    for index, (prompt, rendered) in enumerate(session.sent):
        expected = reference_ids(session.vocabulary, chat.source, prompt, **kwargs)  # type: ignore[arg-type]
        assert rendered.ids.tolist() == expected, f"turn {index}"


def test_the_base_template_is_bridged_exactly_with_probes_it_accepts(small: Vocabulary) -> None:
    """Tool results need a function name, arguments must be a mapping, bos/eos must be given
    (Hermes, Qwen3-Coder and most checkpoints' traits): the probes and the conversion satisfy
    all three, so every turn is bridged and equals transformers' render."""
    chat = template("base")
    audit = audit_template(chat)
    assert audit.verdict is Verdict.BRIDGE_EXACT, audit.report()
    session = serve(small, chat)
    agent_session(session)
    assert_exact(session, chat)
    assert all(isinstance(r.prompt, BridgedPrompt) for _, r in session.sent)
    stats = session.renderer.stats
    assert (stats.checked, stats.mismatches, stats.kept_outputs, stats.full_renders) == (7, 0, 0, 0)
    assert all(r.notes == {} for _, r in session.sent)  # exact: nothing to record
    assert len(linearize(session.tree).samples) == 1


def test_generation_prompt_that_history_never_renders_is_refused_or_served_as_stated(
    small: Vocabulary,
) -> None:
    """Like Gemma 4's thought-channel marker: the generation prompt adds text the assistant turn
    does not have in history, so every bridged prefix differs from the template's render."""
    chat = template("gen-differs", generation=GENERATION_ADDS_EMPTY_THINKING)
    audit = audit_template(chat)
    assert audit.verdict is Verdict.BRIDGE_WITH_DEVIATION
    deviations = audit.of_kind(FindingKind.DEVIATION)
    assert {d.feature for d in deviations} == {
        "the generation prompt is not how history renders the assistant turn (after a user "
        "message)",
        "the generation prompt is not how history renders the assistant turn (after a tool "
        "message)",
    }
    assert all("<think>\\n\\n</think>" in d.detail for d in deviations)
    with pytest.raises(TemplateRefused, match="accept-deviations"):
        Renderer(small, chat)

    session = serve(small, chat, TemplateMode.ACCEPT_DEVIATIONS)
    agent_session(session)
    prompts = [r for _, r in session.sent]
    assert all(isinstance(r.prompt, BridgedPrompt) for r in prompts)
    assert all(r.notes[TEMPLATE_MODE] == "accept-deviations" for r in prompts)
    assert all(r.notes[TEMPLATE_DEVIATIONS] == audit.deviations() for r in prompts)
    # The check sees the stated deviation in every later turn, records it, and keeps bridging.
    for rendered in prompts[1:]:
        assert (
            "generation prompt is not how the template renders" in rendered.notes[PROMPT_MISMATCH]
        )
    assert session.renderer.stats.mismatches == 0
    assert session.renderer.stats.kept_outputs == 6
    # Every one is counted, with its reason, in the session's summary.
    counted = summarize(session.tree).prompt_mismatches
    assert sum(counted.values()) == 6
    assert all("generation prompt is not how the template renders" in r for r in counted)

    full = serve(small, chat, TemplateMode.FULL_RENDER)
    agent_session(full)
    assert_exact(full, chat)
    assert all(r.prompt.reason == FULL_RENDER_MODE for _, r in full.sent)  # type: ignore[union-attr]
    assert all(r.notes[TEMPLATE_MODE] == "full-render" for _, r in full.sent)


def test_tools_moved_into_the_last_user_message_need_full_renders(small: Vocabulary) -> None:
    """Like Mistral 3: the tool list sits before the last user message, so a new user message
    moves it out of an earlier one."""
    chat = template("tools-move", tools_in_system="false")
    audit = audit_template(chat)
    assert audit.verdict is Verdict.FULL_RENDER_ONLY
    assert any("moves the tool list" in f.feature for f in audit.of_kind(FindingKind.REWRITE))
    with pytest.raises(TemplateRefused, match="full-render"):
        Renderer(small, chat, RendererConfig(mode=TemplateMode.ACCEPT_DEVIATIONS))
    session = serve(small, chat, TemplateMode.FULL_RENDER)
    agent_session(session)
    assert_exact(session, chat)
    assert all(isinstance(r.prompt, FullPrompt) for _, r in session.sent)
    # The user message moved the tools: that turn's history re-renders, a new sample starts.
    assert [t.rerendered is not None for t in session.tree.turns] == [False] * 5 + [True, False]


def test_tool_results_inside_the_model_turn_need_full_renders(small: Vocabulary) -> None:
    """Like Gemma 4: tool results are rendered inside the model's turn, whose closing moves
    after them."""
    chat = template("results-in-turn", results_in_turn="true", generation=GENERATION_IN_TURN)
    audit = audit_template(chat)
    assert audit.verdict is Verdict.FULL_RENDER_ONLY
    assert any(
        "tool results inside the model's turn" in f.feature
        for f in audit.of_kind(FindingKind.REWRITE)
    )
    with pytest.raises(TemplateRefused):
        Renderer(small, chat)
    session = serve(small, chat, TemplateMode.FULL_RENDER)
    agent_session(session)
    assert_exact(session, chat)


def test_reasoning_dropped_from_earlier_turns_is_a_stated_deviation(small: Vocabulary) -> None:
    """Like Qwen3's own template: reasoning of turns before the last user message disappears.
    Bridged prompts keep the model's reasoning; the check records each such turn as kept output."""
    chat = template("drops-reasoning", reasoning_shown=REASONING_AFTER_LAST_USER_ONLY)
    audit = audit_template(chat)
    assert audit.verdict is Verdict.BRIDGE_WITH_DEVIATION
    assert any("drops the reasoning" in f.feature for f in audit.of_kind(FindingKind.DEVIATION))
    with pytest.raises(TemplateRefused):
        Renderer(small, chat)
    session = serve(small, chat, TemplateMode.ACCEPT_DEVIATIONS)
    agent_session(session)
    *before, (after_user_prompt, after_user) = session.sent[:6]
    assert_exact(ChatSession(session.renderer, small, sent=before), chat)  # reasoning still shown
    assert after_user.ids.tolist() != reference_ids(small, chat.source, after_user_prompt)
    assert "output is kept verbatim" in after_user.notes[OUTPUT_KEPT]
    assert PROMPT_MISMATCH not in after_user.notes
    assert summarize(session.tree).prompt_mismatches == {}
    assert sum(summarize(session.tree).outputs_kept.values()) >= 1
    assert isinstance(after_user.prompt, BridgedPrompt)
    assert session.renderer.stats.mismatches == 0


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[datetime]:
    """The time both renderers read: ours (``datetime.now`` at a session's start) and
    transformers' (``strftime_now``), set by the test."""
    now = [datetime(2025, 3, 1, 23, 59, 58)]

    class Clock(datetime):
        @classmethod
        def now(cls, tz: object = None) -> Clock:
            return cls.fromtimestamp(now[0].timestamp())

    monkeypatch.setattr("protocol_adapters._bridge.renderer.datetime", Clock)
    monkeypatch.setattr(hf_templates, "datetime", Clock)
    return now


def test_the_date_is_frozen_per_session(small: Vocabulary, clock: list[datetime]) -> None:
    """Like Llama 3.1's system prompt: the date comes from strftime_now. A session crossing
    midnight keeps its start date in every turn (the bridge stays exact), a new session gets
    the new date."""
    chat = template("dated", system_extra=TODAY)
    audit = audit_template(chat)
    assert audit.time_dependent
    assert audit.verdict is Verdict.BRIDGE_EXACT  # once the clock is frozen
    renderer = Renderer(small, chat, RendererConfig(check_sample_rate=1.0))
    session = ChatSession(renderer, small)
    reply = session.turn(
        [Message.text("system", "s"), Message.text("user", "go")], output(commands=["ls"])
    )
    clock[0] = datetime(2025, 3, 2, 0, 0, 5)  # midnight passes
    session.turn(results(reply, "a.py"), output("done"))
    clock[0] = datetime(2025, 3, 1, 23, 59, 58)  # transformers renders with the session's time
    assert_exact(session, chat)
    assert all(r.notes[TEMPLATE_CLOCK] == "2025-03-01T23:59:58" for _, r in session.sent)
    assert all(isinstance(r.prompt, BridgedPrompt) for _, r in session.sent)
    assert renderer.stats.mismatches == 0

    clock[0] = datetime(2025, 3, 2, 0, 0, 5)
    other = ChatSession(renderer, small)
    other.turn([Message.text("system", "s"), Message.text("user", "go")], output("hi"))
    assert small.decode(other.sent[0][1].ids).count("Today is 2025-03-02.") == 1


def test_a_template_that_allows_system_messages_only_first(small: Vocabulary) -> None:
    """Like Mistral 3 and others: the probes never put a system message second, so the bridge
    serves such a template exactly; a request with a later system message is refused in the
    client's error shape with the template's own words."""
    chat = template("system-first", later_system=SYSTEM_FIRST_ONLY)
    audit = audit_template(chat)
    assert audit.verdict is Verdict.BRIDGE_EXACT
    (limit,) = audit.of_kind(FindingKind.LIMIT)
    assert limit.feature == "refuses system messages after the first"
    session = serve(small, chat)
    agent_session(session)
    assert_exact(session, chat)
    with pytest.raises(AdapterError, match="system messages must come first"):
        session.turn([Message.text("system", "hurry"), Message.text("user", "go on")], "ok")


def test_a_template_that_refuses_parallel_calls(small: Vocabulary) -> None:
    """Like Llama 3.1's JSON template: one call per turn. Single calls are bridged exactly; after
    a reply with two calls the next request is refused with the template's words, although the
    bridge itself would never render that reply."""
    chat = template("one-call", calls_check=ONE_CALL_PER_TURN)
    audit = audit_template(chat)
    assert audit.verdict is Verdict.BRIDGE_EXACT
    assert not audit.parallel_calls
    session = serve(small, chat)
    agent_session(session)
    assert_exact(session, chat)
    reply = session.turn([Message.text("user", "Two at once.")], output(commands=["ls", "pwd"]))
    with pytest.raises(AdapterError, match="only one tool call per turn") as refused:
        session.turn(results(reply, "a", "b"), "ok")
    assert str(refused.value).startswith(
        "the chat template refuses assistant turns with several tool calls"
    )


def test_a_header_appended_to_every_render_needs_full_renders(small: Vocabulary) -> None:
    """Like Phi-4-mini: the assistant header ends every render, even without
    add_generation_prompt, and the next message replaces it."""
    chat = template("always-header", generation=ALWAYS_ASSISTANT_HEADER)
    audit = audit_template(chat)
    assert audit.verdict is Verdict.FULL_RENDER_ONLY
    assert any("ends every render" in f.feature for f in audit.of_kind(FindingKind.REWRITE))
    session = serve(small, chat, TemplateMode.FULL_RENDER)
    agent_session(session)
    assert_exact(session, chat)


def test_a_mismatch_the_audit_cannot_foresee_is_caught_recorded_and_rendered_in_full(
    small: Vocabulary,
) -> None:
    """A request option the audit did not try changes the generation prompt (our Qwen3-style
    template with enable_thinking=false adds an empty think block history never shows): the
    whole-prompt check catches it at the next turn, that turn is rendered in full, and the
    reason is in the turn's notes."""
    renderer = Renderer(small, qwen3_template(), RendererConfig(check_sample_rate=1.0))
    options = {"enable_thinking": "false"}
    tree = SessionTree()
    first = Prompt((Message.text("user", "hi"),), (), options)
    route = tree.route(first)
    rendered = renderer.render(route)
    assert isinstance(rendered.prompt, BridgedPrompt)
    ids = [*small.encode("hello"), small.token_id("<|im_end|>")]
    completion = Completion(ids, [-1.0] * len(ids), FinishReason.STOP)
    reply = Message.text("assistant", "hello")
    tree.record(route, rendered.prompt, completion, reply)
    later = Prompt((*first.messages, reply, Message.text("user", "again")), (), options)
    second = renderer.render(tree.route(later))
    assert isinstance(second.prompt, FullPrompt)
    assert second.prompt.reason == FAILED_CHECK
    assert "turn 0's generation prompt" in second.notes[PROMPT_MISMATCH]
    assert renderer.stats.mismatches == 1
    # That session's option decides nothing for another session: its turns still bridge.
    other = SessionTree()
    plain = Prompt((Message.text("user", "hi"),), ())
    first_other = other.route(plain)
    opened = renderer.render(first_other)
    other.record(first_other, opened.prompt, completion, reply)
    follow = renderer.render(
        other.route(Prompt((*plain.messages, reply, Message.text("user", "x"))))
    )
    assert isinstance(follow.prompt, BridgedPrompt)
    assert PROMPT_MISMATCH not in follow.notes


ARGUMENTS_AS_THEY_COME = (
    '{%- for c in m.tool_calls or [] %}{{- \'<tool_call>\\n{"name": "\' + c.function.name }}'
    "{{- '\", \"arguments\": ' + c.function.arguments + '}\\n</tool_call>' }}{%- endfor %}"
)


def test_a_template_that_concatenates_arguments_is_unusable_as_the_engines_find_it() -> None:
    """``'...' + arguments`` needs the JSON text, but SGLang and vLLM pass every template the
    decoded mapping: their chat endpoints fail on any conversation with a call, and so does the
    audit (the adapter passes no template text the deployed engines never give it)."""
    source = trait_template().replace(
        "{%- for c in m.tool_calls or [] %}", ARGUMENTS_AS_THEY_COME + "{%- for c in [] %}"
    )
    audit = audit_template(ChatTemplate("concatenated-arguments", source, SPECIAL))
    assert audit.verdict is Verdict.UNUSABLE
    (fatal,) = audit.of_kind(FindingKind.FATAL)
    assert "refuses an ordinary agent conversation" in fatal.feature
    assert "can only concatenate str" in fatal.detail


def test_a_probe_the_template_refuses_falls_back_to_a_counted_full_render(
    small: Vocabulary,
) -> None:
    """A template may refuse one of the bridge's probes while accepting the real request (here:
    a user message reading "base" right after an assistant turn, what the probe for "after an
    assistant reply" renders). The audit says so; that request is rendered in full and counted,
    exactly, never an error."""
    refuses_probe = trait_template().replace(
        "{{- '<|im_start|>user\\n' }}",
        "{%- if messages[0].content == 'base' and messages | length == 3 %}"
        "{{- raise_exception('no probes here') }}{%- endif %}{{- '<|im_start|>user\\n' }}",
    )
    chat = ChatTemplate("refuses-a-probe", refuses_probe, SPECIAL)
    audit = audit_template(chat)
    assert audit.verdict is Verdict.BRIDGE_EXACT
    assert any("refuses the bridge's probe" in f.feature for f in audit.of_kind(FindingKind.LIMIT))
    session = ChatSession(Renderer(small, chat, RendererConfig(check_sample_rate=1.0)), small)
    session.turn([Message.text("system", "s"), Message.text("user", "go")], output("hi"))
    session.turn([Message.text("user", "and then")], output("done"))
    assert_exact(session, chat)
    assert [type(r.prompt) for _, r in session.sent] == [BridgedPrompt, FullPrompt]
    assert session.renderer.stats.fallbacks == {PROBE_REFUSED: 1}


def test_every_turn_compares_the_previous_reply_with_the_templates_rendering_of_it(
    small: Vocabulary,
) -> None:
    """Without sampled checks (rate 0), each bridged turn still compares the reply before it,
    as sent and generated, with the template's rendering of that reply in history: nothing to
    record for an exact template, a note on every turn for an accepted deviation, a full render
    for a difference in the template's own text."""
    unchecked = RendererConfig(check_sample_rate=0.0)
    exact = ChatSession(Renderer(small, template("base"), unchecked), small)
    agent_session(exact)
    assert all(PROMPT_MISMATCH not in r.notes for _, r in exact.sent)
    assert all(OUTPUT_KEPT not in r.notes for _, r in exact.sent)
    assert exact.renderer.stats.kept_outputs == 0

    deviating = template("gen-differs", generation=GENERATION_ADDS_EMPTY_THINKING)
    config = RendererConfig(check_sample_rate=0.0, mode=TemplateMode.ACCEPT_DEVIATIONS)
    session = ChatSession(Renderer(small, deviating, config), small)
    agent_session(session)
    noted = [r.notes.get(PROMPT_MISMATCH, "") for _, r in session.sent]
    assert noted[0] == ""
    assert all("generation prompt is not how the template renders" in n for n in noted[1:])
    assert sum(summarize(session.tree).prompt_mismatches.values()) == 6

    renderer = Renderer(small, qwen3_template(), unchecked)
    options = {"enable_thinking": "false"}
    tree = SessionTree()
    first = Prompt((Message.text("user", "hi"),), (), options)
    route = tree.route(first)
    rendered = renderer.render(route)
    ids = [*small.encode("hello"), small.token_id("<|im_end|>")]
    reply = Message.text("assistant", "hello")
    tree.record(
        route, rendered.prompt, Completion(ids, [-1.0] * len(ids), FinishReason.STOP), reply
    )
    later = Prompt((*first.messages, reply, Message.text("user", "again")), (), options)
    second = renderer.render(tree.route(later))
    assert isinstance(second.prompt, FullPrompt)
    assert "turn 0's generation prompt" in second.notes[PROMPT_MISMATCH]


ASSISTANT_HEADER = "{{- '<|im_start|>assistant\\n' }}"
HEADER_NAMES_THE_ROLE_BEFORE = "{{- '<|im_start|>assistant after ' + loop.previtem.role + '\\n' }}"
GENERATION_NAMES_THE_LAST_ROLE = (
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant after ' + messages[-1].role + '\\n' }}{%- endif %}"
)


@pytest.mark.parametrize("mode", [TemplateMode.EXACT, TemplateMode.FULL_RENDER])
@pytest.mark.parametrize("rate", [0.0, 1.0])
def test_the_generation_prompt_is_the_one_after_the_last_messages_role(
    small: Vocabulary, mode: TemplateMode, rate: float
) -> None:
    """The assistant header names the role it follows, in history and in the generation
    prompt alike (bridge-exact): a turn ending on a tool result gets a different generation
    prompt from one ending on a user message, and each is sent and recorded as such."""
    source = trait_template(generation=GENERATION_NAMES_THE_LAST_ROLE)
    assert source.count(ASSISTANT_HEADER) == 1
    chat = ChatTemplate(
        "role-aware", source.replace(ASSISTANT_HEADER, HEADER_NAMES_THE_ROLE_BEFORE), SPECIAL
    )
    assert audit_template(chat).verdict is Verdict.BRIDGE_EXACT
    config = RendererConfig(check_sample_rate=rate, mode=mode)
    session = ChatSession(Renderer(small, chat, config), small)
    agent_session(session)
    assert_exact(session, chat)
    for prompt, rendered in session.sent:
        header = small.encode(f"<|im_start|>assistant after {prompt.messages[-1].role}\n")
        assert rendered.ids.tolist()[len(rendered.ids) - len(header) :] == header
        if isinstance(rendered.prompt, BridgedPrompt):
            assert list(rendered.prompt.generation_prompt) == header
        else:
            assert rendered.prompt.generation_prompt_length == len(header)
    lasts = [prompt.messages[-1].role for prompt, _ in session.sent]
    assert {"user", "tool"} <= set(lasts)
    stats = session.renderer.stats
    if mode is TemplateMode.EXACT:
        assert (stats.bridged, stats.mismatches, stats.full_renders) == (7, 0, 0)


def bridged(rendered: RenderedPrompt) -> BridgedPrompt:
    assert isinstance(rendered.prompt, BridgedPrompt)
    return rendered.prompt


def labels(small: Vocabulary, rendered: RenderedPrompt) -> list[tuple[str, LossReason]]:
    return [(small.decode(s.ids), s.reason) for s in bridged(rendered).segments]


def labelled_session(small: Vocabulary, chat: ChatTemplate) -> ChatSession:
    """Three turns: parallel calls whose second result is empty, then a result, a system note,
    an assistant message the client wrote and a user message in one request."""
    session = serve(small, chat)
    reply = session.turn([Message.text("user", "The test fails.")], output(commands=["ls", "pwd"]))
    reply = session.turn(results(reply, "a.py x.py", ""), output("Noted.", commands=["pytest"]))
    session.turn(
        [
            *results(reply, "1 failed"),
            Message.text("system", "Hurry."),
            Message.text("assistant", "I wrote this."),
            Message.text("user", "go"),
        ],
        output("ok"),
    )
    assert_exact(session, chat)
    return session


TOOLS_BLOCK = (
    '{"type": "function", "function": {"name": "bash", "description": "Run a shell command.", '
    '"parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}'
)
SCAFFOLD, CONTEXT, TOOL_OUTPUT = (
    LossReason.TEMPLATE_SCAFFOLD,
    LossReason.CONTEXT,
    LossReason.TOOL_OUTPUT,
)


def test_every_masked_prompt_span_has_its_exact_reason(small: Vocabulary) -> None:
    """Role headers and closing tags are scaffold, message content is context or tool output;
    template text longer than a scaffold (the tools block before the first message) is context;
    an empty result is all scaffold; an assistant message the client wrote is context whole."""
    session = labelled_session(small, template("base"))
    first, second, third = (r for _, r in session.sent)
    assert labels(small, first) == [
        (
            f"<|endoftext|><|im_start|>system\n\n{TOOLS_BLOCK}<|im_end|>\n<|im_start|>user\n"
            "The test fails.",
            CONTEXT,
        ),
        ("<|im_end|>\n", SCAFFOLD),
    ]
    assert labels(small, second) == [
        ("\n", SCAFFOLD),
        ("<|im_start|>user\n<tool_response>\n", SCAFFOLD),
        ("a.py x.py", TOOL_OUTPUT),
        (
            "\n</tool_response><|im_end|>\n<|im_start|>user\n<tool_response>\n\n"
            "</tool_response><|im_end|>\n",
            SCAFFOLD,
        ),
    ]
    assert labels(small, third) == [
        ("\n", SCAFFOLD),
        ("<|im_start|>user\n<tool_response>\n", SCAFFOLD),
        ("1 failed", TOOL_OUTPUT),
        ("\n</tool_response><|im_end|>\n<|im_start|>system\n", SCAFFOLD),
        ("Hurry.", CONTEXT),
        ("<|im_end|>\n", SCAFFOLD),
        ("<|im_start|>assistant\nI wrote this.<|im_end|>\n", CONTEXT),
        ("<|im_start|>user\n", SCAFFOLD),
        ("go", CONTEXT),
        ("<|im_end|>\n", SCAFFOLD),
    ]
    # the tree keeps each span with its reason: the sample masks exactly those tokens as such
    (sample,) = linearize(session.tree).samples
    prompts = [bridged(r) for r in (first, second, third)]
    generation = sum(len(p.generation_prompt) for p in prompts)
    for reason in (SCAFFOLD, CONTEXT, TOOL_OUTPUT):
        counted = sum(len(s.ids) for p in prompts for s in p.segments if s.reason is reason)
        assert sample.masked_tokens()[reason] == counted + (generation if reason is SCAFFOLD else 0)


RESULTS_ANSWER_CALLS = (
    "{%- set found = namespace(call=false) %}"
    "{%- for x in messages %}{%- for c in x.tool_calls or [] %}"
    "{%- if c.id == m.tool_call_id %}{%- set found.call = true %}{%- endif %}"
    "{%- endfor %}{%- endfor %}"
    "{%- if not found.call %}{{- raise_exception('a tool result must answer a call') }}"
    "{%- endif %}"
)


def test_labels_are_coarse_when_the_template_refuses_a_label_probe(small: Vocabulary) -> None:
    """A template that refuses a tool result answering no call of its conversation refuses the
    probe that renders a second parallel result alone: the turn is still bridged exactly, its
    new messages labelled as one span: tool output when they are all results, else context."""
    source = trait_template()
    branch = "{%- elif m.role == 'tool' %}"
    assert source.count(branch) == 1
    chat = ChatTemplate(
        "results-answer-calls", source.replace(branch, branch + RESULTS_ANSWER_CALLS), SPECIAL
    )
    session = serve(small, chat)
    reply = session.turn([Message.text("user", "go")], output(commands=["ls", "pwd"]))
    reply = session.turn(results(reply, "a.py", "/src"), output(commands=["cat a.py", "ls /"]))
    session.turn([*results(reply, "x = 1", "bin"), Message.text("user", "and?")], output("done"))
    assert_exact(session, chat)
    _, both_results, results_and_user = (r for _, r in session.sent)
    assert labels(small, both_results) == [
        ("\n", SCAFFOLD),
        (
            "<|im_start|>user\n<tool_response>\na.py\n</tool_response><|im_end|>\n"
            "<|im_start|>user\n<tool_response>\n/src\n</tool_response><|im_end|>\n",
            TOOL_OUTPUT,
        ),
    ]
    assert labels(small, results_and_user) == [
        ("\n", SCAFFOLD),
        (
            "<|im_start|>user\n<tool_response>\nx = 1\n</tool_response><|im_end|>\n"
            "<|im_start|>user\n<tool_response>\nbin\n</tool_response><|im_end|>\n"
            "<|im_start|>user\nand?<|im_end|>\n",
            CONTEXT,
        ),
    ]
    assert session.renderer.stats.mismatches == 0


USER_HEADER = "{{- '<|im_start|>user\\n' }}"


@pytest.mark.parametrize(
    ("length", "reason"), [(MAX_SCAFFOLD_CHARS, SCAFFOLD), (MAX_SCAFFOLD_CHARS + 1, CONTEXT)]
)
def test_template_text_longer_than_a_scaffold_is_context(
    small: Vocabulary, length: int, reason: LossReason
) -> None:
    """A user header of 64 characters is scaffold; one character more and it is context, like
    a system prompt or a tools block the template writes around a message."""
    assert MAX_SCAFFOLD_CHARS == 64
    header = "<|im_start|>user" + "~" * (length - len("<|im_start|>user\n")) + "\n"
    assert len(header) == length
    source = trait_template()
    assert source.count(USER_HEADER) == 1
    written = "{{- '" + header.removesuffix("\n") + "\\n' }}"  # a jinja2 string literal
    chat = ChatTemplate("long-user-header", source.replace(USER_HEADER, written), SPECIAL)
    session = serve(small, chat)
    session.turn([Message.text("user", "go")], output("hi"))
    session.turn([Message.text("user", "more")], output("ok"))
    assert_exact(session, chat)
    spans = (
        [(header, SCAFFOLD), ("more", CONTEXT)]
        if reason is SCAFFOLD
        else [(header + "more", CONTEXT)]
    )
    assert labels(small, session.sent[1][1]) == [
        ("\n", SCAFFOLD),
        *spans,  # neighbours with one reason are one span
        ("<|im_end|>\n", SCAFFOLD),
    ]


def test_the_templates_renders_per_turn_do_not_depend_on_the_call_ids(
    small: Vocabulary, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Probes are cached by message kind, with probe call ids: real ids change every turn, so a
    cache keyed by them would render the probes again on every turn. A session whose calls get
    fresh ids renders the template as often per turn as one whose ids repeat."""
    renders: list[str] = []
    render_raw = ChatTemplate.render_raw

    def counted(self: ChatTemplate, *args: Any, **kwargs: Any) -> str:
        renders.append(self.name)
        return render_raw(self, *args, **kwargs)

    monkeypatch.setattr(ChatTemplate, "render_raw", counted)

    def renders_per_turn(call_id: Callable[[], str] | None) -> list[int]:
        renderer = Renderer(small, template("base"), RendererConfig(check_sample_rate=0.0))
        session = ChatSession(renderer, small)
        if call_id is not None:
            session.call_id = call_id
        reply = session.turn([Message.text("user", "go")], output("start", commands=["ls", "pwd"]))
        counts = []
        for i in range(3):
            before = len(renders)
            new = results(reply, f"a{i}", f"b{i}")
            reply = session.turn(new, output(f"step {i}", commands=["ls", "pwd"]))
            counts.append(len(renders) - before)
        assert_exact(session, template("base"))
        return counts

    fresh = renders_per_turn(None)
    assert fresh == renders_per_turn(itertools.cycle(["call_a", "call_b"]).__next__)
    assert fresh[1:] == fresh[1:2] * 2, "a steady cost per turn"


TOOL_RESULT_OPENING = "{{- '<|im_start|>user\\n<tool_response>\\n' + m.content }}"
NAMING_RESULTS = "{{- '<|im_start|>user\\n<tool_response from=' + m.name + '>\\n' + m.content }}"
READ = ToolSpec("read", "Read a file.", '{"type": "object"}')


def call_output(name: str, arguments: dict[str, str]) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def test_a_tool_result_is_named_after_the_call_it_answers_wherever_that_call_is(
    small: Vocabulary,
) -> None:
    """A template that prints each result's function name: a result is named after its call,
    whether that call is in the same request (a call the client wrote), in the reply just
    before, or back in the conversation's first message; every prompt is bridged and equals
    the template's render."""
    source = trait_template()
    assert source.count(TOOL_RESULT_OPENING) == 1
    chat = ChatTemplate(
        "naming-results", source.replace(TOOL_RESULT_OPENING, NAMING_RESULTS), SPECIAL
    )
    renderer = Renderer(small, chat, RendererConfig(check_sample_rate=0.0))
    session = ChatSession(renderer, small, tools=(*TOOLS, READ))
    opening = Message("assistant", (ToolCall("call_0", "read", '{"path": "notes"}'),))
    reply = session.turn(
        [opening, Message.text("user", "go")], call_output("bash", {"command": "ls"})
    )
    reply = session.turn(results(reply, "a.py"), call_output("read", {"path": "a.py"}))
    session.turn([*results(reply, "x = 1"), Message.text("user", "ok?")], output("Noted."))
    client_call = Message("assistant", (ToolCall("call_c", "bash", '{"command": "pwd"}'),))
    session.turn([client_call, *results(client_call, "/src")], output("Fine."))
    late = Message("tool", (Text("notes: none"),), tool_call_id="call_0")
    session.turn([late], output("Done."))
    assert_exact(session, chat)
    assert renderer.stats.full_renders == 0
    named = {
        (m["tool_call_id"], m["name"])
        for prompt, _ in session.sent
        for m in template_messages(prompt.messages)
        if m["role"] == "tool"
    }
    assert named == {
        (session.messages[2].tool_calls[0].id, "bash"),
        (session.messages[4].tool_calls[0].id, "read"),
        ("call_c", "bash"),
        ("call_0", "read"),
    }


def test_a_request_following_a_lone_leading_system_prompt_is_bridged(small: Vocabulary) -> None:
    """A first request held only the system prompt; the next starts over from it with a user
    message. The bridge renders that message after a probe that opens with a system prompt,
    as the real one does: a template refusing system messages anywhere else accepts it."""
    chat = template("system-first", later_system=SYSTEM_FIRST_ONLY)
    session = serve(small, chat)
    system = Message.text("system", "You fix bugs.")
    session.turn([system], output("Ready."))
    session.messages[:] = [system]
    session.turn([Message.text("user", "The test fails.")], output("Looking."))
    assert_exact(session, chat)
    _, restart = session.sent[-1]
    assert isinstance(restart.prompt, BridgedPrompt)
    assert session.renderer.stats.full_renders == 0


AFTER_TEXT_OR_CALL = (
    "{{- '<|im_start|>user\\n' + ('after text ' if loop.previtem.content else '')"
    " + '<tool_response>\\n' + m.content }}"
)


def test_results_rendered_by_whether_the_call_came_with_text_are_bridged(
    small: Vocabulary,
) -> None:
    """The template writes a result differently after a reply with text than after a call
    alone: the probe before the results has text exactly when the real reply has."""
    source = trait_template().replace(TOOL_RESULT_OPENING, AFTER_TEXT_OR_CALL)
    chat = ChatTemplate("after-text-or-call", source, SPECIAL)
    session = serve(small, chat)
    reply = session.turn([Message.text("user", "go")], output("Let me look.", commands=["ls"]))
    reply = session.turn(results(reply, "a.py"), output(commands=["cat a.py"]))
    session.turn(results(reply, "x = 1"), output("Done."))
    assert_exact(session, chat)
    stats = session.renderer.stats
    assert (stats.bridged, stats.mismatches, stats.full_renders) == (3, 0, 0)


USER_CLOSING = "{{- m.content + '<|im_end|>\\n' }}"
OPEN_LAST_USER = (
    "{{- m.content + ('' if add_generation_prompt and loop.last else '<|im_end|>\\n') }}"
)


def test_a_generation_prompt_that_is_not_an_append_is_history_in_a_full_render(
    small: Vocabulary,
) -> None:
    """The template leaves the last user message open when it generates: what it adds is not
    an append, so a full render counts all of its text as history (no generation prompt)."""
    source = trait_template()
    assert source.count(USER_CLOSING) == 1
    chat = ChatTemplate("open-last-user", source.replace(USER_CLOSING, OPEN_LAST_USER), SPECIAL)
    assert audit_template(chat).verdict is Verdict.FULL_RENDER_ONLY
    session = serve(small, chat, TemplateMode.FULL_RENDER)
    session.turn([Message.text("user", "go")], output("hi"))
    session.turn([Message.text("user", "more")], output("ok"))
    assert_exact(session, chat)
    for _, rendered in session.sent:
        assert isinstance(rendered.prompt, FullPrompt)
        assert rendered.prompt.generation_prompt_length == 0


NAME_REQUIRED = (
    "{%- if m.name is not defined %}\n"
    "            {{- raise_exception('a tool result needs the name of its function') }}\n"
    "        {%- endif %}"
)


def test_a_reasoning_dropping_template_notes_the_first_reply_it_drops(small: Vocabulary) -> None:
    """A template whose one trait is dropping earlier reasoning once a user message follows:
    the very next prompt keeps the first reply's reasoning as generated, and says so."""
    source = trait_template(reasoning_shown=REASONING_AFTER_LAST_USER_ONLY)
    assert source.count(NAME_REQUIRED) == 1
    chat = ChatTemplate("drops-reasoning-only", source.replace(NAME_REQUIRED, ""), SPECIAL)
    audit = audit_template(chat)
    assert [f.kind for f in audit.findings] == [FindingKind.DEVIATION]
    config = RendererConfig(check_sample_rate=0.0, mode=TemplateMode.ACCEPT_DEVIATIONS)
    session = ChatSession(Renderer(small, chat, config), small)
    session.turn([Message.text("user", "go")], output("hi", "plan it"))
    session.turn([Message.text("user", "more")], output("ok"))
    (_, first), (_, second) = session.sent
    assert OUTPUT_KEPT not in first.notes
    assert second.notes[OUTPUT_KEPT] == REASONING_KEPT


def test_labels_find_content_past_its_header_and_size_the_text_after_it(small: Vocabulary) -> None:
    """A message whose words are its own header's ("user") is found after the header, not in
    it; the short closing after a long message is scaffold, whatever the message's length."""
    session = serve(small, template("base"))
    session.turn([Message.text("user", "go")], output("hi"))
    session.turn([Message.text("user", "user")], output("ok"))
    long = "a long message " * 6
    session.turn([Message.text("user", long)], output("fine"))
    assert_exact(session, template("base"))
    _, named_like_its_header, lengthy = (r for _, r in session.sent)
    for rendered, words in ((named_like_its_header, "user"), (lengthy, long)):
        assert labels(small, rendered) == [
            ("\n", SCAFFOLD),
            ("<|im_start|>user\n", SCAFFOLD),
            (words, CONTEXT),
            ("<|im_end|>\n", SCAFFOLD),
        ]


LONG_RESULT_TAG = "<tool_response " + "~" * 60 + ">"


def test_template_text_longer_than_a_scaffold_before_a_result_is_tool_output(
    small: Vocabulary,
) -> None:
    """Long template text before a tool result takes the result's reason, as long text before
    any message after the first takes that message's."""
    opening = TOOL_RESULT_OPENING.replace("<tool_response>", LONG_RESULT_TAG)
    chat = ChatTemplate(
        "long-result-tag", trait_template().replace(TOOL_RESULT_OPENING, opening), SPECIAL
    )
    session = serve(small, chat)
    reply = session.turn([Message.text("user", "go")], output(commands=["ls"]))
    session.turn(results(reply, "a.py"), output("ok"))
    assert_exact(session, chat)
    assert labels(small, session.sent[1][1]) == [
        ("\n", SCAFFOLD),
        (f"<|im_start|>user\n{LONG_RESULT_TAG}\na.py", TOOL_OUTPUT),
        ("\n</tool_response><|im_end|>\n", SCAFFOLD),
    ]


COMPACT_LS = '<tool_call>\n{"name":"bash","arguments":{"command":"ls"}}\n</tool_call>'


def test_the_first_reply_is_compared_after_the_message_it_answers(small: Vocabulary) -> None:
    """The assistant header names the role before it: the first reply (the second message) is
    rendered after a probe ending like the first message, so the unchecked comparison finds
    only what the model wrote unlike the template (compact JSON), not a header."""
    source = trait_template(generation=GENERATION_NAMES_THE_LAST_ROLE)
    chat = ChatTemplate(
        "role-aware", source.replace(ASSISTANT_HEADER, HEADER_NAMES_THE_ROLE_BEFORE), SPECIAL
    )
    session = ChatSession(Renderer(small, chat, RendererConfig(check_sample_rate=0.0)), small)
    reply = session.turn([Message.text("user", "go")], COMPACT_LS)
    session.turn(results(reply, "a.py"), output("ok"))
    rendered = session.sent[-1][1]
    assert isinstance(rendered.prompt, BridgedPrompt)
    assert rendered.notes[OUTPUT_KEPT].startswith("turn 0's output is kept verbatim")


CITING_USER_HEADER = (
    "{{- '<|im_start|>user' + ((' re ' + messages[0].content) if cite is defined and cite"
    " else '') + '\\n' }}"
)
BLANK_LINE_USER_HEADER = "{{- '\\n<|im_start|>user\\n' }}"


def second_turn(small: Vocabulary, chat: ChatTemplate, **options: str) -> RenderedPrompt:
    """The prompt of a second user message after a first reply, checked against a full render."""
    renderer = Renderer(small, chat, RendererConfig(check_sample_rate=1.0))
    tree = SessionTree()
    first = Prompt((Message.text("user", "fix it"),), (), options)
    route = tree.route(first)
    rendered = renderer.render(route)
    assert isinstance(rendered.prompt, BridgedPrompt)
    ids = [*small.encode("done"), small.token_id("<|im_end|>")]
    reply = Message.text("assistant", "done")
    completion = Completion(ids, [-0.1] * len(ids), FinishReason.STOP)
    tree.record(route, rendered.prompt, completion, reply)
    later = Prompt((*first.messages, reply, Message.text("user", "again")), (), options)
    second = renderer.render(tree.route(later))
    assert isinstance(second.prompt, FullPrompt)
    assert second.prompt.reason == FAILED_CHECK
    assert second.ids.tolist() == reference_ids(small, chat.source, later, SPECIAL, **options)
    return second


@pytest.mark.parametrize(
    ("header", "options", "reason"),
    [
        pytest.param(
            CITING_USER_HEADER,
            {"cite": "true"},
            "the new messages or the closing before them differ from the full render's end",
            id="text",
        ),
        pytest.param(
            BLANK_LINE_USER_HEADER,
            {},
            "the new messages tokenize differently at the end of the full render",
            id="tokens",
        ),
    ],
)
def test_the_check_names_new_messages_the_bridge_got_wrong(
    small: Vocabulary, header: str, options: dict[str, str], reason: str
) -> None:
    """Two faults in the new messages the audit cannot see: a header quoting the first message
    under an option it never tries (the probe's first message is not the real one), and a
    header opening with a newline that merges, in the template's own encoding, with the
    newline owed after the previous reply. The turn is rendered in full, and its note says
    which."""
    source = trait_template()
    assert source.count(USER_HEADER) == 1
    chat = ChatTemplate("faulty-user-header", source.replace(USER_HEADER, header), SPECIAL)
    assert audit_template(chat).verdict is Verdict.BRIDGE_EXACT
    second = second_turn(small, chat, **options)
    assert second.notes[PROMPT_MISMATCH].startswith(reason)
