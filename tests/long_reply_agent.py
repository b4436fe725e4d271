"""The scripted "model" of the tests that cut a reply short: a session of one shell command and
a long final answer.

- With a ``max_new_tokens`` below the answer's length, the engine stops the answer at that
  many tokens (finish reason ``length``). Claude Code then asks the model to go on ("Output
  token limit hit…"); the model answers that request with a short final answer, which fits.
- With a slow stream, the long answer is still being generated when the test kills the CLI or
  closes its session: the partial answer is what the engine produced until then.
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol_adapters.testing import ScriptedReply

from .reading import Prompt, ScriptedModel

TASK = "Run the command, then explain at length what it printed."
COMMAND_OUTPUT = "long-answer-ran"
COMMAND = f"echo {COMMAND_OUTPUT} > marker && echo {COMMAND_OUTPUT}"
LONG_ANSWER = " ".join(f"Point {k}: the command printed {COMMAND_OUTPUT}." for k in range(1, 61))
SHORT_ANSWER = f"In short: the command printed {COMMAND_OUTPUT}."
CONTINUE_REQUEST = "Output token limit hit"
"""How Claude Code's request to go on after a reply cut at the output limit begins."""


def asked_to_continue(prompt: Prompt) -> bool:
    last = prompt.last("user")
    return last is not None and CONTINUE_REQUEST in last.text


@dataclass(slots=True)
class LongReplyAgent(ScriptedModel):
    """One shell command, then the long answer; ``continuations`` counts the requests that
    asked it to go on after a cut reply (each answered with the short answer)."""

    continuations: int = 0

    def answer(self, prompt: Prompt) -> ScriptedReply:
        if asked_to_continue(prompt):
            self.continuations += 1
            return ScriptedReply(text=SHORT_ANSWER)
        step = prompt.replies_so_far
        if step == 0:
            tool = prompt.shell_tool
            if tool is None:
                return self.problem("no shell tool among the offered tools")
            return ScriptedReply(text="Running it.", tool_calls=[tool.call(COMMAND)])
        if step == 1:
            return ScriptedReply(text=LONG_ANSWER)
        return self.problem(f"a request after {step} replies that did not ask to go on")
