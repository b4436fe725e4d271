"""The template audit: can the bridge serve this chat template exactly, and if not, why.

Run once when a renderer is built (and by ``protocol-adapters check-template``). It drives
coding-agent conversations (:mod:`.scenarios`) through the template, with and without tools, and
simulates the bridge on them turn by turn, at the text level: each request's bridged text (the
template's render of the history so far, the new messages rendered after a probe, the generation
prompt) is compared with the template's own render of that request. It asks:

- for each message that can precede an assistant turn, is the generation prompt a prefix of that
  assistant turn as history renders it (else every bridged prompt carries text history never
  repeats: a deviation);
- does a later message rewrite or move earlier text (the tool list moved into the last user
  message, reasoning dropped, tool results folded into the model's turn, a header every render
  ends with): a rewrite, only full renders give the template's prompts;
- does rendering depend on the clock (``strftime_now``): the renderer then freezes it per session;
- which conversations it refuses (several tool calls in one turn, a system message after the
  first), whether it needs tool results named after their call, and whether it drops what the
  model must see (unusable).

The simulated model output of each turn is the template's own rendering of that reply, so the
audit judges the template, not a model; what a real model writes differently is the runtime
check's business (:mod:`.check`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache

from protocol_adapters._template.context import NotAnAppend, Slot, TemplateContext, bridge_text
from protocol_adapters._template.messages import (
    ToolResultNames,
    call_names,
    template_messages,
    template_tools,
)
from protocol_adapters._template.template import ChatTemplate, TemplateError
from trajectory_tree import Message, Prompt, ToolCall, ToolSpec

from .diagnosis import (
    common_prefix,
    describe,
    excerpt,
    generation_differs,
    rewrite,
    unclosed,
)
from .scenarios import (
    ARGUMENT_VALUE,
    CALL_A,
    CALL_B,
    TOOLS,
    agent,
    arguments_probe,
    marker,
    parallel_calls,
    system_note,
)
from .verdict import (
    PARALLEL_CALLS_REFUSED,
    REASONING_NEVER_RENDERED,
    Finding,
    FindingKind,
    TemplateAudit,
)

AUDIT_NOW = datetime(2024, 7, 26, 9, 30, 0)
"""The clock every audit render sees, so that findings never depend on when the audit ran."""
LATER_NOW = datetime(2031, 12, 13, 23, 59, 59)
"""A second clock: a template whose text changes between the two prints the time."""

SYSTEM_NOTES_REFUSED = "refuses system messages after the first"


def audit_template(template: ChatTemplate) -> TemplateAudit:
    """The audit of ``template`` (cached per source and variables: building many renderers for
    one template audits it once)."""
    return _audit(template.name, template.source, tuple(sorted(template.variables.items())))


@lru_cache(maxsize=32)
def _audit(name: str, source: str, variables: tuple[tuple[str, object], ...]) -> TemplateAudit:
    return _Auditor(ChatTemplate(name, source, dict(variables))).run()


def audit_source(name: str, source: str, variables: Mapping[str, str]) -> TemplateAudit:
    """The audit of template text, including the verdict on text that does not compile."""
    try:
        template = ChatTemplate(name, source, variables)
    except TemplateError as exc:
        return TemplateAudit(name, (Finding(FindingKind.FATAL, "does not compile", str(exc)),))
    return audit_template(template)


class _Auditor:
    def __init__(self, template: ChatTemplate) -> None:
        self.template = template
        self.findings: dict[tuple[FindingKind, str], Finding] = {}
        self.result_names = ToolResultNames.AS_SENT

    def add(self, finding: Finding) -> None:
        self.findings.setdefault((finding.kind, finding.feature), finding)

    def context(self, tools: Sequence[ToolSpec]) -> TemplateContext:
        return TemplateContext(
            self.template, Prompt((), tuple(tools)), self.result_names, AUDIT_NOW
        )

    def result(self, *, time_dependent: bool = False, parallel: bool = True) -> TemplateAudit:
        return TemplateAudit(
            self.template.name,
            tuple(self.findings.values()),
            self.result_names,
            time_dependent,
            parallel,
        )

    def run(self) -> TemplateAudit:
        plain = agent(reasoning=False)
        self.result_names = self.names_needed(plain)
        self.arguments()
        for tools in (TOOLS, ()):
            refused = self.refusal(self.context(tools), plain)
            if refused is not None:
                feature = f"refuses an ordinary agent conversation at {refused[0]}"
                self.add(Finding(FindingKind.FATAL, feature, refused[1]))
                return self.result()
        self.content(plain)
        if any(f.kind is FindingKind.FATAL for f in self.findings.values()):
            return self.result()
        time_dependent = self.clock()
        for tools in (TOOLS, ()):
            context = self.context(tools)
            self.simulate(context, plain)
            self.simulate(context, agent(reasoning=True))
        parallel = self.optional(
            parallel_calls(), PARALLEL_CALLS_REFUSED, "assistant turns with several tool calls"
        )
        self.optional(system_note(), SYSTEM_NOTES_REFUSED, "system messages after the first")
        return self.result(time_dependent=time_dependent, parallel=parallel)

    # -- what the template accepts and keeps ------------------------------------------------------

    def refusal(
        self, context: TemplateContext, messages: Sequence[Message]
    ) -> tuple[str, str] | None:
        """None if the template renders every request of ``messages`` and every history that
        ends in a reply; else the first message it refuses, described, and its own words."""
        names = call_names(messages)
        for end in range(1, len(messages) + 1):
            replied = messages[end - 1].role == "assistant"
            if not replied and end < len(messages) and messages[end].role != "assistant":
                continue  # no request ends here
            try:
                context.render(messages[:end], add_generation_prompt=not replied, names=names)
            except TemplateError as exc:
                return describe(messages, end - 1), str(exc)
        return None

    def optional(self, messages: Sequence[Message], refusal: str, feature: str) -> bool:
        """Simulate a conversation with a feature agents use but a template may refuse or
        rewrite. Either is a limit: such requests get a clear error, or a counted full render."""
        for tools in (TOOLS, ()):
            context = self.context(tools)
            refused = self.refusal(context, messages)
            if refused is not None:
                self.add(Finding(FindingKind.LIMIT, refusal, refused[1]))
                return False
            self.simulate(context, messages, optional=feature)
        return True

    def names_needed(self, plain: Sequence[Message]) -> ToolResultNames:
        """Tool results as the client sent them (no name), unless the template refuses that and
        accepts them named after their call: no engine has a prompt for such a request (vLLM
        refuses it), and agents' clients rarely name results."""
        for tools in (TOOLS, ()):
            if self.refusal(self.context(tools), plain) is None:
                continue
            prompt = Prompt((), tuple(tools))
            named = TemplateContext(self.template, prompt, ToolResultNames.FROM_CALLS, AUDIT_NOW)
            if self.refusal(named, plain) is None:
                self.add(
                    Finding(
                        FindingKind.NOTE,
                        "refuses tool results without the function's name",
                        "the bridge names them after their call; vLLM refuses such requests",
                    )
                )
                return ToolResultNames.FROM_CALLS
        return ToolResultNames.AS_SENT

    def arguments(self) -> None:
        """Arguments are passed as the engines pass them, a mapping; a template must show them
        (printing the mapping as Python, ``{'command': ...}``, is how the deployed model sees
        them too: worth a note)."""
        messages = arguments_probe()
        context = self.context(TOOLS)
        try:
            text = context.render(messages, add_generation_prompt=True)
        except TemplateError:
            return  # refused: the agent conversations say how
        mapping = json.loads(messages[1].tool_calls[0].arguments)
        if ARGUMENT_VALUE not in text:
            self.add(Finding(FindingKind.FATAL, "drops tool-call arguments"))
        elif repr(mapping) in text:
            self.add(
                Finding(
                    FindingKind.NOTE,
                    "prints tool-call arguments as a Python mapping",
                    f"{mapping!r}, as SGLang and vLLM pass them; a reply that wrote JSON is "
                    "kept as it was generated and re-rendered this way in full renders",
                )
            )

    def content(self, plain: Sequence[Message]) -> None:
        """What the model must see is in the render; some omissions are only worth a note."""
        context = self.context(TOOLS)
        text = context.render(plain, add_generation_prompt=True, names=call_names(plain))
        required = {
            "drops the system prompt": ("S0",),
            "drops user messages": ("U1", "U7", "U9"),
            "drops assistant replies": ("A6", "A8"),
            "drops tool results": ("T3", "T5"),
            "does not render the tool list": ("tools",),
        }
        for feature, names in required.items():
            missing = [name for name in names if marker(name) not in text]
            if missing:
                self.add(Finding(FindingKind.FATAL, feature, f"missing: {', '.join(missing)}"))
        if _command(CALL_B) not in text:  # a turn that is only a call
            self.add(Finding(FindingKind.FATAL, "drops tool calls"))
        kept = "a reply with both keeps it in the bridged prompt; the runtime check records it"
        if marker("A2") not in text:
            self.add(
                Finding(FindingKind.NOTE, "does not render text that comes with a tool call", kept)
            )
        if _command(CALL_A) not in text:
            self.add(
                Finding(FindingKind.NOTE, "does not render a tool call that comes with text", kept)
            )
        thinking = agent(reasoning=True)[:3]  # a reply with reasoning and a call, just made
        rendered = context.render(thinking, add_generation_prompt=False)
        if marker("R2") not in rendered:
            self.add(
                Finding(
                    FindingKind.NOTE,
                    REASONING_NEVER_RENDERED,
                    "a reply's reasoning stays only in the bridged prompt; the runtime check "
                    "records it",
                )
            )

    def clock(self) -> bool:
        """Whether the text depends on the time ``strftime_now`` reports."""
        for tools in (TOOLS, ()):
            for system in (True, False):
                messages = agent(reasoning=False, system=system)
                renders = [
                    self.template.render_raw(
                        template_messages(messages, result_names=self.result_names),
                        template_tools(tuple(tools)),
                        {},
                        add_generation_prompt=True,
                        now=now,
                    )
                    for now in (AUDIT_NOW, LATER_NOW)
                ]
                if renders[0] != renders[1]:
                    at = common_prefix(*renders)
                    self.add(
                        Finding(
                            FindingKind.NOTE,
                            "prints the current time (strftime_now): frozen at each session's "
                            "start",
                            f"e.g. {excerpt(renders[0], at)}",
                        )
                    )
                    return True
        return False

    # -- the bridge, simulated --------------------------------------------------------------------

    def simulate(
        self, context: TemplateContext, messages: Sequence[Message], optional: str = ""
    ) -> None:
        """Drive ``messages`` through the bridge request by request (a request ends where an
        assistant turn follows, or at the end) and compare with the template's renders.
        ``optional`` names the feature the conversation exists for: the bridge declining its
        requests (a counted full render) is then a limit, not a verdict."""
        names = call_names(messages)
        ends = [
            n
            for n in range(1, len(messages) + 1)
            if messages[n - 1].role != "assistant"
            and (n == len(messages) or messages[n].role == "assistant")
        ]
        sent = ""  # the template's prompt of the previous request
        generation_at = 0  # where its generation prompt starts
        reply: int | None = None  # index of the assistant turn that answered it
        for end in ends:
            full = context.render(messages[:end], add_generation_prompt=True, names=names)
            try:
                generation = self.request(
                    context, messages, end, reply, (sent, generation_at, full), optional
                )
            except TemplateError as exc:  # a probe, not the request: rendered in full instead
                feature = f"refuses the bridge's probe for {describe(messages, end - 1)}"
                self.add(Finding(FindingKind.LIMIT, feature, f"rendered in full: {exc}"))
                generation = ""
            if generation is None:
                return
            sent, generation_at = full, len(full) - len(generation)
            reply = end if end < len(messages) else None

    def request(
        self,
        context: TemplateContext,
        messages: Sequence[Message],
        end: int,
        reply: int | None,
        renders: tuple[str, int, str],
        optional: str,
    ) -> str | None:
        """Bridge the request ``messages[:end]`` (after the reply at ``reply``) and compare it
        with ``renders``: the previous request's prompt, where its generation prompt starts, and
        this request's full render. Returns this request's generation prompt (None: there is no
        append to speak of, and the simulation stops)."""
        sent, generation_at, full = renders
        names = call_names(messages)
        last = Slot.of(messages, end - 1, names)
        try:
            generation = context.generation_prompt(last)
        except NotAnAppend:
            feature = f"the generation prompt after a {last.role} message is not an append"
            self.add(Finding(FindingKind.REWRITE, feature))
            return None
        previous: Slot | None = None
        history, start = "", 0
        if reply is not None:
            history = context.render(
                messages[: reply + 1], add_generation_prompt=False, names=names
            )
            previous, start = Slot.of(messages, reply, names), reply + 1
            if not history.startswith(sent):
                self.add(generation_differs(context, sent, generation_at, history, messages, reply))
            closing = context.assistant_tail()
            if not history.endswith(closing):
                self.add(unclosed(history, closing, messages, reply))
        new = messages[start:end]
        bridged = bridge_text(context, previous, new, last, names)
        if bridged is None:
            earlier = context.base_text(previous)
            later = context.render_after(previous, new, gen=True, names=names)
            finding = rewrite(context, earlier, later, messages[:start], new)
            if optional and (finding.kind, finding.feature) not in self.findings:
                finding = Finding(
                    FindingKind.LIMIT,
                    f"renders requests with {optional} in full",
                    f"the template {finding.feature}",
                )
            self.add(finding)
            return generation
        text = history + bridged.body + bridged.generation
        at = common_prefix(text, full)
        if at < len(history):
            self.add(rewrite(context, history, full, messages[:start], new))
        elif text != full:
            self.add(
                Finding(
                    FindingKind.REWRITE,
                    "renders new messages differently after the real history than after a probe",
                    f"bridged {excerpt(text, at)}, template {excerpt(full, at)}",
                )
            )
        return generation


def _command(call: ToolCall) -> str:
    """The scenario calls' one argument, as any rendering of the call must show it."""
    return str(json.loads(call.arguments)["command"])
