"""Test support for the generate function: slime's side of the call and a scripted agent.

- :func:`run_group`: the group call slime's rollout makes (its checkpoint directory, args
  namespace and sampling dict come from protocol_adapters.testing.checkpoint and
  slime_backend.testing).
- :class:`AgentModel`: the engine double's script, a function of the prompt ids: two shell tool
  calls, then a final answer; a sub-agent (its own system prompt) answers at once.
- :func:`scripted_episode`: the app's episode, an "agent" that talks to the adapter with the
  official ``anthropic`` SDK and runs the tool calls it gets back (no CLI, no sandbox).
- :func:`assert_engine_tokens_trained`: the trust property on slime samples.

Ray workers import this module by name (the Ray tests put this directory on their path).
"""

from __future__ import annotations

import asyncio
import uuid
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anthropic

from protocol_adapters import Vocabulary
from protocol_adapters.testing import EngineDouble, ScriptedReply
from slime_backend import AdapterSession, Budgets, EpisodeOutcome, JsonValue
from slime_backend.generate import make_generate
from slime_backend.testing import StandInSample

ASSISTANT_HEADER = "<|im_start|>assistant\n"
MAIN_SYSTEM = "You are the main agent. Fix the bug."
SUB_SYSTEM = "You are a sub-agent. Find the file."
FINAL_ANSWER = "The bug is fixed."
SUB_ANSWER = "It is in a.py."
TOOL = {
    "name": "bash",
    "description": "Run a shell command",
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
}
COMMANDS = ("ls", "cat a.py")


def base_group(
    group_index: int, size: int, first_index: int, payloads: Sequence[Mapping[str, Any]]
) -> list[StandInSample]:
    """The samples slime's data source hands the rollout for one prompt (a GRPO group)."""
    return [
        StandInSample(
            group_index=group_index,
            index=first_index + i,
            prompt="Fix the bug.",
            label=f"instance-{group_index}",
            metadata=dict(payloads[i % len(payloads)]),
        )
        for i in range(size)
    ]


async def run_group(
    generate: Any,
    args: Any,
    group: list[StandInSample],
    sampling_params: dict[str, Any],
    *,
    evaluation: bool = False,
) -> list[Any]:
    """What slime's ``generate_and_rm_group`` does with a custom generate function: a fresh
    ``session_id`` per training sample, a copy of the params per call, all concurrently, with
    ``evaluation=`` passed because the signature names it."""
    import inspect

    if not evaluation:
        for sample in group:
            if sample.session_id is None:
                sample.session_id = str(uuid.uuid4())
    takes_evaluation = "evaluation" in inspect.signature(generate).parameters

    async def one(sample: StandInSample) -> Any:
        params = dict(sampling_params)
        if takes_evaluation:
            return await generate(args, sample, params, evaluation=evaluation)
        return await generate(args, sample, params)

    return list(await asyncio.gather(*(one(s) for s in group)))


@dataclass(slots=True)
class AgentModel:
    """The engine double's script: reads its prompt as a model would and answers.

    The main agent calls ``bash`` once per entry of :data:`COMMANDS`, then answers; a sub-agent
    answers at once. ``versions`` (optional) sets the double's weight version by main-agent step,
    as an engine whose weights are updated mid-episode reports it. ``replies`` keeps each
    prompt's reply so tests can recompute what the double generated.
    """

    vocabulary: Vocabulary
    versions: Sequence[str] = ()
    double: EngineDouble | None = None
    padding: str = ""
    """Appended to every main-agent reply (longer generations for benchmarks)."""
    replies: dict[tuple[int, ...], ScriptedReply] = field(default_factory=dict)

    def __call__(self, input_ids: Sequence[int]) -> ScriptedReply:
        prompt = self.vocabulary.decode(list(input_ids))
        step = prompt.count(ASSISTANT_HEADER) - 1
        if SUB_SYSTEM in prompt:
            reply = ScriptedReply(text=SUB_ANSWER)
        elif step < len(COMMANDS):
            reply = ScriptedReply(
                text=f"Step {step}.{self.padding}",
                tool_calls=[("bash", {"command": COMMANDS[step]})],
            )
        else:
            reply = ScriptedReply(text=FINAL_ANSWER + self.padding)
        if self.double is not None and self.versions:
            self.double.weight_version = self.versions[min(step, len(self.versions) - 1)]
        self.replies[tuple(input_ids)] = reply
        return reply


_CLIENTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, anthropic.AsyncAnthropic] = (
    weakref.WeakKeyDictionary()
)


def anthropic_client() -> anthropic.AsyncAnthropic:
    """One SDK client per event loop, as one agent process would have: building one costs tens
    of milliseconds of CPU (TLS setup), which hundreds of concurrent episodes would otherwise pay
    on the loop they share here. Episodes use copies with their own URL and key."""
    loop = asyncio.get_running_loop()
    client = _CLIENTS.get(loop)
    if client is None:
        client = _CLIENTS[loop] = anthropic.AsyncAnthropic(
            base_url="http://127.0.0.1", api_key="unused", max_retries=0
        )
    return client


async def scripted_episode(
    task: Mapping[str, JsonValue],
    session: AdapterSession,
    budgets: Budgets,
    *,
    evaluation: bool,
) -> EpisodeOutcome:
    """The app's episode: an agent loop over the Anthropic Messages API of the adapter.

    The task payload steers it: ``reward`` is the graded outcome; ``subagent`` also runs a
    sub-agent conversation (a second branch, so a second sample); ``raise`` raises; ``hang``
    never returns after its first model call; ``sleep_s`` waits before grading;
    ``tolerate_errors`` stops at a failed model call and is graded anyway, as a CLI would be;
    ``retries`` retries a failed call that many times, as the agent CLIs do: the SDK retries an
    error status (an engine abort before any token is a 529), and a streamed call (``stream``)
    cut by an ``overloaded_error`` event (an engine abort mid-reply) is asked again.
    """
    retries = task.get("retries", 0)
    assert isinstance(retries, int)
    client = anthropic_client().with_options(
        base_url=session.base_url, api_key=session.token, max_retries=retries
    )
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the bug in a.py."}]
    tool_calls = 0
    for _ in range(budgets.max_turns):
        try:
            reply = await _ask(
                client,
                bool(task.get("stream")),
                retries,
                model="policy",
                system=MAIN_SYSTEM,
                messages=messages,
                tools=[TOOL],
                max_tokens=budgets.max_new_tokens,
                extra_body={"temperature": 0.3},  # the rollout's temperature must win
            )
        except anthropic.APIError:
            if not task.get("tolerate_errors"):
                raise
            break  # a CLI that gives up after an error, then gets graded
        if task.get("hang"):
            await asyncio.Event().wait()
        messages.append({"role": "assistant", "content": reply.content})
        uses = [b for b in reply.content if b.type == "tool_use"]
        if not uses:
            break
        tool_calls += len(uses)
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": b.id, "content": f"ran {b.input}"}
                    for b in uses
                ],
            }
        )
    if task.get("subagent"):
        await client.messages.create(
            model="policy",
            system=SUB_SYSTEM,
            messages=[{"role": "user", "content": "Where is the bug?"}],
            max_tokens=budgets.max_new_tokens,
        )
    if task.get("raise"):
        raise RuntimeError("grading crashed")
    sleep = task.get("sleep_s")
    if isinstance(sleep, int | float):
        await asyncio.sleep(sleep)
    reward = task.get("reward", 0.0)
    assert isinstance(reward, int | float)
    return EpisodeOutcome(float(reward), artifacts={"tool_calls": tool_calls})


async def _ask(
    client: anthropic.AsyncAnthropic, stream: bool, retries: int, **request: Any
) -> anthropic.types.Message:
    if not stream:
        reply: anthropic.types.Message = await client.messages.create(**request)
        return reply
    for attempt in range(retries + 1):
        try:
            async with client.messages.stream(**request) as streaming:
                return await streaming.get_final_message()
        except anthropic.APIStatusError as exc:
            body = exc.body if isinstance(exc.body, dict) else {}
            error = body.get("error")
            overloaded = isinstance(error, dict) and error.get("type") == "overloaded_error"
            if attempt == retries or not overloaded:
                raise
    raise AssertionError("unreachable")


def engine_outputs(
    double: EngineDouble, model: AgentModel
) -> dict[tuple[int, ...], tuple[list[int], list[float]]]:
    """What the double generated for each prompt: the scripted reply's ids and their logprobs."""
    outputs: dict[tuple[int, ...], tuple[list[int], list[float]]] = {}
    for prompt, reply in model.replies.items():
        ids = double.reply_ids(reply)
        outputs[prompt] = (ids, [double.logprob_at(i, t) for i, t in enumerate(ids)])
    return outputs


def assert_engine_tokens_trained(
    samples: Sequence[StandInSample], double: EngineDouble, model: AgentModel
) -> None:
    """The trust property on one episode's slime samples.

    Every run of loss-1 tokens is exactly the output the engine produced for the prompt that
    precedes it in the sample (the ids it was sent), with the engine's logprobs; every loss-0
    position carries logprob 0.0; and each of the episode's engine calls is trained exactly once
    across its samples.
    """
    outputs = engine_outputs(double, model)
    session = samples[0].session_id
    calls = [r.input_ids for r in double.requests if r.headers.get("x-smg-routing-key") == session]
    assert calls, "the episode's engine calls did not carry its session id as routing key"
    trained: list[tuple[int, ...]] = []
    for sample in samples:
        mask, logprobs = sample.loss_mask, sample.rollout_log_probs
        assert mask is not None
        assert logprobs is not None
        assert len(mask) == len(logprobs) == sample.response_length
        start = len(sample.tokens) - sample.response_length
        assert all(lp == 0.0 for m, lp in zip(mask, logprobs, strict=True) if not m)
        position = 0
        while position < len(mask):
            if not mask[position]:
                position += 1
                continue
            end = position
            while end < len(mask) and mask[end]:
                end += 1
            prompt = tuple(sample.tokens[: start + position])
            assert prompt in outputs, "trained tokens that follow a prompt the engine never got"
            ids, engine_logprobs = outputs[prompt]
            assert sample.tokens[start + position : start + end] == ids
            assert logprobs[position:end] == engine_logprobs
            trained.append(prompt)
            position = end
    assert sorted(trained) == sorted(calls), "each engine call must be trained exactly once"


generate = make_generate(scripted_episode, sample_class=StandInSample)
"""The app's module attribute, as slime loads it (``rollout_kit.generate``)."""
