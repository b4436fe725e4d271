"""Test support: episodes recorded into a session tree the way the adapters record them.

:class:`Recorder` routes each request through ``SessionTree.route``, renders only the new messages
(UTF-8 bytes as token ids, plus a generation-prompt id pair), and records the engine's answer with
``SessionTree.record``: the public path protocol-adapters takes, minus HTTP and a tokenizer.
Output ids are the reply's bytes (plus tool-call markers); logprobs come from a seeded RNG.
:func:`base_sample` builds the sample slime's data source hands the generate function.
"""

from __future__ import annotations

import random
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
    ) -> Message:
        """Record one model call answering ``messages``; returns the assistant reply."""
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
        self.tree.record(
            route,
            BridgedPrompt(segments, GENERATION_PROMPT),
            Completion(output, logprobs, finish, weight_version),
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
