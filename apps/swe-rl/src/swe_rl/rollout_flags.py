"""The rollout settings' command-line flags (swe_rl/rollout_settings.py has the settings).

Kept apart from the settings so that building the command line imports nothing heavy: one flag
per setting, named as the setting (`--rollout-temperature` sets `rollout_temperature`), and
`--settings FILE`. A flag left out is absent from `flag_settings`, so the file's, the
checkpoint's or the default value stands.
"""

from __future__ import annotations

import argparse
from pathlib import Path

NONE = "none"
"""What turns off a setting that can be off (the reasoning parser, the episode's token cap)."""

SETTINGS = (
    "rollout_temperature",
    "rollout_top_p",
    "rollout_top_k",
    "min_p",
    "rollout_max_response_len",
    "max_episode_new_tokens",
    "rollout_max_context_len",
    "rollout_stop",
    "max_turns",
    "wall_clock_s",
    "sglang_tool_call_parser",
    "sglang_reasoning_parser",
    "template_mode",
)
"""Every setting, in RolloutSettings' order (a test holds the two together)."""

TEMPLATE_MODES = ("exact", "accept-deviations", "full-render")
"""protocol_adapters.TemplateMode's values (a test holds the two together)."""


def add_settings_arguments(parser: argparse.ArgumentParser) -> None:
    """`--settings FILE` and one flag per setting."""
    group = parser.add_argument_group(
        "rollout settings",
        "Each one defaults to the settings file's value, else to what the checkpoint states "
        "(generation_config.json, chat template), else to slime's default. All are printed at "
        "start with their source and recorded in run.json.",
    )
    group.add_argument("--settings", type=Path, metavar="FILE", help="a TOML file of settings")
    group.add_argument("--rollout-temperature", type=float, metavar="X")
    group.add_argument("--rollout-top-p", type=float, metavar="X")
    group.add_argument("--rollout-top-k", type=int, metavar="N", help="-1: no top-k cut")
    group.add_argument("--min-p", type=float, metavar="X")
    group.add_argument(
        "--rollout-max-response-len",
        type=int,
        metavar="N",
        help="new tokens per reply, at most (default: 32768)",
    )
    group.add_argument(
        "--max-episode-new-tokens",
        type=_count_or_none,
        metavar="N",
        help=f"new tokens per episode, every reply together (default: {NONE})",
    )
    group.add_argument(
        "--rollout-max-context-len",
        "--context-tokens",
        dest="rollout_max_context_len",
        type=int,
        metavar="N",
        help="tokens per model call, prompt and reply (default: the engine's)",
    )
    group.add_argument(
        "--rollout-stop", action="append", metavar="TEXT", help="a stop string (repeatable)"
    )
    group.add_argument(
        "--max-turns", type=int, metavar="N", help="model calls per episode (default: 200)"
    )
    group.add_argument(
        "--wall-clock-s",
        "--budget",
        dest="wall_clock_s",
        type=float,
        metavar="SECONDS",
        help="the agent's wall-clock budget per episode (default: 1800)",
    )
    group.add_argument("--sglang-tool-call-parser", metavar="NAME")
    group.add_argument("--sglang-reasoning-parser", metavar="NAME", help=f"or {NONE!r}")
    group.add_argument(
        "--template-mode",
        choices=TEMPLATE_MODES,
        help="how to serve a chat template the bridge cannot reproduce exactly (default: exact)",
    )


def _count_or_none(text: str) -> int | str:
    if text == NONE:
        return NONE
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number or {NONE!r}: {text!r}") from None


def flag_settings(args: argparse.Namespace) -> dict[str, object]:
    """The settings the command line sets (a flag left out is not in it; `none` is None)."""
    flags: dict[str, object] = {}
    for name in SETTINGS:
        value = getattr(args, name, None)
        if value is not None:
            flags[name] = None if value == NONE else value
    return flags
