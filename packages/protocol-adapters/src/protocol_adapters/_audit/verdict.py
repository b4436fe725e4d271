"""What the template audit concludes, and what a renderer may do with it.

A verdict says how a chat template can be served:

- ``bridge-exact``: every bridged prompt equals the template's own render of the conversation;
- ``bridge-with-deviation``: bridged prompts differ from the template's render in a stated,
  bounded way (a generation prompt history never repeats, reasoning the template would drop);
- ``full-render-only``: the template rewrites or moves earlier text once later messages arrive,
  so only a full render per turn (a new sample each time) gives its own prompt;
- ``unusable``: it does not compile, refuses ordinary agent conversations or drops what the
  model must see.

Only ``bridge-exact`` is served by default. Anything else is refused at start unless the user
chose a :class:`TemplateMode` that covers it, and then every turn records that mode.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from protocol_adapters._template.messages import ToolResultNames

# The features the renderer acts on, named once: the audit reports them, the renderer asks the
# audit about them (:class:`TemplateAudit`'s properties).
GENERATION_PROMPT_DIFFERS = "the generation prompt is not how history renders the assistant turn"
REASONING_DROPPED = "drops the reasoning of earlier assistant turns once a later message arrives"
"""The audit's finding for a template that leaves earlier replies' reasoning out of its render."""
REASONING_NEVER_RENDERED = "does not render reasoning"
"""The audit's note for a template that renders no reply's reasoning, the latest included."""
PARALLEL_CALLS_REFUSED = "refuses assistant turns with several tool calls"


class Verdict(StrEnum):
    BRIDGE_EXACT = "bridge-exact"
    BRIDGE_WITH_DEVIATION = "bridge-with-deviation"
    FULL_RENDER_ONLY = "full-render-only"
    UNUSABLE = "unusable"


class FindingKind(StrEnum):
    """How much a finding weighs, from harmless to fatal."""

    NOTE = "note"
    """Worth knowing, changes nothing (the date is frozen per session, reasoning never shown)."""
    LIMIT = "limit"
    """The template refuses some conversations; such requests get a clear 400 naming it."""
    DEVIATION = "deviation"
    """Bridged prompts differ from the template's render in this stated way."""
    REWRITE = "rewrite"
    """A later message changes earlier text: only full renders give the template's prompt."""
    FATAL = "fatal"
    """The template cannot serve an agent at all."""


@dataclass(frozen=True, slots=True)
class Finding:
    """One trait of a template: ``feature`` names it, ``detail`` shows where (text excerpts)."""

    kind: FindingKind
    feature: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.kind}: {self.feature}" + (f" ({self.detail})" if self.detail else "")


_VERDICT_OF = {
    FindingKind.FATAL: Verdict.UNUSABLE,
    FindingKind.REWRITE: Verdict.FULL_RENDER_ONLY,
    FindingKind.DEVIATION: Verdict.BRIDGE_WITH_DEVIATION,
}


@dataclass(frozen=True, slots=True)
class TemplateAudit:
    """The audit of one template. ``result_names``: which names its tool results carry;
    ``time_dependent``: it prints the clock (the renderer freezes it per session);
    ``parallel_calls``: it accepts assistant turns with several tool calls."""

    template: str
    findings: tuple[Finding, ...]
    result_names: ToolResultNames = ToolResultNames.FROM_CALLS
    time_dependent: bool = False
    parallel_calls: bool = True

    @property
    def verdict(self) -> Verdict:
        for kind in (FindingKind.FATAL, FindingKind.REWRITE, FindingKind.DEVIATION):
            if any(f.kind is kind for f in self.findings):
                return _VERDICT_OF[kind]
        return Verdict.BRIDGE_EXACT

    @property
    def drops_reasoning(self) -> bool:
        """It leaves some reply's reasoning out of its render (earlier ones, or every one)."""
        return any(
            f.feature in (REASONING_DROPPED, REASONING_NEVER_RENDERED) for f in self.findings
        )

    @property
    def generation_prompt_differs(self) -> bool:
        """Its generation prompt is not how history renders an assistant turn."""
        return any(f.feature.startswith(GENERATION_PROMPT_DIFFERS) for f in self.findings)

    @property
    def parallel_calls_refusal(self) -> Finding | None:
        """The finding that it refuses assistant turns with several calls, if it does."""
        return next((f for f in self.findings if f.feature == PARALLEL_CALLS_REFUSED), None)

    def of_kind(self, kind: FindingKind) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.kind is kind)

    def deviations(self) -> str:
        """The stated deviations, one line: what every turn served with them records."""
        return "; ".join(f.feature for f in self.of_kind(FindingKind.DEVIATION))

    def report(self) -> str:
        """The verdict and every finding, for people (``protocol-adapters check-template``)."""
        lines = [f"template {self.template!r}: {self.verdict}"]
        order = (
            FindingKind.FATAL,
            FindingKind.REWRITE,
            FindingKind.DEVIATION,
            FindingKind.LIMIT,
            FindingKind.NOTE,
        )
        lines.extend(f"  {finding}" for kind in order for finding in self.of_kind(kind))
        if self.verdict is not Verdict.UNUSABLE:
            lines.append(f"  tool results are named {self.result_names}")
        return "\n".join(lines)


class TemplateMode(StrEnum):
    """How a renderer serves its template: the user's explicit choice beyond ``exact``."""

    EXACT = "exact"
    """Bridge, and refuse any template whose verdict is not ``bridge-exact`` (the default)."""
    ACCEPT_DEVIATIONS = "accept-deviations"
    """Bridge a ``bridge-with-deviation`` template; every turn records the deviations."""
    FULL_RENDER = "full-render"
    """Render every turn in full (a new sample whenever history re-renders differently); serves
    ``full-render-only`` templates. Every turn records the mode."""


_ALLOWED = {
    TemplateMode.EXACT: {Verdict.BRIDGE_EXACT},
    TemplateMode.ACCEPT_DEVIATIONS: {Verdict.BRIDGE_EXACT, Verdict.BRIDGE_WITH_DEVIATION},
    TemplateMode.FULL_RENDER: {
        Verdict.BRIDGE_EXACT,
        Verdict.BRIDGE_WITH_DEVIATION,
        Verdict.FULL_RENDER_ONLY,
    },
}

_ADVICE = {
    Verdict.BRIDGE_WITH_DEVIATION: (
        "serve it with TemplateMode.ACCEPT_DEVIATIONS (--template-mode accept-deviations) to "
        "train on bridged prompts with these deviations, or FULL_RENDER (full-render) to render "
        "every turn in full"
    ),
    Verdict.FULL_RENDER_ONLY: (
        "serve it with TemplateMode.FULL_RENDER (--template-mode full-render): every turn is "
        "rendered in full and starts a new sample when history re-renders differently"
    ),
    Verdict.UNUSABLE: "no mode can serve it; fix the template",
}


class TemplateRefused(ValueError):
    """The chat template cannot be served in the chosen mode; the message says why and what
    mode would serve it."""

    def __init__(self, audit: TemplateAudit, mode: TemplateMode) -> None:
        verdict = audit.verdict
        super().__init__(
            f"chat template {audit.template!r} is {verdict}, which {mode.value!r} mode does not "
            f"serve: {_ADVICE.get(verdict, '')}\n{audit.report()}"
        )
        self.audit = audit
        self.mode = mode


def enforce(audit: TemplateAudit, mode: TemplateMode) -> None:
    """Raise :class:`TemplateRefused` unless ``mode`` may serve a template with this audit."""
    if audit.verdict not in _ALLOWED[mode]:
        raise TemplateRefused(audit, mode)
