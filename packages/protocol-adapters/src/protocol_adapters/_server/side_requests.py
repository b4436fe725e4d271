"""Side requests: model calls an agent CLI makes for its own housekeeping, not as the policy's work.

They are answered like any other call (the client needs the answer), recorded, and marked
``TurnMeta.side_request`` so linearization excludes their output with the reason
``side_request``: a session title is not something the policy should be rewarded for. They are
recognized by rules written down from the CLIs' real traffic; a rule is a shape that all of its
conditions must match.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from protocol_adapters._types import NeutralRequest


@dataclass(frozen=True, slots=True)
class SideRequestRule:
    """What one kind of side request looks like; every condition that is set must hold.

    - ``system_contains``: a phrase in the text of the system messages;
    - ``last_user_starts_with``: how the last user message's text begins;
    - ``without_tools``: the request offers no tools;
    - ``with_json_schema``: the request asks for structured output.
    """

    name: str
    system_contains: str = ""
    last_user_starts_with: str = ""
    without_tools: bool = False
    with_json_schema: bool = False

    def matches(self, request: NeutralRequest) -> bool:
        prompt = request.prompt
        if self.without_tools and prompt.tools:
            return False
        if self.with_json_schema and request.sampling.json_schema is None:
            return False
        messages = prompt.messages
        if self.system_contains and not any(
            self.system_contains in m.plain_text for m in messages if m.role == "system"
        ):
            return False
        if self.last_user_starts_with:
            users = [m for m in messages if m.role == "user"]
            if not users or not users[-1].plain_text.startswith(self.last_user_starts_with):
                return False
        return True


CLAUDE_CODE_SESSION_TITLE = SideRequestRule(
    name="claude_code_session_title",
    system_contains="You are naming a coding session",
    last_user_starts_with="<session>\n",
    without_tools=True,
    with_json_schema=True,
)
"""Claude Code's session title (interactive mode, unless non-essential traffic is turned off):
no tools, a system prompt that begins "You are naming a coding session so the user can pick it
out of a long list of sessions", one user message wrapping the session's text in
``<session>...</session>`` followed by a sentence on the title's language, and
``output_config.format`` a JSON schema for ``{"title": string}``. It shares the main agent's
model, ``max_tokens`` and session id header, so nothing else tells it apart. Measured on Claude
Code 2.1.330; re-check when the pin moves."""

DEFAULT_RULES: tuple[SideRequestRule, ...] = (CLAUDE_CODE_SESSION_TITLE,)


def side_request(rules: Sequence[SideRequestRule], request: NeutralRequest) -> str | None:
    """The name of the first rule ``request`` matches, if any."""
    return next((rule.name for rule in rules if rule.matches(request)), None)
