"""How the scripted "models" behind the CLI tests read their prompt: the engine double hands them
the prompt's token ids, they decode them with the real tokenizer and read the Qwen3 chat the
template wrote (system prompt, offered tools, messages, tool results) the way a model would, so
they answer whatever the real CLI actually sent instead of a sequence fixed in advance.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from protocol_adapters import Vocabulary
from protocol_adapters.testing import ScriptedReply
from protocol_adapters.testing.prompt_tools import ShellTool, find_shell_tool, offered_tools

START = "<|im_start|>"
END = "<|im_end|>"
_TOOL_RESPONSE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.DOTALL)


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str
    text: str


class Prompt:
    """One decoded prompt: the chat messages before the generation prompt it ends with."""

    def __init__(self, text: str) -> None:
        self.text = text

    @cached_property
    def messages(self) -> tuple[ChatMessage, ...]:
        found = []
        for chunk in self.text.split(START)[1:]:
            role, _, rest = chunk.partition("\n")
            if END in rest:  # the last chunk is the generation prompt: no end marker yet
                found.append(ChatMessage(role, rest.split(END, 1)[0]))
        return tuple(found)

    def first(self, role: str) -> ChatMessage | None:
        return next((m for m in self.messages if m.role == role), None)

    def last(self, role: str) -> ChatMessage | None:
        return next((m for m in reversed(self.messages) if m.role == role), None)

    @property
    def replies_so_far(self) -> int:
        """How many replies this conversation already holds (the model's earlier turns)."""
        return sum(1 for m in self.messages if m.role == "assistant")

    @property
    def tool_results(self) -> list[str]:
        """Every tool result in the conversation, in order."""
        return [r for m in self.messages for r in _TOOL_RESPONSE.findall(m.text)]

    @cached_property
    def tools(self) -> list[Mapping[str, object]]:
        """The function specs the Qwen3-style template wrote into the system turn."""
        return offered_tools(self.text)

    def tool(self, name: str) -> Mapping[str, object] | None:
        return next((t for t in self.tools if t.get("name") == name), None)

    @property
    def shell_tool(self) -> ShellTool | None:
        """The tool whose only required argument is a command-line string (``command``/``cmd``).

        A call then satisfies its schema with that one argument, whatever the CLI named it.
        """
        return find_shell_tool(self.tools)


@dataclass(slots=True)
class ScriptedModel:
    """The engine double's script (a callable of each request's prompt ids): subclasses answer
    a decoded :class:`Prompt`.

    ``replies`` keeps every (prompt ids, reply) so a test can recompute what the double
    generated; ``problems`` collects what a real model could not have worked with (a tool
    missing from the prompt, a request the session should never have made); tests assert it
    stays empty.
    """

    vocabulary: Vocabulary
    replies: list[tuple[tuple[int, ...], ScriptedReply]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def __call__(self, input_ids: Sequence[int]) -> ScriptedReply:
        reply = self.answer(Prompt(self.vocabulary.decode(list(input_ids))))
        self.replies.append((tuple(input_ids), reply))
        return reply

    def answer(self, prompt: Prompt) -> ScriptedReply:
        raise NotImplementedError

    def problem(self, text: str, reply: str = "I cannot go on.") -> ScriptedReply:
        """Note what went wrong and end the conversation with a plain answer."""
        self.problems.append(text)
        return ScriptedReply(text=reply)
