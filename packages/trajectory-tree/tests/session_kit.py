"""Test support: a toy chat format, a scripted engine, and a client-side session driver.

They play the parts a real adapter plays around :class:`~trajectory_tree.SessionTree`, honestly
enough that the tree's guarantees can be checked against what was really sent and returned:

- :class:`ChatFormat` is a deterministic chat template over UTF-8 byte ids (0-255) plus a few
  special ids. Each message renders as ``header + content + end``; the engine's reply is the
  content followed by ``<|im_end|>``; the template owes a ``"\\n"`` after it (and the
  ``<|im_end|>`` too when generation stopped without it). It renders the bridge (route ->
  prefix ids + only the new messages) and full conversations (the fallback).
- :class:`ScriptedEngine` stands in for SGLang's ``/generate`` (no GPU here): it takes and
  returns the native wire shapes (``input_ids`` in; ``meta_info.output_token_logprobs`` as
  ``[logprob, id, text]`` triples and ``finish_reason.type`` out) and logs every call. The output
  ids are chosen by the test; the logprobs are random.
- :class:`Session` drives route -> render -> generate -> record exactly as an adapter does,
  with the two halves split (:meth:`Session.start` / :meth:`Session.finish`) so tests can
  interleave concurrent requests of one session.

Messages are built with the small helpers at the bottom (``system``, ``user``, ``reply``, ...).
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

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
    Route,
    Segment,
    SessionTree,
    Text,
    ToolCall,
    ToolSpec,
    Turn,
    TurnMeta,
)

# -- token ids ---------------------------------------------------------------------------------

IM_START, IM_END, THINK, END_THINK, CALL, END_CALL, TOOLS, END_TOOLS = range(256, 264)
SPECIALS: dict[int, str] = {
    IM_START: "<|im_start|>",
    IM_END: "<|im_end|>",
    THINK: "<think>",
    END_THINK: "</think>",
    CALL: "<tool_call>",
    END_CALL: "</tool_call>",
    TOOLS: "<tools>",
    END_TOOLS: "</tools>",
}
VOCAB_SIZE = 264
NEWLINE = [ord("\n")]


def encode(text: str) -> list[int]:
    # surrogatepass: tests feed text that is not valid Unicode, as a careless client might
    return list(text.encode("utf-8", "surrogatepass"))


def decode(ids: Sequence[int]) -> str:
    """Ids back to text: special ids by name, bytes as UTF-8 (replacing cut characters)."""
    out: list[str] = []
    run = bytearray()
    for i in ids:
        if i < 256:
            run.append(i)
            continue
        out.append(run.decode("utf-8", errors="replace"))
        run.clear()
        out.append(SPECIALS.get(i, f"<{i}>"))
    out.append(run.decode("utf-8", errors="replace"))
    return "".join(out)


# -- the chat format ---------------------------------------------------------------------------

_CONTENT_REASON: dict[str, LossReason] = {
    "system": LossReason.CONTEXT,
    "user": LossReason.CONTEXT,
    "assistant": LossReason.CONTEXT,  # client-written assistant text; generated ones stay opaque
    "tool": LossReason.TOOL_OUTPUT,
}


@dataclass(frozen=True)
class ChatFormat:
    """A Qwen-like chat template over byte ids.

    ``strip_history_reasoning`` makes full renders drop the reasoning of earlier assistant turns,
    as Qwen3's template does: a template that rewrites history, which the bridge must survive.
    """

    strip_history_reasoning: bool = False

    def header(self, role: str) -> list[int]:
        return [IM_START, *encode(role + "\n")]

    @property
    def end(self) -> list[int]:
        return [IM_END, *NEWLINE]

    def generation_prompt(self) -> list[int]:
        return self.header("assistant")

    def preamble(self, prompt: Prompt) -> list[int]:
        """Tools and options, rendered before the first message (empty when there are none)."""
        if not prompt.tools and not prompt.options:
            return []
        spec = {
            "tools": [[t.name, t.description, t.parameters] for t in prompt.tools],
            "options": dict(sorted(prompt.options.items())),
        }
        return [TOOLS, *encode(json.dumps(spec, ensure_ascii=False)), END_TOOLS, *NEWLINE]

    def content(self, message: Message, *, reasoning: bool = True) -> list[int]:
        ids: list[int] = []
        for block in message.content:
            if isinstance(block, Text):
                ids += encode(block.text)
            elif isinstance(block, Reasoning):
                if reasoning:
                    ids += [THINK, *encode(block.text), END_THINK]
            elif isinstance(block, ToolCall):
                body = f'{{"name": {json.dumps(block.name)}, "arguments": {block.arguments}}}'
                ids += [CALL, *encode(body), END_CALL]
            elif isinstance(block, Media):
                ids += encode(f"[{block.media_type}]")
        return ids

    def message(self, message: Message, *, reasoning: bool = True) -> list[int]:
        return [*self.header(message.role), *self.content(message, reasoning=reasoning), *self.end]

    def assistant_output(self, reply: Message) -> list[int]:
        """What an engine trained on this format emits for ``reply`` (stop token included)."""
        return [*self.content(reply), IM_END]

    def closing_scaffold(self, output_ids: Sequence[int]) -> list[int]:
        """Tokens the template puts after a generated output that the model did not generate."""
        if output_ids and output_ids[-1] == IM_END:
            return list(NEWLINE)
        return self.end

    # -- the two ways a prompt is built --------------------------------------------------------

    def bridge(self, route: Route) -> BridgedPrompt:
        """Render only ``route.new_messages`` onto the route's prefix ids, as an adapter must."""
        segments: list[Segment] = []
        new = route.new_messages
        if route.anchor.parent is None and new:
            segments.append(Segment(LossReason.CONTEXT, self.preamble(route.prompt)))
        previous = route.previous_generated
        if previous is not None and new:
            output = route.tree.output_ids(previous)
            segments.append(Segment(LossReason.TEMPLATE_SCAFFOLD, self.closing_scaffold(output)))
        for message in new:
            segments += [
                Segment(LossReason.TEMPLATE_SCAFFOLD, self.header(message.role)),
                Segment(_CONTENT_REASON[message.role], self.content(message)),
                Segment(LossReason.TEMPLATE_SCAFFOLD, self.end),
            ]
        return BridgedPrompt(segments, self.generation_prompt())

    def full(self, prompt: Prompt, reason: str) -> FullPrompt:
        """Render the whole conversation from its messages (the fallback when no bridge)."""
        ids = self.preamble(prompt)
        last = len(prompt.messages) - 1
        for index, message in enumerate(prompt.messages):
            keep = not (self.strip_history_reasoning and message.role == "assistant")
            ids += self.message(message, reasoning=keep or index == last)
        gen = self.generation_prompt()
        return FullPrompt([*ids, *gen], len(gen), reason)


def prompt_ids_of(route: Route, prompt: BridgedPrompt | FullPrompt) -> list[int]:
    """The ids an adapter sends to the engine for ``prompt``."""
    if isinstance(prompt, FullPrompt):
        return list(prompt.ids)
    ids = route.prefix_ids().tolist()
    for segment in prompt.segments:
        ids += segment.ids
    return ids + list(prompt.generation_prompt)


# -- the engine --------------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineCall:
    """One ``/generate`` call as the engine saw it."""

    rid: str
    input_ids: list[int]
    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str


class ScriptedEngine:
    """A double for SGLang's native ``/generate`` (no GPU here), speaking its JSON shapes.

    The test scripts the output ids of the next call; logprobs are drawn from a seeded RNG, so a
    token's logprob identifies where it came from. Every call is kept in :attr:`calls`.
    """

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)
        self.calls: list[EngineCall] = []

    def generate(
        self, request: Mapping[str, Any], output_ids: Sequence[int], finish_reason: str
    ) -> dict[str, Any]:
        logprobs = [-self._rng.expovariate(1.0) for _ in output_ids]
        self.calls.append(
            EngineCall(
                str(request["rid"]),
                list(request["input_ids"]),
                list(output_ids),
                logprobs,
                finish_reason,
            )
        )
        return {
            "text": decode(output_ids),
            "meta_info": {
                "id": request["rid"],
                "finish_reason": {"type": finish_reason},
                "prompt_tokens": len(request["input_ids"]),
                "completion_tokens": len(output_ids),
                "output_token_logprobs": [
                    [lp, i, None] for lp, i in zip(logprobs, output_ids, strict=True)
                ],
            },
        }


def completion_from_response(response: Mapping[str, Any]) -> Completion:
    """What an adapter reads from a ``/generate`` response: ids and logprobs, verbatim."""
    meta = response["meta_info"]
    triples = meta["output_token_logprobs"]
    return Completion(
        output_ids=[int(t[1]) for t in triples],
        output_logprobs=[float(t[0]) for t in triples],
        finish_reason=FinishReason(meta["finish_reason"]["type"]),
    )


# -- the session driver ------------------------------------------------------------------------


@dataclass
class Pending:
    """A request that was routed and generated but not yet recorded."""

    route: Route
    prompt: BridgedPrompt | FullPrompt
    completion: Completion
    reply: Message
    meta: TurnMeta
    call: EngineCall


@dataclass
class Session:
    """One agent session: a tree, a chat format and an engine, driven like an adapter."""

    tree: SessionTree = field(default_factory=lambda: SessionTree("session"))
    fmt: ChatFormat = field(default_factory=ChatFormat)
    engine: ScriptedEngine = field(default_factory=ScriptedEngine)
    calls: dict[int, EngineCall] = field(default_factory=dict)
    """The engine call behind each recorded turn, by turn id."""

    def start(
        self,
        prompt: Prompt,
        reply: Message,
        *,
        output: Sequence[int] | None = None,
        finish: FinishReason = FinishReason.STOP,
        full: str | None = None,
        meta: TurnMeta | None = None,
    ) -> Pending:
        """Route, render and generate. ``output`` defaults to the format's rendering of
        ``reply``; ``full`` (a reason) renders the whole conversation instead of bridging."""
        route = self.tree.route(prompt)
        built = self.fmt.full(prompt, full) if full is not None else self.fmt.bridge(route)
        ids = prompt_ids_of(route, built)
        out = self.fmt.assistant_output(reply) if output is None else list(output)
        rid = f"req-{len(self.engine.calls)}"
        response = self.engine.generate(
            {"rid": rid, "input_ids": ids, "return_logprob": True}, out, str(finish)
        )
        completion = completion_from_response(response)
        return Pending(
            route, built, completion, reply, meta or TurnMeta(request_id=rid), self.engine.calls[-1]
        )

    def finish(self, pending: Pending) -> Turn:
        """Record a generated request."""
        turn = self.tree.record(
            pending.route, pending.prompt, pending.completion, pending.reply, pending.meta
        )
        self.calls[turn.id] = pending.call
        return turn

    def turn(self, prompt: Prompt, reply: Message, **kwargs: Any) -> Turn:
        """Route, render, generate and record one request."""
        return self.finish(self.start(prompt, reply, **kwargs))


# -- messages ----------------------------------------------------------------------------------


def system(text: str) -> Message:
    return Message.text("system", text)


def user(text: str) -> Message:
    return Message.text("user", text)


def tool_result(call_id: str, text: str, *, error: bool = False) -> Message:
    return Message("tool", (Text(text),), tool_call_id=call_id, is_error=error)


def call(call_id: str, name: str, arguments: Mapping[str, Any]) -> ToolCall:
    """A tool call as a model writes it: arguments in its own key order, with spaces."""
    return ToolCall(call_id, name, json.dumps(arguments))


def reply(
    text: str = "", *calls: ToolCall, reasoning: str | None = None, signature: str | None = None
) -> Message:
    blocks: list[Reasoning | Text | ToolCall] = []
    if reasoning is not None:
        blocks.append(Reasoning(reasoning, signature))
    if text:
        blocks.append(Text(text))
    blocks += calls
    return Message("assistant", tuple(blocks))


def reserialized(message: Message) -> Message:
    """``message`` echoed the way Claude Code does: tool arguments re-serialized (keys reordered,
    whitespace removed) and a signature attached to its thinking."""
    blocks: list[Any] = []
    for block in message.content:
        if isinstance(block, ToolCall):
            value = json.loads(block.arguments)
            if isinstance(value, dict):
                value = dict(reversed(list(value.items())))
            blocks.append(replace(block, arguments=json.dumps(value, separators=(",", ":"))))
        elif isinstance(block, Reasoning):
            blocks.append(Reasoning(block.text, signature="sig-" + str(len(block.text))))
        else:
            blocks.append(block)
    return replace(message, content=tuple(blocks))


def without_reasoning(message: Message) -> Message:
    """``message`` echoed by a client that does not send reasoning back."""
    return replace(
        message, content=tuple(b for b in message.content if not isinstance(b, Reasoning))
    )


TOOLS_A: tuple[ToolSpec, ...] = (
    ToolSpec("bash", "Run a shell command", '{"properties":{"cmd":{"type":"string"}}}'),
    ToolSpec("read", "Read a file", '{"properties":{"path":{"type":"string"}}}'),
)
TOOLS_B: tuple[ToolSpec, ...] = TOOLS_A[:1]


def prompt(*messages: Message, tools: Sequence[ToolSpec] = TOOLS_A, **options: str) -> Prompt:
    return Prompt(messages, tools, options)
