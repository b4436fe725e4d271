"""Test support: episodes recorded into a session tree the way the adapters record them.

:class:`Recorder` routes each request through ``SessionTree.route``, renders only the new messages
(UTF-8 bytes as token ids, plus a generation-prompt id pair), and records the engine's answer with
``SessionTree.record``: the public path protocol-adapters takes, minus HTTP and a tokenizer.
Output ids are the reply's bytes (plus tool-call markers); logprobs come from a seeded RNG. With
``routing=(layers, topk)`` a call returns MoE routing from where the tree says the engine should
start (``SessionTree.routing_start``), each call's expert ids its own (:func:`expert_id`).
:func:`base_sample` builds the sample slime's data source hands the generate function.
"""

from __future__ import annotations

import random
from array import array
from collections.abc import Mapping, Sequence
from typing import Any

import yaml  # type: ignore[import-untyped]  # PyYAML ships no stubs; slime parses with it

from slime_backend.testing import StandInSample
from trajectory_tree import (
    BridgedPrompt,
    Completion,
    FinishReason,
    LossReason,
    Message,
    Prompt,
    RoutedExperts,
    Segment,
    SessionTree,
    Text,
    ToolCall,
    Turn,
    TurnMeta,
)

GENERATION_PROMPT = (300, 301)
CALL_MARK = 302
END = 303


def expert_id(turn: int, position: int, layer: int, k: int) -> int:
    """The expert call ``turn`` routed ``position`` to at ``layer``, choice ``k``: distinct per
    call, so rows taken from the wrong call cannot pass."""
    return 1 + (turn * 131 + position * 17 + layer * 5 + k) % 997


def encode(text: str) -> list[int]:
    return list(text.encode())


def system(text: str) -> Message:
    return Message.text("system", text)


def user(text: str) -> Message:
    return Message.text("user", text)


def tool(call_id: str, text: str) -> Message:
    return Message("tool", (Text(text),), tool_call_id=call_id)


class Recorder:
    """One episode's session, recorded turn by turn."""

    def __init__(self, session_id: str = "episode", seed: int = 0) -> None:
        self.tree = SessionTree(session_id)
        self.rng = random.Random(seed)

    def turn(
        self,
        messages: Sequence[Message],
        text: str,
        *,
        calls: int = 0,
        malformed: int = 0,
        finish: FinishReason = FinishReason.STOP,
        agent: str | None = None,
        weight_version: str | None = "w1",
        logprob: float | None = None,
        version_runs: Sequence[tuple[int, str]] = (),
        routing: tuple[int, int] | None = None,
        routing_from: int | None = None,
    ) -> Message:
        """Record one model call answering ``messages``; returns the assistant reply.

        ``version_runs`` are the call's ``(first output index, version)`` runs (the last one's
        version is ``weight_version``); ``routing`` is ``(layers, topk)`` of the routing it
        returns, from ``routing_from`` (default: where the tree says to start)."""
        route = self.tree.route(Prompt(messages))
        segments = [
            Segment(
                LossReason.TOOL_OUTPUT if m.role == "tool" else LossReason.CONTEXT,
                encode(f"{m.role}:{m.plain_text}"),
            )
            for m in route.new_messages
        ]
        number = len(self.tree.turns)
        call_blocks = tuple(
            ToolCall(f"call-{number}-{i}", "bash", '{"cmd": "ls"}') for i in range(calls)
        )
        reply = Message("assistant", (Text(text), *call_blocks))
        output = encode(text) + [CALL_MARK] * calls + [END]
        logprobs = [logprob if logprob is not None else -self.rng.expovariate(2.0) for _ in output]
        prompt = BridgedPrompt(segments, GENERATION_PROMPT)
        routed = None
        if routing is not None:
            layers, topk = routing
            start = self.tree.routing_start(route, prompt) if routing_from is None else routing_from
            end = route.prefix_length + prompt.new_length + len(output) - 1
            ids = [
                expert_id(number, p, layer, k)
                for p in range(start, end)
                for layer in range(layers)
                for k in range(topk)
            ]
            routed = RoutedExperts(start, layers, topk, array("i", ids))
        self.tree.record(
            route,
            prompt,
            Completion(output, logprobs, finish, weight_version, tuple(version_runs), routed),
            reply,
            TurnMeta(agent_id=agent, malformed_tool_calls=malformed),
        )
        return reply

    @property
    def last(self) -> Turn:
        return self.tree.turns[-1]


def fan_out(recorder: Recorder) -> Recorder:
    """A main agent (2 turns), a sub-agent (2 turns) and a compaction restart (1 turn)."""
    main = [system("main agent"), user("fix the bug")]
    sub = [system("sub-agent"), user("find the file")]
    r0 = recorder.turn(main, "looking", calls=1, agent="main")
    s0 = recorder.turn(sub, "grep", calls=1, agent="sub")
    recorder.turn([*main, r0, tool("call-0-0", "a.py b.py")], "editing a.py", calls=2, agent="main")
    recorder.turn([*sub, s0, tool("call-1-0", "found in a.py")], "it is a.py", agent="sub")
    recorder.turn([system("main agent"), user("summary: a.py edited")], "done", agent="main")
    return recorder


def base_sample(
    index: int = 7, group_index: int = 3, payload: Mapping[str, Any] | None = None
) -> StandInSample:
    """The sample slime's data source builds for one episode of a prompt group."""
    return StandInSample(
        group_index=group_index,
        index=index,
        prompt="fix the bug",
        label="instance-1",
        metadata=dict(payload) if payload is not None else {"repo": "demo/repo", "tests": ["t1"]},
        session_id=f"session-{index}",
    )


def mask_of(sample: StandInSample) -> list[int]:
    assert sample.loss_mask is not None
    return sample.loss_mask


def logprobs_of(sample: StandInSample) -> list[float]:
    assert sample.rollout_log_probs is not None
    return sample.rollout_log_probs


def slime_loads_custom_config(text: str) -> dict[str, Any]:
    """What slime does with ``--custom-config-path``: ``yaml.safe_load``, keys become ``args``."""
    loaded: dict[str, Any] = yaml.safe_load(text)
    return loaded
