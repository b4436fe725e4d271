"""Silent-failure gates: the shares, and the hook as slime calls it on a nested rollout batch."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
from episode_kit import Recorder, base_sample, fan_out, slime_loads_custom_config, system, user

from slime_backend import (
    NAMESPACE,
    AgentSettings,
    BackendSettings,
    ConfigError,
    ConversionOptions,
    EpisodeHealth,
    EpisodeOutcome,
    EpisodeSettings,
    EpisodeStatus,
    GateConfig,
    SilentFailureAlarm,
    episode_samples,
    evaluate_gates,
    from_mapping,
)
from slime_backend.gate_hook import check_rollout_batch
from slime_backend.testing import StandInSample
from trajectory_tree import LengthMode


def health(
    status: EpisodeStatus = EpisodeStatus.COMPLETED,
    trained: int = 10,
    calls: int = 3,
    malformed: int = 0,
) -> EpisodeHealth:
    return EpisodeHealth(status, trained, calls, malformed)


def test_each_gate_counts_its_share_of_episodes() -> None:
    episodes = [
        health(),
        health(EpisodeStatus.ABORTED, trained=0, calls=0),
        health(trained=0, calls=0),
        health(calls=1, malformed=1),  # half of the calls malformed
        health(calls=4, malformed=1),  # a fifth: not over a 0.2 rate
    ]
    report = evaluate_gates(episodes, GateConfig())
    shares = {r.name: (r.offending, r.episodes) for r in report.results}
    assert shares == {
        "zero_trainable": (2, 5),  # aborted episodes count here...
        "zero_tool_calls": (1, 4),  # ...but not among the episodes that ran
        "tool_call_parse_failures": (1, 4),
        "aborts": (1, 5),  # at its 0.2 limit: not over it
        "environment_aborts": (0, 5),  # aborted, but not for its environment
        "length_drops": (0, 5),
        "routing_missing": (0, 5),
    }
    assert [r.name for r in report.tripped] == ["zero_trainable", "tool_call_parse_failures"]


ENVIRONMENT_FAILURE = (
    "environment: the sandbox cannot start (image swebench/sweb.eval.x86_64.a_1776_b-1:latest): "
    "pulling the image failed: manifest unknown"
)


def test_a_run_whose_episodes_abort_for_their_environment_raises_an_alarm_naming_it() -> None:
    """Zeros that look like training: most tasks never ran. The alarm says why."""
    aborted = health(EpisodeStatus.ABORTED, trained=0, calls=0)
    episodes = [
        *[EpisodeHealth(*_fields(aborted), reason=ENVIRONMENT_FAILURE) for _ in range(6)],
        EpisodeHealth(*_fields(aborted), reason="running claude-code: exited 1"),
        *[health() for _ in range(3)],
    ]
    report = evaluate_gates(episodes, GateConfig())
    assert [r.name for r in report.tripped] == ["zero_trainable", "aborts", "environment_aborts"]
    environment = report.tripped[2]
    assert (environment.offending, environment.episodes) == (6, 10)
    assert environment.causes == (("environment", 6),)
    assert report.tripped[0].causes == (("environment", 6), ("running claude-code", 1))
    assert report.tripped[1].causes == report.tripped[0].causes
    described = report.describe()
    assert "environment_aborts: 6/10 episodes (60%) > limit 50% (aborted: environment 6" in (
        described
    )
    assert "manifest unknown" in described  # the example names what broke
    marks = report.as_dict()["environment_aborts"]
    assert isinstance(marks, dict)
    assert marks["causes"] == {"environment": 6}


def test_a_few_environment_aborts_are_no_alarm() -> None:
    aborted = EpisodeHealth(EpisodeStatus.ABORTED, 0, 0, 0, ENVIRONMENT_FAILURE)
    report = evaluate_gates([aborted, *[health() for _ in range(9)]], GateConfig())
    assert "environment_aborts" not in [r.name for r in report.tripped]


def _fields(episode: EpisodeHealth) -> tuple[EpisodeStatus, int, int, int]:
    return (
        episode.status,
        episode.trained_tokens,
        episode.tool_calls,
        episode.malformed_tool_calls,
    )


def test_a_share_equal_to_its_limit_does_not_trip() -> None:
    config = GateConfig(max_zero_trainable_share=0.5)
    assert not evaluate_gates([health(), health(trained=0)], config).tripped
    assert evaluate_gates([health(trained=0), health(trained=0)], config).tripped


def test_an_empty_batch_trips_nothing() -> None:
    assert not evaluate_gates([], GateConfig(max_zero_trainable_share=0.0)).tripped


@pytest.mark.parametrize(
    "name",
    [
        "max_zero_trainable_share",
        "parse_failure_rate",
        "max_abort_share",
        "max_length_drop_share",
        "max_routing_missing_share",
    ],
)
@pytest.mark.parametrize("value", [-0.1, 1.5, float("nan")])
def test_limits_outside_zero_to_one_are_refused_by_name(name: str, value: float) -> None:
    with pytest.raises(ConfigError, match=rf"^agent_rl\.gates\.{name}: must be a share"):
        from_mapping(GateConfig, {name: value}, "agent_rl.gates")


# -- the hook --------------------------------------------------------------------------------


def slime_args(gates: GateConfig) -> SimpleNamespace:
    """``args`` as slime builds it: our custom config file parsed with yaml.safe_load, each
    top-level key set as an attribute."""
    settings = BackendSettings(
        EpisodeSettings("app.episodes.run"), AgentSettings("claude-code"), gates=gates
    )
    return SimpleNamespace(**slime_loads_custom_config(settings.custom_config()))


def converted(index: int, recorder: Recorder, outcome: EpisodeOutcome) -> list[StandInSample]:
    base = base_sample(index=index, group_index=index // 2)
    return episode_samples(
        recorder.tree, base, outcome, ConversionOptions(), sample_class=StandInSample
    )


def quiet_episode(seed: int) -> Recorder:
    """An agent that talks but never calls a tool."""
    rec = Recorder(seed=seed)
    rec.turn([system("s"), user("t")], "I think the answer is 4")
    return rec


def rollout_batch() -> list[Any]:
    """Two prompt groups of two episodes, nested as slime's rollout function hands them over."""
    return [
        [
            converted(0, fan_out(Recorder(seed=0)), EpisodeOutcome(1.0)),
            converted(1, quiet_episode(1), EpisodeOutcome(0.0)),
        ],
        [
            converted(2, quiet_episode(2), EpisodeOutcome(0.0)),
            converted(3, fan_out(Recorder(seed=3)), EpisodeOutcome.aborted("grader crashed")),
        ],
    ]


def test_the_hook_marks_every_sample_and_logs_a_tripped_gate(
    caplog: pytest.LogCaptureFixture,
) -> None:
    data = rollout_batch()
    config = GateConfig(
        max_zero_trainable_share=0.25,
        max_zero_tool_call_share=0.5,
        max_abort_share=0.25,
        fail_step=False,
    )
    with caplog.at_level(logging.INFO, logger="slime_backend"):
        check_rollout_batch(slime_args(config), data)
    samples = [s for group in data for result in group for s in result]
    marks = samples[0].metadata[NAMESPACE]["gates"]
    assert marks["zero_tool_calls"] == {
        "share": 2 / 3,
        "limit": 0.5,
        "offending": 2,
        "episodes": 3,
        "tripped": True,
        "causes": {},
        "example": "",
    }
    assert marks["zero_trainable"]["offending"] == 1  # the aborted episode
    assert not marks["zero_trainable"]["tripped"]
    assert all(s.metadata[NAMESPACE]["gates"] == marks for s in samples)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "zero_tool_calls: 2/3 episodes (67%) > limit 50%" in errors[0].getMessage()
    assert "fail_step = false, so this step trains anyway" in caplog.text


def test_the_hook_names_the_environment_that_failed(caplog: pytest.LogCaptureFixture) -> None:
    data = [
        [
            converted(i, fan_out(Recorder(seed=i)), EpisodeOutcome.aborted(ENVIRONMENT_FAILURE))
            for i in range(3)
        ],
        [converted(3, fan_out(Recorder(seed=3)), EpisodeOutcome(1.0))],
    ]
    config = GateConfig(max_zero_trainable_share=0.9, max_abort_share=0.9, fail_step=False)
    with caplog.at_level(logging.INFO, logger="slime_backend"):
        check_rollout_batch(slime_args(config), data)
    (error,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    message = error.getMessage()
    assert "environment_aborts: 3/4 episodes (75%) > limit 50%" in message
    assert "manifest unknown" in message


def test_a_healthy_batch_passes_quietly(caplog: pytest.LogCaptureFixture) -> None:
    data = rollout_batch()
    config = GateConfig(
        max_zero_trainable_share=0.25, max_zero_tool_call_share=0.7, max_abort_share=0.25
    )
    with caplog.at_level(logging.INFO, logger="slime_backend"):
        check_rollout_batch(slime_args(config), data)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "gates passed for 4 episodes" in caplog.text


def test_a_tripped_gate_raises_so_the_run_stops() -> None:
    config = GateConfig(
        max_zero_trainable_share=0.25, max_zero_tool_call_share=0.5, max_abort_share=0.25
    )
    assert config.fail_step  # the default
    with pytest.raises(SilentFailureAlarm, match="zero_tool_calls") as raised:
        check_rollout_batch(slime_args(config), rollout_batch())
    assert [r.name for r in raised.value.report.tripped] == ["zero_tool_calls"]


def test_samples_from_another_generate_function_are_reported_not_judged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    data = [[StandInSample(index=9, group_index=0, reward=1.0)], rollout_batch()]
    config = GateConfig(
        max_zero_trainable_share=0.25, max_zero_tool_call_share=0.7, max_abort_share=0.25
    )
    with caplog.at_level(logging.WARNING, logger="slime_backend"):
        check_rollout_batch(slime_args(config), data)
    assert "1 of 7 samples carry no agent-rl provenance" in caplog.text
    assert NAMESPACE not in data[0][0].metadata


def test_a_run_wired_without_our_custom_config_fails_loudly() -> None:
    with pytest.raises(ConfigError, match=r"^agent_rl: expected a table"):
        check_rollout_batch(SimpleNamespace(), rollout_batch())


# -- defaults, and graded episodes with nothing to train ----------------------------------------


def test_gates_stop_by_default_and_fail_step_false_is_the_named_way_to_only_warn() -> None:
    assert from_mapping(GateConfig, {}, "agent_rl.gates").fail_step
    assert not from_mapping(GateConfig, {"fail_step": False}, "agent_rl.gates").fail_step
    with pytest.raises(ConfigError, match=r"^agent_rl\.gates\.fail_step: expected true or false"):
        from_mapping(GateConfig, {"fail_step": "warn"}, "agent_rl.gates")


def test_every_abort_cause_counts_in_the_aborts_gate() -> None:
    reasons = ["engine: the router did not answer", "sandbox: boot failed", ENVIRONMENT_FAILURE]
    episodes = [EpisodeHealth(EpisodeStatus.ABORTED, 0, 0, 0, r) for r in reasons]
    report = evaluate_gates([*episodes, *[health() for _ in range(7)]], GateConfig())
    aborts = next(r for r in report.results if r.name == "aborts")
    assert (aborts.offending, aborts.episodes, aborts.tripped) == (3, 10, True)
    assert dict(aborts.causes) == {"engine": 1, "sandbox": 1, "environment": 1}


LENGTH_DROPPED = (
    "nothing_trainable: length_drop: every trained token was past the sample length limit "
    "(turns 1, generated tokens 51; excluded: over_length 51)"
)


def test_graded_episodes_with_nothing_to_train_are_zero_trainable_not_aborts() -> None:
    """They ran and were graded (the policy's doing): not a fault. Length drops are counted on
    their own, so a policy that writes too long stays visible."""
    untrainable = [
        EpisodeHealth(EpisodeStatus.ABORTED, 0, 0, 0, LENGTH_DROPPED),
        EpisodeHealth(EpisodeStatus.ABORTED, 0, 0, 0, LENGTH_DROPPED),
        EpisodeHealth(EpisodeStatus.ABORTED, 0, 0, 0, "nothing_trainable: no_turns: no model call"),
    ]
    assert [e.nothing_trainable for e in untrainable] == ["length_drop", "length_drop", "no_turns"]
    assert all(e.ran and not e.aborted for e in untrainable)
    report = evaluate_gates([*untrainable, *[health() for _ in range(7)]], GateConfig())
    shares = {r.name: (r.offending, r.episodes) for r in report.results}
    assert shares["zero_trainable"] == (3, 10)
    assert shares["aborts"] == (0, 10)
    assert shares["length_drops"] == (2, 10)
    assert shares["zero_tool_calls"] == (3, 10)  # they ran, and made no tool call
    assert [r.name for r in report.tripped] == ["zero_trainable"]
    assert report.tripped[0].causes == (("nothing_trainable", 3),)
    assert "nothing_trainable 3" in report.describe()


def test_the_hook_counts_a_length_dropped_batch_and_stops_the_step() -> None:
    def long_episode(seed: int) -> Recorder:
        rec = Recorder(seed=seed)
        rec.turn([system("s"), user("task")], "x" * 50)
        return rec

    options = ConversionOptions(max_sample_tokens=10, length_mode=LengthMode.DROP)
    data = [
        [
            episode_samples(
                long_episode(i).tree,
                base_sample(index=i, group_index=0),
                EpisodeOutcome(1.0),
                options,
                sample_class=StandInSample,
            )
            for i in range(2)
        ]
    ]
    with pytest.raises(SilentFailureAlarm) as raised:
        check_rollout_batch(slime_args(GateConfig()), data)
    tripped = {r.name: r for r in raised.value.report.tripped}
    assert set(tripped) == {"zero_trainable", "zero_tool_calls", "length_drops"}
    assert tripped["length_drops"].offending == 2
    assert "length_drops: 2/2 episodes (100%) > limit 20%" in str(raised.value)
    marks = data[0][0][0].metadata[NAMESPACE]["gates"]
    assert marks["length_drops"]["offending"] == 2
    assert marks["aborts"]["offending"] == 0
