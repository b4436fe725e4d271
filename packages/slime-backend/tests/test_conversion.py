"""Session tree + outcome -> slime samples: every field slime reads, checked against the tree."""

from __future__ import annotations

import copy
import json
import math
import pickle
from importlib import resources
from types import SimpleNamespace
from typing import Any

import pytest
from episode_kit import (
    Recorder,
    base_sample,
    fan_out,
    logprobs_of,
    mask_of,
    system,
    tool,
    user,
)

from slime_backend import (
    NAMESPACE,
    ConfigError,
    ConversionError,
    ConversionOptions,
    EpisodeHealth,
    EpisodeOutcome,
    EpisodeStatus,
    episode_samples,
    from_mapping,
)
from slime_backend._conversion import PLACEHOLDER_TOKENS
from slime_backend.reward_hook import post_process_rewards
from slime_backend.testing import StandInSample
from trajectory_tree import (
    FinishReason,
    LengthMode,
    RewardPolicy,
    SessionTree,
    linearize,
    loads,
    summarize,
)

Status = StandInSample.Status


def convert(
    tree: SessionTree,
    outcome: EpisodeOutcome | None = None,
    options: ConversionOptions | None = None,
    base: StandInSample | None = None,
    **kwargs: Any,
) -> list[StandInSample]:
    return episode_samples(
        tree,
        base or base_sample(),
        outcome or EpisodeOutcome(1.0),
        options or ConversionOptions(),
        sample_class=StandInSample,
        **kwargs,
    )


def demo_tree() -> SessionTree:
    """A real Claude Code session recorded through the adapter (Qwen3 ids, engine logprobs)."""
    return loads(resources.files("trajectory_tree").joinpath("demo_session.json").read_text())


def test_a_real_claude_code_session_becomes_one_exact_sample() -> None:
    tree = demo_tree()
    (lin_sample,) = linearize(tree).samples
    (sample,) = convert(tree, EpisodeOutcome(1.0, artifacts={"tests_passed": 3}))

    assert sample.tokens == lin_sample.tokens.tolist()
    start = lin_sample.prompt_length
    assert sample.response_length == len(sample.tokens) - start
    assert len(mask_of(sample)) == len(logprobs_of(sample)) == sample.response_length
    assert mask_of(sample)[0] == 1  # the response region starts at the first trained token
    assert mask_of(sample) == lin_sample.loss_mask[start:].tolist()
    # Trained positions carry the engine's logprobs, turn by turn, in order; the rest carry 0.0.
    engine = [lp for turn in tree.turns for lp in turn.output_logprobs]
    assert [lp for lp, m in zip(logprobs_of(sample), mask_of(sample), strict=True) if m] == engine
    assert all(
        lp == 0.0 for lp, m in zip(logprobs_of(sample), mask_of(sample), strict=True) if not m
    )
    assert sum(mask_of(sample)) == summarize(tree).generated_tokens
    assert sample.status is Status.COMPLETED
    assert sample.reward == 1.0
    assert sample.rollout_id == sample.index == 7
    assert sample.weight_versions == ["default"] * 3
    episode = sample.metadata[NAMESPACE]["episode"]
    assert episode["tool_calls"] == 3
    assert episode["trained_tokens"] == sum(mask_of(sample))
    assert episode["artifacts"] == {"tests_passed": 3}
    assert sample.metadata[NAMESPACE]["sample"]["masked_tokens"] == {
        str(r): n for r, n in lin_sample.masked_tokens().items()
    }


def test_fan_out_gives_one_sample_per_branch_sharing_the_episode() -> None:
    rec = fan_out(Recorder())
    base = base_sample(index=11, group_index=4)
    samples = convert(rec.tree, EpisodeOutcome(0.5), base=base)

    assert len(samples) == 3
    for s in samples:
        assert (s.rollout_id, s.index, s.group_index) == (11, 11, 4)
        assert (s.prompt, s.label, s.session_id) == (base.prompt, base.label, base.session_id)
        assert s.reward == 0.5
        assert s.metadata["repo"] == "demo/repo"  # the task payload, verbatim
        assert s.metadata[NAMESPACE]["episode"]["samples"] == 3
    # Every generated token is trained exactly once across the branches.
    assert sum(sum(mask_of(s)) for s in samples) == sum(t.output_length for t in rec.tree.turns)
    trained = [set(s.metadata[NAMESPACE]["sample"]["trained_turns"]) for s in samples]
    assert set.union(*trained) == {0, 1, 2, 3, 4}
    assert sum(map(len, trained)) == 5


def test_the_base_sample_is_left_untouched() -> None:
    base = base_sample()
    before = copy.deepcopy(base)
    convert(fan_out(Recorder()).tree, base=base)
    assert base == before


def test_samples_are_plain_picklable_data() -> None:
    samples = convert(fan_out(Recorder()).tree, EpisodeOutcome(1.0, artifacts={"diff_lines": 12}))
    for sample in samples:
        assert pickle.loads(pickle.dumps(sample)) == sample
        json.dumps(sample.metadata)  # no enums, arrays or dataclasses hiding in the provenance
        assert type(sample.tokens) is list
        assert type(logprobs_of(sample)) is list


def test_masked_generated_tokens_carry_zero_logprobs() -> None:
    """A branch that shares a generated prefix trained elsewhere masks it with logprob 0.0."""
    rec = Recorder()
    task = [system("main"), user("task")]
    plan = rec.turn(task, "plan")
    rec.turn([*task, plan, user("try A")], "A")
    rec.turn([*task, plan, user("try B")], "B")
    first, second = convert(rec.tree)
    assert first.metadata[NAMESPACE]["sample"]["trained_turns"] == [0, 1]
    assert second.metadata[NAMESPACE]["sample"]["trained_turns"] == [2]
    # The shared plan lies before the second sample's first trained token: it is prompt there.
    assert second.metadata[NAMESPACE]["sample"]["context_turns"] == [0]
    assert second.response_length == len(rec.tree.output_ids(rec.tree.turns[2]))
    assert all(lp < 0 for lp in logprobs_of(second))


def test_an_aborted_turn_inside_the_response_is_masked_with_zero_logprobs() -> None:
    """The agent continued after a generation that was aborted: its tokens are context now,
    between two trained turns; slime must see mask 0 and logprob 0.0 there, not the engine's."""
    rec = Recorder()
    task = [system("s"), user("t")]
    r0 = rec.turn(task, "first")
    r1 = rec.turn([*task, r0, user("go on")], "cut short", finish=FinishReason.ABORT)
    rec.turn([*task, r0, user("go on"), r1, user("again")], "last")
    (sample,) = convert(rec.tree)
    aborted = rec.tree.output_ids(rec.tree.turns[1]).tolist()
    response = sample.tokens[-sample.response_length :]
    at = next(i for i in range(len(response)) if response[i : i + len(aborted)] == aborted)
    assert mask_of(sample)[at : at + len(aborted)] == [0] * len(aborted)
    assert logprobs_of(sample)[at : at + len(aborted)] == [0.0] * len(aborted)
    assert sample.metadata[NAMESPACE]["sample"]["masked_tokens"]["aborted"] == len(aborted)


def test_tokens_between_trained_turns_are_response_with_loss_zero() -> None:
    rec = Recorder()
    task = [system("main"), user("task")]
    r0 = rec.turn(task, "run ls", calls=1)
    rec.turn([*task, r0, tool("call-0-0", "a.py")], "done")
    (sample,) = convert(rec.tree)
    first, second = (len(rec.tree.output_ids(t)) for t in rec.tree.turns)
    gap = sample.response_length - first - second
    assert gap > 0  # the tool result and the next generation prompt
    assert mask_of(sample) == [1] * first + [0] * gap + [1] * second
    assert logprobs_of(sample)[first : first + gap] == [0.0] * gap
    masked = sample.metadata[NAMESPACE]["sample"]["masked_tokens"]
    assert masked["tool_output"] == len("tool:a.py")


@pytest.mark.parametrize(
    ("finish", "outcome_status", "limit", "expected"),
    [
        (FinishReason.STOP, EpisodeStatus.COMPLETED, None, None),
        (FinishReason.LENGTH, EpisodeStatus.COMPLETED, None, "max_new_tokens"),
        (FinishReason.STOP, EpisodeStatus.TRUNCATED, None, "episode_budget"),
        (FinishReason.STOP, EpisodeStatus.COMPLETED, 50, "sample_length_limit"),
    ],
)
def test_status_says_what_cut_the_sample(
    finish: FinishReason, outcome_status: EpisodeStatus, limit: int | None, expected: str | None
) -> None:
    rec = Recorder()
    rec.turn([system("s"), user("a long enough task description")], "an answer", finish=finish)
    outcome = EpisodeOutcome(0.0, outcome_status)
    (sample,) = convert(rec.tree, outcome, ConversionOptions(max_sample_tokens=limit))
    assert sample.status is (Status.TRUNCATED if expected else Status.COMPLETED)
    assert sample.metadata[NAMESPACE]["sample"]["truncated_by"] == expected
    if limit:
        assert len(sample.tokens) == limit


def untrainable(sample: StandInSample) -> dict[str, Any]:
    """The record of a graded episode left with nothing to train, after the checks every such
    placeholder must pass: one aborted placeholder, and a record that says so (no "completed"
    next to it) while keeping the graded reward and the app's status."""
    assert sample.status is Status.ABORTED
    assert sample.remove_sample
    assert sample.reward == 0.0  # the placeholder trains nothing and moves no baseline
    record: dict[str, Any] = sample.metadata[NAMESPACE]["episode"]
    assert record["status"] == "aborted"
    assert record["reason"].startswith("nothing_trainable: ")
    assert sample.metadata[NAMESPACE]["sample"] == {"placeholder": record["reason"]}
    assert (record["samples"], record["trained_tokens"]) == (0, 0)
    return record


def test_a_dropped_over_length_episode_is_recorded_as_a_length_drop_with_its_reward() -> None:
    rec = Recorder()
    rec.turn([system("s"), user("task")], "x" * 50)
    options = ConversionOptions(max_sample_tokens=10, length_mode=LengthMode.DROP)
    (sample,) = convert(rec.tree, EpisodeOutcome(1.0), options)
    record = untrainable(sample)
    assert record["reason"] == (
        "nothing_trainable: length_drop: every trained token was past the sample length limit "
        "(turns 1, generated tokens 51; excluded: over_length 51)"
    )
    assert (record["reward"], record["graded_status"]) == (1.0, "completed")
    assert record["excluded_tokens"] == {"over_length": 51}
    assert record["exclusions"] == [{"turn": 0, "reason": "over_length", "tokens": 51}]


def test_an_aborted_episode_is_one_untrainable_placeholder_with_its_provenance() -> None:
    rec = fan_out(Recorder())
    base = base_sample(index=5)
    (sample,) = convert(rec.tree, EpisodeOutcome.aborted("sandbox never started"), base=base)
    assert sample.status is Status.ABORTED
    assert sample.remove_sample
    assert sample.tokens == list(PLACEHOLDER_TOKENS)
    assert (sample.response_length, mask_of(sample), logprobs_of(sample)) == (1, [0], [0.0])
    assert sample.reward == 0.0
    assert sample.rollout_id == 5
    record = sample.metadata[NAMESPACE]
    assert record["sample"] == {"placeholder": "sandbox never started"}
    assert record["episode"]["trained_tokens"] == 0
    assert record["episode"]["samples"] == 0
    assert record["episode"]["tool_calls"] == 4  # what the agent did is still reported
    assert record["episode"]["reason"] == "sandbox never started"
    assert record["episode"]["graded_status"] == "aborted"


def test_an_episode_without_model_calls_is_recorded_as_having_nothing_to_train() -> None:
    (sample,) = convert(SessionTree("empty"), EpisodeOutcome(0.5, EpisodeStatus.TRUNCATED))
    record = untrainable(sample)
    assert record["reason"] == (
        "nothing_trainable: no_turns: the agent made no model call (turns 0, generated tokens 0)"
    )
    assert (record["reward"], record["graded_status"]) == (0.5, "truncated")
    assert record["turns"] == 0


def test_an_episode_whose_every_turn_was_aborted_says_so() -> None:
    rec = Recorder()
    rec.turn([system("s"), user("t")], "cut", finish=FinishReason.ABORT)
    (sample,) = convert(rec.tree)
    record = untrainable(sample)
    assert record["reason"].startswith(
        "nothing_trainable: aborted_turns: every model call was aborted (turns 1"
    )
    assert record["reason"].endswith("excluded: aborted 4)")
    assert record["reward"] == 1.0
    assert record["excluded_tokens"] == {"aborted": 4}


def test_the_gates_and_the_reward_hook_read_an_untrainable_episode_alike() -> None:
    """Out of the baseline by its placeholder's status, counted by the gates by its record."""
    rec = Recorder()
    rec.turn([system("s"), user("task")], "x" * 50)
    options = ConversionOptions(max_sample_tokens=10, length_mode=LengthMode.DROP)
    dropped = convert(rec.tree, EpisodeOutcome(1.0), options, base=base_sample(index=0))
    trained = convert(fan_out(Recorder()).tree, EpisodeOutcome(0.0), base=base_sample(index=1))
    args = SimpleNamespace(
        advantage_estimator="grpo", rewards_normalization=True, grpo_std_normalization=True
    )
    raw, values = post_process_rewards(args, [*dropped, *trained])
    assert raw[0] == 0.0
    assert values == [0.0] * len(values)  # one counted episode: advantage 0, nothing NaN
    record = dropped[0].metadata[NAMESPACE]["episode"]
    health = EpisodeHealth(
        EpisodeStatus(record["status"]), record["trained_tokens"], 0, 0, record["reason"]
    )
    assert (health.ran, health.aborted, health.length_dropped) == (True, False, True)


def test_final_branch_policy_keeps_one_sample_training_its_whole_path() -> None:
    rec = fan_out(Recorder())
    options = ConversionOptions(reward_policy=RewardPolicy.FINAL_BRANCH)
    (sample,) = convert(rec.tree, options=options)
    assert sample.metadata[NAMESPACE]["sample"]["trained_turns"] == [4]
    assert {e["reason"] for e in sample.metadata[NAMESPACE]["episode"]["exclusions"]} == {
        "not_final_branch"
    }


def test_split_reward_policy_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="reward_policy"):
        ConversionOptions(reward_policy=RewardPolicy.SPLIT)
    with pytest.raises(ConfigError, match=r"^conversion\.reward_policy: 'split' is not supported"):
        from_mapping(ConversionOptions, {"reward_policy": "split"}, "conversion")


def test_weight_versions_list_the_trained_turns() -> None:
    rec = Recorder()
    task = [system("s"), user("t")]
    r0 = rec.turn(task, "a", weight_version="w7")
    rec.turn([*task, r0, user("more")], "b", weight_version="w8")
    rec.turn(
        [*task, r0, user("more"), rec.tree.turns[1].reply, user("again")], "c", weight_version=None
    )
    (sample,) = convert(rec.tree)
    assert sample.weight_versions == ["w7", "w8"]


def test_decode_fills_the_readable_response() -> None:
    rec = Recorder()
    rec.turn([system("s"), user("t")], "hello")
    seen: list[list[int]] = []

    def decode(ids: Any) -> str:
        seen.append(list(ids))
        return "<decoded>"

    (sample,) = convert(rec.tree, decode=decode)
    assert sample.response == "<decoded>"
    assert seen == [sample.tokens[-sample.response_length :]]


def test_a_base_sample_without_index_is_refused() -> None:
    base = base_sample()
    base.index = None
    with pytest.raises(ConversionError, match="no index"):
        convert(fan_out(Recorder()).tree, base=base)


def test_a_task_payload_using_our_namespace_is_refused() -> None:
    with pytest.raises(ConversionError, match=NAMESPACE):
        convert(fan_out(Recorder()).tree, base=base_sample(payload={NAMESPACE: 1}))


def test_a_non_finite_logprob_on_a_trained_token_is_refused() -> None:
    """-inf passes trajectory-tree (it is a log-probability) but would poison slime's importance
    ratios; the episode must be aborted instead of trained."""
    rec = Recorder()
    rec.turn([system("s"), user("t")], "x", logprob=-math.inf)
    with pytest.raises(ConversionError, match="-inf"):
        convert(rec.tree)
