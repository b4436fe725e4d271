"""What slime may not do with this package's generate function, checked in one place.

The generate function returns a *list* of samples per episode (one per branch: main agent,
sub-agents, compaction restarts), and relies on two hooks of ours. Some of slime's features
assume one sample per generate call, or skip those hooks; at the pinned commit
(docs/slime-contract.md, section 2) they crash on lists or quietly train the wrong thing. This
module names them and says why (:data:`RULES`). Two callers share :func:`refusals`:

- the launcher, over the command it builds (its own flags and ``extra_args``), before a job is
  submitted;
- the generate function, over slime's ``args`` on its first call (:func:`check_slime_args`),
  whatever launched slime: ``SlimeRunner``, slime's own scripts or a hand-written command.

A value is slime's parsed value (``args``) or the text of a command-line token (the launcher; a
switch that is present is ``True``); a flag that is absent has slime's default.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._typed_config import ConfigError

REWARD_HOOK = "slime_backend.reward_hook.post_process_rewards"
GATE_HOOK = "slime_backend.gate_hook.check_rollout_batch"
DEFAULT_ROLLOUT_FUNCTION = "slime.rollout.sglang_rollout.generate_rollout"
"""slime's ``--rollout-function-path`` default: the rollout that calls our gate hook."""
FAN_OUT_FILTER = "slime_backend.dynamic_filter.check_reward_nonzero_std"
FAN_OUT_AWARE = "agent_rl_fan_out_aware"
"""The attribute (``True``) that marks a dynamic-sampling filter as handling lists of samples
(``slime_backend.dynamic_filter.fan_out_aware`` sets it)."""
SLIME_FILTERS = "slime.rollout.filter_hub."
"""slime's own filters: each reads ``get_reward_value`` of every generate result."""


@dataclass(frozen=True, slots=True)
class Rule:
    """One slime flag: ``problem(value)`` says why its value cannot be served, or None."""

    flag: str
    reason: str
    """Why the flag is refused (the general case; :attr:`problem` may say more)."""
    refuses: Callable[[object], bool]
    switch: bool = False
    """A ``store_true`` flag: present on a command line means on."""
    explain: Callable[[object], str | None] | None = None
    """For a flag whose reason depends on its value: the reason, or None when it is served."""

    @property
    def dest(self) -> str:
        """The attribute slime's parser sets (argparse's rule; pinned in the contract data)."""
        return self.flag[2:].replace("-", "_")

    def problem(self, value: object) -> str | None:
        if self.explain is not None:
            return self.explain(value)
        return self.reason if self.refuses(value) else None


def _on(value: object) -> bool:
    return value is True or (isinstance(value, str) and value.lower() not in ("", "false", "0"))


def _set(value: object) -> bool:
    return value is not None and value != ""


def _not_one(value: object) -> bool:
    if value is None:
        return False
    try:
        return float(str(value)) != 1.0
    except ValueError:
        return True


def _filter_problem(value: object) -> str | None:
    if value is None or value == "":
        return None
    path = str(value)
    if path.startswith(SLIME_FILTERS):
        return (
            f"{path} reads get_reward_value() of each generate result of a group, and ours are "
            "lists of samples (one per branch): it crashes at the first group. Use "
            f"{FAN_OUT_FILTER} (or its _with_fallback variant), which counts each episode once"
        )
    try:
        function = load_function(path)
    except Exception as exc:  # whatever importing the user's module raises
        return (
            f"{path} cannot be loaded to check that it handles lists of samples "
            f"({type(exc).__name__}: {exc})"
        )
    if getattr(function, FAN_OUT_AWARE, False) is not True:
        return (
            f"{path} is not marked fan-out aware: slime hands it each group's generate results, "
            f"which are lists of samples here. Use {FAN_OUT_FILTER}, or decorate a filter that "
            "handles lists with slime_backend.dynamic_filter.fan_out_aware"
        )
    return None


def _must_be(expected: str, why: str) -> Callable[[object], str | None]:
    def explain(value: object) -> str | None:
        if value == expected:
            return None
        got = "it is not set" if value is None or value == "" else f"got {value!r}"
        return f"must be {expected} ({got}): {why}"

    return explain


_NUMBER_REWARDS = (
    "slime reads sample.reward[key], and the generate function's rewards are numbers "
    "(the episode's graded reward)"
)

RULES: tuple[Rule, ...] = (
    Rule(
        "--group-rm",
        "slime's group reward model gets each group's generate results, which are lists of "
        "samples here, and crashes on them; episodes are graded by the app, not by slime",
        _on,
        switch=True,
    ),
    Rule(
        "--partial-rollout",
        "slime's abort path reads .response of each unfinished generate result and recycles "
        "it into its buffer; ours are lists of samples of whole episodes",
        _on,
        switch=True,
    ),
    Rule(
        "--dynamic-sampling-filter-path",
        "the filter must handle groups of lists of samples (fan-out)",
        _set,
        explain=_filter_problem,
    ),
    Rule(
        "--log-passrate",
        "slime's pass@k reshapes the step's rewards into rollout_batch_size x "
        "n_samples_per_prompt, one reward per sample: it fails once an episode returns several "
        "samples",
        _on,
        switch=True,
    ),
    Rule("--reward-key", _NUMBER_REWARDS, _set),
    Rule("--eval-reward-key", _NUMBER_REWARDS, _set),
    Rule("--log-reward-category", _NUMBER_REWARDS, _set),
    Rule(
        "--custom-convert-samples-to-train-data-path",
        "it bypasses the per-episode GRPO hook",
        _set,
    ),
    Rule(
        "--rollout-function-path",
        f"the silent-failure gates run in slime's default rollout function "
        f"({DEFAULT_ROLLOUT_FUNCTION})",
        lambda value: _set(value) and value != DEFAULT_ROLLOUT_FUNCTION,
    ),
    Rule(
        "--rollout-top-p",
        "top-p replay needs per-token nucleus ids the adapters do not record (only 1 is served)",
        _not_one,
    ),
    Rule(
        "--custom-reward-post-process-path",
        f"must be {REWARD_HOOK}",
        lambda value: value != REWARD_HOOK,
        explain=_must_be(
            REWARD_HOOK,
            "slime's own normalization takes rewards n_samples_per_prompt at a time by position "
            "and counts aborted placeholders, which is wrong once an episode returns several "
            "samples or none to train",
        ),
    ),
    Rule(
        "--rollout-sample-filter-path",
        f"must be {GATE_HOOK}",
        lambda value: value != GATE_HOOK,
        explain=_must_be(GATE_HOOK, "the silent-failure gates run there"),
    ),
)
"""Every slime flag checked, in the order problems are reported."""

RULE_OF = {rule.flag: rule for rule in RULES}


def load_function(path: str) -> Any:
    """slime's ``load_function``: import everything before the last dot, take the attribute."""
    module, _, attribute = path.rpartition(".")
    if not module:
        raise ValueError(f"{path!r} is not a dotted path like 'pkg.module.function'")
    return getattr(importlib.import_module(module), attribute)


def refusals(values: Mapping[str, object]) -> list[tuple[str, str]]:
    """``(flag, reason)`` for each checked flag whose value cannot be served. ``values`` maps
    flags to their values; a checked flag missing from it has slime's default."""
    found = []
    for rule in RULES:
        problem = rule.problem(values.get(rule.flag))
        if problem is not None:
            found.append((rule.flag, problem))
    return found


def command_values(tokens: Sequence[str]) -> dict[str, tuple[int, object]]:
    """The checked flags of a command line: flag -> (index of its token, value)."""
    values: dict[str, tuple[int, object]] = {}
    for index, token in enumerate(tokens):
        flag, equals, inline = token.partition("=")
        rule = RULE_OF.get(flag)
        if rule is None:
            continue
        if rule.switch:
            value: object = True
        elif equals:
            value = inline
        else:
            value = tokens[index + 1] if index + 1 < len(tokens) else ""
        values[flag] = (index, value)
    return values


def check_slime_args(args: Any) -> None:
    """Refuse, by the first flag it cannot serve, slime's parsed ``args`` (one
    :class:`ConfigError` naming ``args.<dest>``, the flag and why)."""
    values = {rule.flag: getattr(args, rule.dest) for rule in RULES if hasattr(args, rule.dest)}
    for flag, problem in refusals(values):
        rule = RULE_OF[flag]
        raise ConfigError(
            f"args.{rule.dest}",
            f"slime's {flag} is not supported with slime_backend's generate function: {problem}",
        )
