"""Chat-template traits of published model families, reproduced in templates written here, each
audited and served: exact where the bridge can be exact, otherwise refused loudly at start or
served only in a mode the user chose, with every turn recording it.

Every prompt a session sends is compared with transformers' own render of the same conversation
(``apply_chat_template(tokenize=True)``), with the renderer's check at rate 1.0.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest
import transformers.utils.chat_template_utils as hf_templates

from protocol_adapters._rendering import (
    ChatTemplate,
    FindingKind,
    Renderer,
    RendererConfig,
    TemplateMode,
    TemplateRefused,
    Verdict,
    audit_template,
    qwen3_template,
)
from protocol_adapters._rendering.renderer import (
    FAILED_CHECK,
    FULL_RENDER_MODE,
    OUTPUT_KEPT,
    PROBE_REFUSED,
    PROMPT_MISMATCH,
    TEMPLATE_CLOCK,
    TEMPLATE_DEVIATIONS,
    TEMPLATE_MODE,
)
from protocol_adapters._tokenizer import Vocabulary
from protocol_adapters._types import AdapterError
from trajectory_tree import (
    BridgedPrompt,
    Completion,
    FinishReason,
    FullPrompt,
    Message,
    Prompt,
    SessionTree,
    linearize,
    summarize,
)

from .template_session import (
    SPECIAL,
    ChatSession,
    agent_session,
    output,
    reference_ids,
    results,
    trait_template,
)

SMALL = Path(__file__).parent / "fixtures" / "small_tokenizer.json"

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
        assert rendered.ids == expected, f"turn {index}"


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
    assert after_user.ids != reference_ids(small, chat.source, after_user_prompt)
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

    monkeypatch.setattr("protocol_adapters._rendering.renderer.datetime", Clock)
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
    with pytest.raises(AdapterError, match="only one tool call per turn"):
        session.turn(results(reply, "a", "b"), "ok")


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
