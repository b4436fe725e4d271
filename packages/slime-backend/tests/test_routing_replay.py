"""Routing replay: ``rollout_routed_experts`` row for row from the calls that computed each
position, samples without complete routing refused with their missing rows, and the gate."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import numpy
import pytest
from episode_kit import Recorder, base_sample, system, tool, user

from slime_backend import (
    NAMESPACE,
    AgentSettings,
    BackendSettings,
    ConfigError,
    ConversionOptions,
    EpisodeOutcome,
    EpisodeSettings,
    GateConfig,
    SilentFailureAlarm,
    episode_samples,
)
from slime_backend._rollout_args import RolloutArgs
from slime_backend._routing_replay import RoutingReplay
from slime_backend.gate_hook import check_rollout_batch
from slime_backend.testing import StandInSample
from trajectory_tree import SessionTree, linearize

SHAPE = (3, 2)  # layers, top-k
REPLAY = RoutingReplay(*SHAPE)
Status = StandInSample.Status


def convert(
    tree: SessionTree,
    replay: RoutingReplay | None = REPLAY,
    options: ConversionOptions | None = None,
    index: int = 7,
) -> list[StandInSample]:
    return episode_samples(
        tree,
        base_sample(index=index),
        EpisodeOutcome(1.0),
        options or ConversionOptions(),
        sample_class=StandInSample,
        replay=replay,
    )


def agent(recorder: Recorder, steps: int = 3, *, gap_at: int | None = None) -> Recorder:
    """A main agent of ``steps`` calls, each returning routing; the call ``gap_at`` starts
    returning it 3 positions late (a cache hit the engine did not report: the next call on the
    branch would be asked to start at the gap, so only a gap in the last call stays)."""
    messages = [system("main agent"), user("fix the bug")]
    for step in range(steps):
        start = None
        if step == gap_at:
            previous = recorder.last.routed_experts
            assert previous is not None
            start = previous.end + 3
        reply = recorder.turn(messages, f"step {step}", calls=1, routing=SHAPE, routing_from=start)
        messages = [*messages, reply, tool(f"call-{step}-0", f"out {step}")]
    return recorder


def rows_from_calls(tree: SessionTree, sample: StandInSample) -> list[list[list[int]]]:
    """Each position's row from the first call on the sample's branch that returned it, read
    from the turns themselves (not from trajectory-tree's assembled rows)."""
    record = sample.metadata[NAMESPACE]["sample"]
    branch = sorted(record["trained_turns"] + record["context_turns"])
    layers, topk = SHAPE
    rows = []
    for position in range(len(sample.tokens) - 1):
        routed = next(
            r
            for t in branch
            if (r := tree.turns[t].routed_experts) is not None and r.start <= position < r.end
        )
        flat = routed.experts[(position - routed.start) * layers * topk :][: layers * topk]
        rows.append([list(flat[layer * topk : (layer + 1) * topk]) for layer in range(layers)])
    return rows


def test_every_row_is_the_routing_of_the_call_that_computed_it() -> None:
    recorder = agent(Recorder())
    (sample,) = convert(recorder.tree)
    experts = sample.rollout_routed_experts
    assert isinstance(experts, numpy.ndarray)
    assert experts.dtype == numpy.int32
    assert experts.shape == (len(sample.tokens) - 1, *SHAPE)
    assert experts.tolist() == rows_from_calls(recorder.tree, sample)
    assert len({r.routed_experts.start for r in recorder.tree.turns if r.routed_experts}) == 3
    assert sample.metadata[NAMESPACE]["episode"]["routing"] == {
        "replay": True,
        "layers": 3,
        "topk": 2,
        "refused": [],
    }


def test_each_branch_gets_its_own_rows() -> None:
    recorder = Recorder()
    task = [system("main"), user("task")]
    plan = recorder.turn(task, "plan", routing=SHAPE)
    recorder.turn([*task, plan, user("try A")], "A", routing=SHAPE)
    recorder.turn([*task, plan, user("try B")], "B", routing=SHAPE)
    samples = convert(recorder.tree)
    assert len(samples) == 2
    for sample in samples:
        assert sample.rollout_routed_experts.shape == (len(sample.tokens) - 1, *SHAPE)
        assert sample.rollout_routed_experts.tolist() == rows_from_calls(recorder.tree, sample)


def test_a_truncated_sample_keeps_the_routing_of_its_kept_tokens() -> None:
    recorder = agent(Recorder())
    (whole,) = convert(recorder.tree)
    cut = len(whole.tokens) - 20
    (sample,) = convert(recorder.tree, options=ConversionOptions(max_sample_tokens=cut))
    assert sample.status is Status.TRUNCATED
    assert sample.rollout_routed_experts.shape == (cut - 1, *SHAPE)
    expected = whole.rollout_routed_experts[: cut - 1].tolist()
    assert sample.rollout_routed_experts.tolist() == expected


def test_replay_off_leaves_the_field_empty_even_with_routing_captured() -> None:
    (sample,) = convert(agent(Recorder()).tree, replay=None)
    assert sample.rollout_routed_experts is None
    assert sample.metadata[NAMESPACE]["episode"]["routing"] == {"replay": False}


def placeholder_reason(samples: list[StandInSample]) -> str:
    (sample,) = samples
    assert sample.status is Status.ABORTED
    assert sample.remove_sample
    # slime tensorizes every sample's routing once the first has some: the placeholder too.
    assert sample.rollout_routed_experts.shape == (1, *SHAPE)
    assert sample.rollout_routed_experts.tolist() == [[[0, 1]] * 3]
    record = sample.metadata[NAMESPACE]["episode"]
    assert (record["samples"], record["trained_tokens"]) == (0, 0)
    reason: str = record["reason"]
    assert sample.metadata[NAMESPACE]["sample"] == {"placeholder": reason}
    return reason


def test_a_sample_with_gaps_is_not_trained_and_its_reason_names_the_missing_rows() -> None:
    recorder = agent(Recorder(), gap_at=2)
    before = recorder.tree.turns[1].routed_experts
    assert before is not None
    first_missing = before.end
    (sample,) = samples = convert(recorder.tree)
    rows = len(linearize(recorder.tree).samples[0].tokens) - 1
    reason = placeholder_reason(samples)
    assert reason == (
        "nothing_trainable: routing_missing: routing replay is on and no sample has routing for "
        f"every token (1 samples; sample 0 (leaf turn 2): no routing for rows {first_missing}-"
        f"{first_missing + 2} (3 of {rows} rows): no engine call on its branch returned them)"
    )
    (refused,) = sample.metadata[NAMESPACE]["episode"]["routing"]["refused"]
    assert (refused["position"], refused["leaf_turn"]) == (0, 2)
    assert reason.endswith(f"(leaf turn 2): {refused['reason']})")


def test_only_the_sample_with_gaps_is_dropped() -> None:
    recorder = Recorder()
    task = [system("main"), user("task")]
    plan = recorder.turn(task, "plan", routing=SHAPE)
    recorder.turn([*task, plan, user("try A")], "A", routing=SHAPE)
    planned = recorder.tree.turns[0].routed_experts
    assert planned is not None
    recorder.turn([*task, plan, user("try B")], "B", routing=SHAPE, routing_from=planned.end + 2)
    (sample,) = convert(recorder.tree)
    assert sample.status is Status.COMPLETED
    assert sample.metadata[NAMESPACE]["sample"]["leaf_turn"] == 1
    assert sample.rollout_routed_experts.tolist() == rows_from_calls(recorder.tree, sample)
    episode = sample.metadata[NAMESPACE]["episode"]
    assert episode["samples"] == 1
    (refused,) = episode["routing"]["refused"]
    assert refused["leaf_turn"] == 2
    assert refused["reason"].startswith(
        f"no routing for rows {planned.end}-{planned.end + 1} (2 of "
    )


def test_replay_on_with_capture_off_is_refused_clearly() -> None:
    recorder = Recorder()
    recorder.turn([system("s"), user("t")], "an answer")  # no routing returned
    reason = placeholder_reason(convert(recorder.tree))
    assert reason.startswith("nothing_trainable: routing_missing: ")
    assert "no routing for any of its" in reason
    assert "--enable-return-routed-experts" in reason


def test_routing_of_the_wrong_shape_names_slimes_flags() -> None:
    (sample,) = convert(agent(Recorder()).tree, replay=RoutingReplay(4, 2))
    assert sample.status is Status.ABORTED
    assert sample.rollout_routed_experts.shape == (1, 4, 2)
    assert (
        "routing of 3 layers x top-2, but slime's args say --num-layers 4"
        in (sample.metadata[NAMESPACE]["episode"]["reason"])
    )


def gate_args(gates: GateConfig) -> SimpleNamespace:
    settings = BackendSettings(
        EpisodeSettings("app.episodes.run"), AgentSettings("claude-code"), gates=gates
    )
    return SimpleNamespace(**json.loads(settings.custom_config()))


def test_the_gate_stops_a_run_whose_routing_is_systematically_missing() -> None:
    without = Recorder()
    without.turn([system("s"), user("t")], "an answer", calls=1)
    data: list[Any] = [
        [convert(without.tree, index=i) for i in range(3)],
        [convert(agent(Recorder(seed=9)).tree, index=3)],
    ]
    with pytest.raises(SilentFailureAlarm, match="routing_missing: 3/4 episodes") as raised:
        check_rollout_batch(gate_args(GateConfig(max_zero_trainable_share=1.0)), data)
    (gate,) = raised.value.report.tripped
    assert gate.name == "routing_missing"
    assert gate.causes == (("nothing_trainable", 3),)
    assert "--enable-return-routed-experts" in gate.example
    healthy = [[convert(agent(Recorder(seed=i)).tree, index=i) for i in range(4)]]
    check_rollout_batch(gate_args(GateConfig()), healthy)
    assert healthy[0][0][0].metadata[NAMESPACE]["gates"]["routing_missing"]["offending"] == 0


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({}, None),
        ({"use_rollout_routing_replay": False, "num_layers": 48}, None),
        ({"use_rollout_routing_replay": True, "num_layers": 48, "moe_router_topk": 8}, (48, 8)),
    ],
)
def test_slimes_replay_flag_sets_the_shape(
    overrides: dict[str, Any], expected: tuple[int, int] | None
) -> None:
    args = rollout_args(**overrides)
    replay = RolloutArgs.from_args(args).routing_replay
    assert (None if replay is None else (replay.layers, replay.topk)) == expected


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"num_layers": None}, r"^args\.num_layers: is not set \(slime's --num-layers\)"),
        ({"moe_router_topk": 0}, r"^args\.moe_router_topk: must be a positive int"),
    ],
)
def test_replay_without_its_shape_is_a_config_error(
    overrides: dict[str, Any], message: str
) -> None:
    args = rollout_args(use_rollout_routing_replay=True, num_layers=48, moe_router_topk=8)
    for name, value in overrides.items():
        setattr(args, name, value)
    with pytest.raises(ConfigError, match=message):
        RolloutArgs.from_args(args)


def rollout_args(**overrides: Any) -> SimpleNamespace:
    return SimpleNamespace(
        hf_checkpoint="/ckpt",
        sglang_router_ip="127.0.0.1",
        sglang_router_port=3000,
        sglang_tool_call_parser="qwen25",
        sglang_reasoning_parser=None,
        rollout_max_context_len=None,
        **overrides,
    )
