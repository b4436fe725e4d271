"""What slime may not do with our generate function, refused by name wherever slime came from.

One check (``slime_backend._fan_out.refusals``) serves the launcher, over the command it builds,
and the generate function, over slime's ``args`` on its first call: a run launched with slime's
own scripts gets the same refusals as one launched with ``SlimeRunner``.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from rollout_kit import base_group

from slime_backend import AgentSettings, BackendSettings, ConfigError, EpisodeSettings, from_mapping
from slime_backend._fan_out import (
    DEFAULT_ROLLOUT_FUNCTION,
    GATE_HOOK,
    REWARD_HOOK,
    RULES,
    check_slime_args,
    refusals,
)
from slime_backend.dynamic_filter import fan_out_aware
from slime_backend.generate import make_generate
from slime_backend.launcher import REFUSED_FLAGS, RunnerConfig, train_args
from slime_backend.testing import StandInSample, slime_args, slime_sampling_params

HERE = Path(__file__).resolve().parent
EXAMPLE = HERE.parent / "docs" / "example-run.toml"
CONTRACT = json.loads((HERE / "data" / "slime_contract.json").read_text())
SLIME_FILTER = "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std"
OUR_FILTER = "slime_backend.dynamic_filter.check_reward_nonzero_std"


def unmarked_filter(args: Any, samples: list[Any], **kwargs: Any) -> bool:
    """A filter of the user's that nobody said handles lists of samples."""
    return True


@fan_out_aware
def marked_filter(args: Any, samples: list[Any], **kwargs: Any) -> bool:
    return True


UNMARKED = f"{__name__}.unmarked_filter"
MARKED = f"{__name__}.marked_filter"

REFUSED: list[tuple[dict[str, object], str]] = [
    ({"group_rm": True}, r"--group-rm .*group reward model .*lists of samples"),
    ({"partial_rollout": True}, r"--partial-rollout .*reads \.response"),
    ({"dynamic_sampling_filter_path": SLIME_FILTER}, r"get_reward_value\(\) .*crashes"),
    ({"dynamic_sampling_filter_path": UNMARKED}, r"is not marked fan-out aware"),
    ({"dynamic_sampling_filter_path": "nowhere.at.all"}, r"cannot be loaded .*No module named"),
    ({"log_passrate": True}, r"--log-passrate .*pass@k"),
    ({"reward_key": "score"}, r"--reward-key .*rewards are numbers"),
    ({"eval_reward_key": "score"}, r"--eval-reward-key .*rewards are numbers"),
    ({"log_reward_category": "why"}, r"--log-reward-category .*rewards are numbers"),
    ({"custom_convert_samples_to_train_data_path": "a.b"}, r"bypasses the per-episode GRPO"),
    ({"rollout_function_path": "a.rollout"}, r"--rollout-function-path .*default rollout"),
    ({"rollout_top_p": 0.9}, r"--rollout-top-p .*nucleus ids"),
    ({"custom_reward_post_process_path": None}, r"must be .*reward_hook.* \(it is not set\)"),
    ({"rollout_sample_filter_path": "a.b"}, r"must be .*gate_hook.* \(got 'a\.b'\)"),
]


def args_with(**changes: object) -> SimpleNamespace:
    settings = BackendSettings(EpisodeSettings("rollout_kit.generate"), AgentSettings("scripted"))
    args = slime_args("http://127.0.0.1:9", Path("/nonexistent"), settings)
    return SimpleNamespace(**{**vars(args), **changes})


@pytest.mark.parametrize(("change", "message"), REFUSED)
def test_slimes_args_that_cannot_be_served_are_refused_by_name(
    change: dict[str, object], message: str
) -> None:
    ((dest, _),) = change.items()
    with pytest.raises(ConfigError, match=rf"^args\.{dest}: slime's --[a-z-]+ is not supported"):
        check_slime_args(args_with(**change))
    with pytest.raises(ConfigError, match=message):
        check_slime_args(args_with(**change))


@pytest.mark.parametrize(
    "change",
    [
        {},
        {"dynamic_sampling_filter_path": OUR_FILTER},
        {"dynamic_sampling_filter_path": OUR_FILTER + "_with_fallback"},
        {"dynamic_sampling_filter_path": MARKED},
        {"rollout_function_path": DEFAULT_ROLLOUT_FUNCTION},
        {"rollout_top_p": 1.0},
        {"group_rm": False, "partial_rollout": False, "reward_key": None},
    ],
)
def test_what_the_generate_function_serves_passes(change: dict[str, object]) -> None:
    check_slime_args(args_with(**change))


async def test_the_generate_function_refuses_on_its_first_call_before_any_episode() -> None:
    """Whatever launched slime: here, args as slime's own script would make them, with a group
    reward model. Nothing is started (the router address is a closed port)."""
    generate = make_generate(_never_called, sample_class=StandInSample)
    args = args_with(group_rm=True)
    sample = base_group(0, 1, 0, [{}])[0]
    for _ in range(2):  # a refusal is not remembered as a setup: every call refuses
        with pytest.raises(ConfigError, match=r"^args\.group_rm: slime's --group-rm"):
            await generate(args, sample, slime_sampling_params(args))
    await generate.aclose()


async def _never_called(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("no episode runs when slime's args are refused")


# -- the launcher: the same check over the command it builds ----------------------------------


def example_with(extra: list[str]) -> RunnerConfig:
    data = tomllib.loads(EXAMPLE.read_text())
    data["extra_args"] = [*data.get("extra_args", []), *extra]
    return from_mapping(RunnerConfig, data)


def extra_start() -> int:
    """Where the example's own extra_args end."""
    return len(tomllib.loads(EXAMPLE.read_text()).get("extra_args", []))


LAUNCHER_REFUSED: list[tuple[list[str], str, object]] = [
    (["--group-rm"], "--group-rm", True),
    (["--partial-rollout"], "--partial-rollout", True),
    (
        ["--dynamic-sampling-filter-path", SLIME_FILTER],
        "--dynamic-sampling-filter-path",
        SLIME_FILTER,
    ),
    ([f"--dynamic-sampling-filter-path={UNMARKED}"], "--dynamic-sampling-filter-path", UNMARKED),
    (["--log-passrate"], "--log-passrate", True),
    (["--reward-key", "score"], "--reward-key", "score"),
    (["--rollout-top-p", "0.9"], "--rollout-top-p", 0.9),
    (["--rollout-function-path", "a.rollout"], "--rollout-function-path", "a.rollout"),
]


@pytest.mark.parametrize(("extra", "flag", "parsed"), LAUNCHER_REFUSED)
def test_the_launcher_refuses_the_same_flags_with_the_same_reasons(
    extra: list[str], flag: str, parsed: object
) -> None:
    """The launcher names the token of extra_args; slime's parsed value of the same flag gets
    the same reason from the generate function."""
    with pytest.raises(ConfigError) as launcher:
        train_args(example_with(extra))
    assert launcher.value.path == f"extra_args[{extra_start()}]"
    (reason,) = [p for f, p in refusals({flag: parsed}) if f == flag]
    assert launcher.value.message == f"{flag} is not supported: {reason}"
    with pytest.raises(ConfigError) as generate:
        check_slime_args(args_with(**{flag[2:].replace("-", "_"): parsed}))
    assert generate.value.message.endswith(reason)


@pytest.mark.parametrize(
    "extra",
    [
        ["--dynamic-sampling-filter-path", OUR_FILTER],
        [f"--dynamic-sampling-filter-path={OUR_FILTER}_with_fallback"],
        ["--dynamic-sampling-filter-path", MARKED, "--over-sampling-batch-size", "16"],
        ["--rollout-top-p=1.0"],
    ],
)
def test_the_launcher_lets_through_what_is_served(extra: list[str]) -> None:
    assert train_args(example_with(extra))[-len(extra) :] == extra


def test_the_launchers_own_command_passes_the_check() -> None:
    """Its hooks are the ones the generate function requires."""
    argv = train_args(example_with([]))
    assert argv[argv.index("--custom-reward-post-process-path") + 1] == REWARD_HOOK
    assert argv[argv.index("--rollout-sample-filter-path") + 1] == GATE_HOOK


# -- the contract: the flags are slime's, under the names and defaults we read ---------------


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.flag)
def test_each_checked_flag_is_slimes_with_the_dest_and_default_we_read(rule: Any) -> None:
    assert rule.flag in CONTRACT["flags"]
    pinned = CONTRACT["flag_defaults"][rule.flag]
    assert pinned["dest"] == rule.dest
    hook = rule.flag in ("--custom-reward-post-process-path", "--rollout-sample-filter-path")
    # slime's default is served, except where slime has no default for a hook of ours
    assert (rule.problem(pinned["default"]) is None) is not hook
    assert REFUSED_FLAGS[rule.flag] == rule.reason
