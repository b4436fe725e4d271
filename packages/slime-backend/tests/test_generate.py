"""The generate function driven exactly as slime's rollout drives it, in one process.

Real parts: the adapter server (Anthropic dialect, bridge renderer, the real Qwen3 tokenizer and
our Qwen3-style template read from a checkpoint directory), the SGLang client, the official
``anthropic`` SDK as the agent's client. The engine is ``EngineDouble``: an HTTP server speaking
SGLang's ``/generate`` wire with scripted replies (no GPU here).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import shutil
import socket
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from machine_load import slowdown
from rollout_kit import (
    FINAL_ANSWER,
    AgentModel,
    assert_engine_tokens_trained,
    base_group,
    engine_outputs,
    run_group,
    scripted_episode,
)

from protocol_adapters import Vocabulary
from protocol_adapters.testing import EngineDouble, Faults, ScriptedReply
from protocol_adapters.testing.stack import VocabularyTokenizer
from slime_backend import (
    AdapterSettings,
    AgentSettings,
    BackendSettings,
    ConfigError,
    ConversionOptions,
    EpisodeSettings,
    StaleAction,
    StalenessPolicy,
)
from slime_backend._rollout_args import ARGS_READ
from slime_backend.gate_hook import check_rollout_batch
from slime_backend.generate import SlimeGenerate, make_generate
from slime_backend.reward_hook import post_process_rewards
from slime_backend.testing import StandInSample, slime_args, slime_sampling_params

CONTRACT_FLAGS = Path(__file__).resolve().parent / "data" / "slime_contract.json"


def logprob(position: int, token: int) -> float:
    """Distinct per position and token, so a misplaced logprob cannot pass."""
    return -((position * 7 + token) % 50) / 16 - 0.001


def settings(**episode: Any) -> BackendSettings:
    return BackendSettings(
        EpisodeSettings(
            "rollout_kit.generate",
            **{"wall_clock_s": 60.0, "max_turns": 20, "grace_s": 30.0, **episode},
        ),
        AgentSettings("scripted"),
        adapter=AdapterSettings(check_sample_rate=1.0),
    )


@pytest.fixture
async def model(qwen_vocabulary: Vocabulary) -> AsyncIterator[tuple[EngineDouble, AgentModel]]:
    agent = AgentModel(qwen_vocabulary)
    async with EngineDouble(
        VocabularyTokenizer(qwen_vocabulary), agent, logprob=logprob, incremental_streaming=True
    ) as double:
        agent.double = double
        yield double, agent


@pytest.fixture
async def generate() -> AsyncIterator[SlimeGenerate]:
    function = make_generate(scripted_episode, sample_class=StandInSample)
    yield function
    await function.aclose()


def episode_record(samples: Sequence[StandInSample]) -> dict[str, Any]:
    record: dict[str, Any] = samples[0].metadata["agent_rl"]["episode"]
    return record


async def test_a_rollout_step_through_the_generate_function(
    model: tuple[EngineDouble, AgentModel], generate: SlimeGenerate, qwen_checkpoint: Path
) -> None:
    double, agent = model
    args = slime_args(double.url, qwen_checkpoint, settings())
    params = slime_sampling_params(args)
    payloads: list[dict[str, Any]] = [
        {"reward": 1.0, "repo": "demo"},
        {"reward": 0.0, "subagent": True},
    ]
    groups = [base_group(g, 4, 100 + 10 * g, payloads) for g in range(2)]
    batch = await asyncio.gather(*(run_group(generate, args, g, params) for g in groups))

    adapters = set()
    for group, results in zip(groups, batch, strict=True):
        assert len(results) == 4
        for base, samples in zip(group, results, strict=True):
            assert isinstance(samples, list)
            assert len(samples) == (2 if base.metadata.get("subagent") else 1)
            episode = episode_record(samples)
            assert episode["status"] == "completed"
            assert episode["rollout"]["worker"] == "local"
            assert episode["rollout"]["engine_failures"] == 0
            assert 0 <= episode["rollout"]["convert_s"] < episode["rollout"]["run_s"] + 1
            assert 0 < episode["rollout"]["app_s"] <= episode["rollout"]["episode_s"]
            adapters.add(episode["rollout"]["adapter"])
            for sample in samples:
                assert isinstance(sample, StandInSample)
                assert sample.rollout_id == sample.index == base.index
                assert sample.group_index == base.group_index
                assert sample.session_id == base.session_id
                assert sample.status is StandInSample.Status.COMPLETED
                assert not sample.remove_sample
                assert sample.reward == base.metadata["reward"]
                assert sample.weight_versions
                assert set(sample.weight_versions) == {"default"}
                assert {k: v for k, v in sample.metadata.items() if k != "agent_rl"} == (
                    base.metadata
                )
            main = samples[0]
            assert FINAL_ANSWER in main.response
            assert_engine_tokens_trained(samples, double, agent)
    assert len(adapters) == 1, "one adapter per process"

    sent = double.requests
    assert len(sent) == 8 * 3 + 4  # 3 main-agent calls per episode, 1 sub-agent call for 4
    assert {r.sampling_params["temperature"] for r in sent} == {0.7}  # the rollout's, not 0.3
    assert all(0 < int(r.sampling_params["max_new_tokens"]) <= 512 for r in sent)  # type: ignore[call-overload]

    flat = [s for results in batch for samples in results for s in samples]
    raw, rewards = post_process_rewards(args, flat)
    assert raw == [s.reward for s in flat]
    for group, results in zip(groups, batch, strict=True):
        # Episodes with reward 1 and 0, two of each per group: +-1/std(1,1,0,0), whatever the
        # number of samples each returned.
        values = {rewards[flat.index(samples[0])] for samples in results}
        assert len(values) == 2
        assert abs(sum(values)) < 1e-9
        del group
    check_rollout_batch(args, list(batch))
    assert "gates" in flat[0].metadata["agent_rl"]


async def test_the_signature_is_what_slime_inspects_and_the_app_attribute_loads(
    generate: SlimeGenerate,
) -> None:
    parameters = inspect.signature(generate).parameters
    assert list(parameters) == ["args", "sample", "sampling_params", "evaluation"]
    assert parameters["evaluation"].default is False
    import importlib

    module, _, attribute = "rollout_kit.generate".rpartition(".")  # slime's load_function
    loaded = getattr(importlib.import_module(module), attribute)
    assert isinstance(loaded, SlimeGenerate)
    assert loaded.episode is scripted_episode


def test_every_args_field_read_is_one_slime_defines() -> None:
    contract = json.loads(CONTRACT_FLAGS.read_text())
    flags = set(contract["flags"]) | set(contract["mounted"])
    assert [n for n in ARGS_READ if "--" + n.replace("_", "-") not in flags] == []


async def test_evaluation_returns_one_sample_per_episode_and_a_session_of_its_own(
    model: tuple[EngineDouble, AgentModel], generate: SlimeGenerate, qwen_checkpoint: Path
) -> None:
    double, _ = model
    args = slime_args(double.url, qwen_checkpoint, settings())
    group = base_group(0, 2, 0, [{"reward": 1.0, "subagent": True}])
    results = await run_group(generate, args, group, slime_sampling_params(args), evaluation=True)
    for base, samples in zip(group, results, strict=True):
        assert len(samples) == 1
        assert base.session_id is not None
        assert base.session_id.startswith("eval-")
        assert samples[0].session_id == base.session_id
        assert episode_record(samples)["rollout"]["evaluation"] is True


# -- weight versions and the staleness policy --------------------------------------------------


@pytest.mark.parametrize(
    ("versions", "policy", "expected"),
    [
        (["5", "5", "6"], StalenessPolicy(1, StaleAction.MASK), "all trained"),
        (["1", "3", "3"], StalenessPolicy(1, StaleAction.KEEP), "all trained"),
        (["1", "3", "3"], StalenessPolicy(1, StaleAction.MASK), "first masked"),
        (["default", "2", "2"], StalenessPolicy(1, StaleAction.ABORT), "aborted"),
    ],
)
async def test_weight_versions_are_recorded_and_the_staleness_policy_applied(
    model: tuple[EngineDouble, AgentModel],
    generate: SlimeGenerate,
    qwen_checkpoint: Path,
    versions: list[str],
    policy: StalenessPolicy,
    expected: str,
) -> None:
    double, agent = model
    agent.versions = versions
    base = settings()
    run = dataclasses.replace(base, conversion=ConversionOptions(staleness=policy))
    args = slime_args(double.url, qwen_checkpoint, run)
    (samples,) = await run_group(
        generate, args, base_group(0, 1, 0, [{"reward": 1.0}]), slime_sampling_params(args)
    )
    weights = episode_record(samples)["weights"]
    assert weights["versions"] == list(dict.fromkeys(versions))
    (sample,) = samples
    if expected == "aborted":
        assert sample.status is StandInSample.Status.ABORTED
        assert sample.remove_sample
        assert "span 2 weight updates" in episode_record(samples)["reason"]
        return
    record = sample.metadata["agent_rl"]["sample"]
    if expected == "all trained":
        assert sample.weight_versions == versions
        assert_engine_tokens_trained(samples, double, agent)
        assert "stale_weight_version" not in record["masked_tokens"]
        return
    first_prompt = next(p for p in agent.replies if len(p) == min(map(len, agent.replies)))
    first_output = engine_outputs(double, agent)[first_prompt][0]
    assert sample.weight_versions == ["3", "3"]
    assert record["stale_turns"] == [0]
    assert weights["masked_turns"] == [0]
    assert record["masked_tokens"]["stale_weight_version"] == len(first_output)
    start = len(sample.tokens) - sample.response_length
    assert sample.tokens[start : start + len(first_output)] == first_output
    assert sample.loss_mask is not None
    assert sample.loss_mask[: len(first_output)] == [0] * len(first_output)
    assert record["trained_tokens"] == sum(sample.loss_mask)


# -- faults end one episode, never the rollout ------------------------------------------------


def aborted_reason(samples: list[StandInSample]) -> str:
    (sample,) = samples
    assert sample.status is StandInSample.Status.ABORTED
    assert sample.remove_sample
    assert sample.reward == 0.0
    assert sample.loss_mask == [0]
    assert sample.rollout_log_probs == [0.0]
    reason = sample.metadata["agent_rl"]["sample"]["placeholder"]
    assert reason == episode_record(samples)["reason"]
    return str(reason)


async def test_an_unreachable_engine_aborts_each_episode_with_the_reason(
    generate: SlimeGenerate, qwen_checkpoint: Path
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens here once the probe closes
    args = slime_args(f"http://127.0.0.1:{port}", qwen_checkpoint, settings())
    group = base_group(0, 3, 0, [{"reward": 1.0}])
    for _ in range(2):  # a failed start is not cached: every call tries the router again
        results = await run_group(generate, args, group, slime_sampling_params(args))
        for samples in results:
            assert f"slime's router at http://127.0.0.1:{port} did not answer" in (
                aborted_reason(samples)
            )


async def test_an_engine_failing_the_agents_last_call_aborts_the_episode(
    model: tuple[EngineDouble, AgentModel], generate: SlimeGenerate, qwen_checkpoint: Path
) -> None:
    double, agent = model

    def fail_after_first(input_ids: Sequence[int]) -> ScriptedReply:
        double.faults = Faults(http_status=503, error_message="engine lost its GPU")
        return agent(input_ids)

    double.script = fail_after_first
    args = slime_args(double.url, qwen_checkpoint, settings())
    (samples,) = await run_group(
        generate,
        args,
        base_group(0, 1, 0, [{"reward": 0.0, "tolerate_errors": True}]),
        slime_sampling_params(args),
    )
    reason = aborted_reason(samples)
    assert "the engine failed the agent's last model call" in reason
    assert "engine lost its GPU" in reason
    assert episode_record(samples)["rollout"]["engine_failures"] == 1


async def test_an_episode_past_its_deadline_is_cancelled_and_aborted(
    model: tuple[EngineDouble, AgentModel], generate: SlimeGenerate, qwen_checkpoint: Path
) -> None:
    double, _ = model
    # The healthy episode's 0.3 s (and the ending's seconds) are an idle machine's.
    busy = slowdown()
    wall = 0.3 * busy
    args = slime_args(double.url, qwen_checkpoint, settings(wall_clock_s=wall, grace_s=wall))
    group = base_group(0, 2, 0, [{"hang": True}, {"reward": 1.0, "sleep_s": 0.0}])
    started = asyncio.get_running_loop().time()
    hung, done = await run_group(generate, args, group, slime_sampling_params(args))
    assert asyncio.get_running_loop().time() - started < 5 * busy
    assert f"no outcome within {wall + wall:g} s" in aborted_reason(hung)
    assert done[0].status is StandInSample.Status.COMPLETED


async def test_an_episode_that_raises_or_returns_garbage_is_aborted_with_the_reason(
    model: tuple[EngineDouble, AgentModel], generate: SlimeGenerate, qwen_checkpoint: Path
) -> None:
    double, _ = model
    args = slime_args(double.url, qwen_checkpoint, settings())
    group = base_group(0, 2, 0, [{"raise": True}, {"reward": 1.0}])
    raised, fine = await run_group(generate, args, group, slime_sampling_params(args))
    assert aborted_reason(raised) == "the episode raised RuntimeError: grading crashed"
    assert fine[0].status is StandInSample.Status.COMPLETED

    async def garbage(*_: Any, **__: Any) -> Any:
        return 1.0

    other = make_generate(garbage, sample_class=StandInSample)
    try:
        (samples,) = await run_group(
            other, args, base_group(1, 1, 9, [{}]), slime_sampling_params(args)
        )
    finally:
        await other.aclose()
    assert aborted_reason(samples) == "the episode returned float, not an EpisodeOutcome"


# -- bad configuration: one error naming the field, before any episode runs -------------------


def _without(args: SimpleNamespace, name: str) -> SimpleNamespace:
    values = dict(vars(args))
    del values[name]
    return SimpleNamespace(**values)


def _user_only_template(checkpoint: Path) -> str:
    """A copy of the checkpoint whose chat template renders only user messages (the bridge
    cannot serve it in any mode)."""
    copy = checkpoint.parent / "user-only"
    if not copy.exists():
        shutil.copytree(checkpoint, copy)
        config = json.loads((copy / "tokenizer_config.json").read_text())
        config["chat_template"] = (
            "{% for m in messages %}{% if m.role == 'user' %}<|im_start|>user\n{{ m.content }}"
            "<|im_end|>\n{% endif %}{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
        )
        (copy / "tokenizer_config.json").write_text(json.dumps(config))
    return str(copy)


BAD_ARGS = [
    (
        lambda a, c: _without(a, "hf_checkpoint"),
        r"^args\.hf_checkpoint: is not set .*--hf-checkpoint",
    ),
    (
        lambda a, c: SimpleNamespace(**{**vars(a), "hf_checkpoint": str(c.parent / "missing")}),
        r"^args\.hf_checkpoint: .*missing: not a directory",
    ),
    (
        lambda a, c: SimpleNamespace(**{**vars(a), "hf_checkpoint": _user_only_template(c)}),
        r"(?s)^args\.hf_checkpoint: chat template .* is unusable.*drops assistant replies",
    ),
    (lambda a, c: _without(a, "sglang_router_port"), r"^args\.sglang_router_port: is not set"),
    (
        lambda a, c: SimpleNamespace(**{**vars(a), "sglang_tool_call_parser": None}),
        r"^args\.sglang_tool_call_parser: None is not a tool-call format",
    ),
    (
        lambda a, c: SimpleNamespace(**{**vars(a), "sglang_reasoning_parser": "kimi"}),
        r"^args\.sglang_reasoning_parser: 'kimi' is not a reasoning format",
    ),
    (
        lambda a, c: SimpleNamespace(**{**vars(a), "rollout_max_context_len": 10**6}),
        r"^args\.rollout_max_context_len: .*larger than the engine's context length",
    ),
    (lambda a, c: _without(a, "agent_rl"), r"^agent_rl: expected a table"),
    (
        lambda a, c: SimpleNamespace(
            **{**vars(a), "agent_rl": {**a.agent_rl, "workers": {"mode": "slurm"}}}
        ),
        r"^agent_rl\.workers\.mode: expected one of 'local', 'ray'",
    ),
]


@pytest.mark.parametrize(("mutate", "message"), BAD_ARGS)
async def test_bad_args_are_one_error_naming_the_field(
    model: tuple[EngineDouble, AgentModel],
    generate: SlimeGenerate,
    qwen_checkpoint: Path,
    mutate: Any,
    message: str,
) -> None:
    double, _ = model
    args = mutate(slime_args(double.url, qwen_checkpoint, settings()), qwen_checkpoint)
    with pytest.raises(ConfigError, match=message):
        await generate(args, base_group(0, 1, 0, [{}])[0], slime_sampling_params(args))
    assert double.requests == []


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"stop": ["</answer>", ""]}, r"^sampling_params\.stop: expected non-empty strings"),
        ({"min_p": 1.5}, r"^sampling_params\.min_p: must be in \[0, 1\], got 1\.5"),
        ({"stop_token_ids": [42]}, r"^sampling_params\.stop_token_ids: \[42\] are not tokens"),
        ({"custom_params": {"return_top_p_token_ids": True}}, r"^sampling_params\.custom_params"),
        ({"sampling_seed": 7}, r"^sampling_params\.sampling_seed: 7 cannot be applied"),
        ({"repetition_penalty": 1.1}, r"^sampling_params\.repetition_penalty"),
        ({"max_new_tokens": 0}, r"^sampling_params\.max_new_tokens: must be a positive int"),
        ({"temperature": "hot"}, r"^sampling_params\.temperature: expected a number"),
        ({"beam_width": 2}, r"^sampling_params\.beam_width: is not a sampling parameter"),
    ],
)
async def test_sampling_the_adapters_cannot_apply_is_refused_by_name(
    model: tuple[EngineDouble, AgentModel],
    generate: SlimeGenerate,
    qwen_checkpoint: Path,
    change: dict[str, Any],
    message: str,
) -> None:
    double, _ = model
    args = slime_args(double.url, qwen_checkpoint, settings())
    params = {**slime_sampling_params(args), **change}
    with pytest.raises(ConfigError, match=message):
        await generate(args, base_group(0, 1, 0, [{}])[0], params)
    allowed = {**slime_sampling_params(args), "stop_token_ids": [151645], "stop": []}
    (samples,) = await run_group(generate, args, base_group(0, 1, 0, [{"reward": 1.0}]), allowed)
    assert samples[0].status is StandInSample.Status.COMPLETED


async def test_an_episode_is_held_to_its_generation_budget(
    model: tuple[EngineDouble, AgentModel], qwen_checkpoint: Path
) -> None:
    """``episode.max_episode_new_tokens``: the engine generates at most that many tokens for
    the episode, every call's cap cut to what is left (the refusal past it: test_engine_tap)."""
    double, _ = model
    generate = make_generate(scripted_episode, sample_class=StandInSample)
    args = slime_args(double.url, qwen_checkpoint, settings(max_episode_new_tokens=40))
    payload = {"reward": 1.0, "tolerate_errors": True}
    try:
        (samples,) = await run_group(
            generate, args, base_group(0, 1, 0, [payload]), slime_sampling_params(args)
        )
    finally:
        await generate.aclose()
    caps = [int(str(r.sampling_params["max_new_tokens"])) for r in double.requests]
    # The first reply took part of the 40; the second was cut to the rest and ended there.
    assert caps[0] == 40
    assert 0 < caps[1] < 40
    assert episode_record(samples)["generated_tokens"] == 40
    assert samples[0].status is StandInSample.Status.TRUNCATED


async def test_stop_strings_min_p_and_top_k_reach_the_engine(
    model: tuple[EngineDouble, AgentModel], generate: SlimeGenerate, qwen_checkpoint: Path
) -> None:
    """slime's ``--rollout-stop`` and ``--rollout-top-k``, and a ``min_p`` (no slime flag; a
    caller driving the generate function sets it), in every engine call of the episode."""
    double, _ = model
    args = slime_args(double.url, qwen_checkpoint, settings())
    params = {**slime_sampling_params(args), "top_k": 20, "min_p": 0.05}
    params["stop"] = ["</answer>", "</answer>"]
    (samples,) = await run_group(generate, args, base_group(0, 1, 0, [{"reward": 1.0}]), params)
    assert samples[0].status is StandInSample.Status.COMPLETED
    assert double.requests
    for request in double.requests:
        sent = request.sampling_params
        assert (sent["top_k"], sent["min_p"], sent["stop"]) == (20, 0.05, ["</answer>"])


async def test_closing_stops_the_adapter(
    model: tuple[EngineDouble, AgentModel], qwen_checkpoint: Path
) -> None:
    double, _ = model
    generate = make_generate(scripted_episode, sample_class=StandInSample)
    args = slime_args(double.url, qwen_checkpoint, settings())
    (samples,) = await run_group(
        generate, args, base_group(0, 1, 0, [{"reward": 1.0}]), slime_sampling_params(args)
    )
    url = episode_record(samples)["rollout"]["adapter"]
    host, _, port = url.removeprefix("http://").rpartition(":")
    await generate.aclose()
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection(host, int(port))


EXIT_SCRIPT = """
import asyncio, atexit, sys, threading, time
from pathlib import Path

from protocol_adapters.testing import EngineDouble, Faults
from protocol_adapters.testing.stack import VocabularyTokenizer
from protocol_adapters import load_checkpoint
from rollout_kit import AgentModel, base_group, scripted_episode
from slime_backend import AgentSettings, BackendSettings, EpisodeSettings
from slime_backend.generate import make_generate
from slime_backend.testing import StandInSample, slime_args, slime_sampling_params

checkpoint = Path(sys.argv[1])
vocabulary = load_checkpoint(checkpoint).vocabulary
loop = asyncio.new_event_loop()  # slime's rollout loop: forever, in a daemon thread
threading.Thread(target=loop.run_forever, daemon=True).start()
tokenizer = VocabularyTokenizer(vocabulary)
double = EngineDouble(tokenizer, AgentModel(vocabulary), faults=Faults(hang=True))
url = asyncio.run_coroutine_threadsafe(double.start(), loop).result()
atexit.register(lambda: print("aborted at exit:", len(double.aborts), flush=True))
args = slime_args(url, checkpoint, BackendSettings(EpisodeSettings("a.b"), AgentSettings("x")))
generate = make_generate(scripted_episode, sample_class=StandInSample)
sample = base_group(0, 1, 0, [{}])[0]
sample.session_id = "at-exit"
asyncio.run_coroutine_threadsafe(generate(args, sample, slime_sampling_params(args)), loop)
while not double.requests:
    time.sleep(0.02)
print("generating", flush=True)
sys.exit(0)
"""


def test_interpreter_exit_closes_the_adapter_and_aborts_what_is_generating(
    qwen_checkpoint: Path, tmp_path: Path
) -> None:
    """slime runs the generate function on a loop in a daemon thread that is still running when
    the interpreter exits: the adapter closes on it then, and the engine is told to abort the
    generation an unfinished episode left (an orphan would outlive the rollout on the GPU)."""
    import os
    import subprocess
    import sys

    script = tmp_path / "exit.py"
    script.write_text(EXIT_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent)}
    done = subprocess.run(
        [sys.executable, str(script), str(qwen_checkpoint)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert done.stdout.splitlines() == ["generating", "aborted at exit: 1"], done.stderr[-2000:]
    assert done.returncode == 0
