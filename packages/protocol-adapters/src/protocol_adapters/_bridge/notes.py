"""What a turn records about how its prompt was made (``TurnMeta.extra``), and why a turn was
rendered in full: the words the bridge and the renderer write, named once."""

from __future__ import annotations

TEMPLATE_MODE = "template_mode"
"""The mode a template is served in, when the user chose one beyond ``exact``."""
TEMPLATE_DEVIATIONS = "template_deviations"
"""The deviations from the template's render the user accepted."""
TEMPLATE_CLOCK = "template_clock"
"""The instant a time-dependent template sees for the whole session (ISO 8601)."""
PROMPT_MISMATCH = "prompt_mismatch"
"""Why the check found the bridged prompt's template text different from the template's render
(``trajectory_tree.summarize`` counts it in ``prompt_mismatches``)."""
OUTPUT_KEPT = "output_kept"
"""An earlier reply is kept as the engine generated it where the template renders it
differently; expected, not a fault (``summarize`` counts it in ``outputs_kept``)."""

REASONING_KEPT = "the template leaves out earlier replies' reasoning; the model's is kept verbatim"
"""The :data:`OUTPUT_KEPT` note of a turn whose prompt holds reasoning the template drops."""
KEPT_EARLIER = "an output kept verbatim in an earlier turn's prompt is in this prompt too"
"""The :data:`OUTPUT_KEPT` note of every turn whose prompt extends one that kept an output (a
template that drops earlier reasoning, say): its prompt differs from the template's render for
the same reason, so it is counted too, not only the turn where the difference first showed."""

# Why a turn was rendered in full (``FullPrompt.reason``; counted in ``BridgeStats.fallbacks``).
FAILED_CHECK = "the chat template failed the bridge check"
ENDS_ON_REPLY = "the request ends on the model's own reply"
NOT_AN_APPEND = "the chat template does not render new messages as an append after a {role} message"
PROBE_REFUSED = "the chat template refused a probe conversation"
FULL_RENDER_MODE = "the template is served in full-render mode"
