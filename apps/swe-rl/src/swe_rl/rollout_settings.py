"""Rollout settings: how episodes sample and what bounds them, as one typed configuration.

`swe-rl rollout` and `swe-rl check` take them from four places, each overriding the one before:

    default      slime's default where slime has the setting, else this module's
    checkpoint   the checkpoint's generation_config.json (temperature, top_p, top_k, min_p,
                 max_new_tokens), and its chat template's tool-call and reasoning markup
    file         --settings FILE, a TOML file of `name = value` lines (docs/example-settings.toml)
    flag         --rollout-temperature 0.6, ... (one flag per setting, named as the field)

and the context, when nothing sets it, from the engine (`engine`). A bad value is refused by
name, with the value and where it came from, before any episode runs. Every value and its
source is printed at start and recorded in run.json.

Names are slime's where slime has the setting (`rollout_temperature` is `--rollout-temperature`),
so a file maps one to one onto a training run: see `RUN_FILE` and the README's table. What the
settings become in a run: slime's `args` (`slime_overrides`), the sampling dict slime builds
from them (`sampling_params`), the episode's budgets (`episode_settings`) and the adapter's
template mode (`adapter_settings`), all read by slime-backend's generate function exactly as in
a training run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table

from protocol_adapters import (
    Checkpoint,
    Renderer,
    RendererConfig,
    TemplateMode,
    TemplateRefused,
)
from slime_backend import (
    AdapterSettings,
    ConfigError,
    EpisodeSettings,
    FieldError,
    from_mapping,
    to_mapping,
)
from slime_backend.launcher import RolloutConfig
from swe_rl.errors import UsageError
from swe_rl.rollout_flags import NONE, flag_settings

GENERATION_CONFIG = "generation_config.json"


@dataclass(frozen=True, slots=True)
class RolloutSettings:
    """Every setting an episode samples and runs under (see the module docstring)."""

    rollout_temperature: float = 1.0
    rollout_top_p: float = 1.0
    rollout_top_k: int = -1
    """-1: no top-k cut (SGLang's and slime's convention)."""
    min_p: float = 0.0
    rollout_max_response_len: int = 32768
    """New tokens per reply, at most (the agent's own max_tokens and the room left in the
    context cap a reply too; Claude Code asks for 32,000)."""
    max_episode_new_tokens: int | None = None
    """New tokens per episode, every reply of every agent together (none: no cap)."""
    rollout_max_context_len: int | None = None
    """Tokens one model call may hold, prompt and reply (none: the engine's)."""
    rollout_stop: tuple[str, ...] = ()
    max_turns: int = 200
    """Model calls per episode."""
    wall_clock_s: float = 1800.0
    """The agent's wall-clock budget per episode; grading and cleanup come after it."""
    sglang_tool_call_parser: str = "qwen25"
    sglang_reasoning_parser: str | None = "qwen3"
    template_mode: TemplateMode = TemplateMode.EXACT

    def __post_init__(self) -> None:
        _positive_number(self, "rollout_temperature")
        if not 0.0 < self.rollout_top_p <= 1.0:
            raise FieldError("rollout_top_p", f"must be in (0, 1], got {self.rollout_top_p!r}")
        if self.rollout_top_k != -1 and self.rollout_top_k < 1:
            raise FieldError(
                "rollout_top_k", f"must be -1 (off) or positive, got {self.rollout_top_k}"
            )
        if not 0.0 <= self.min_p <= 1.0:
            raise FieldError("min_p", f"must be in [0, 1], got {self.min_p!r}")
        for name in ("rollout_max_response_len", "max_episode_new_tokens", "max_turns"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise FieldError(name, f"must be at least 1, got {value}")
        context = self.rollout_max_context_len
        if context is not None and context < 3:
            raise FieldError("rollout_max_context_len", f"must be at least 3 tokens, got {context}")
        if not all(self.rollout_stop):
            raise FieldError(
                "rollout_stop", f"stop strings must not be empty, got {self.rollout_stop!r}"
            )
        _positive_number(self, "wall_clock_s")
        try:  # the run file's own check, so a name refused here is refused there too
            RolloutConfig(
                num_rollout=1,
                batch_size=1,
                n_samples_per_prompt=2,
                max_context_len=3,
                max_response_len=1,
                tool_call_parser=self.sglang_tool_call_parser,
                reasoning_parser=self.sglang_reasoning_parser,
            )
        except FieldError as error:
            raise FieldError(f"sglang_{error.path}", error.message) from None

    # -- what the settings become in a run ------------------------------------------------------

    def slime_overrides(self, context: int) -> dict[str, object]:
        """slime's `args` fields these settings are (the generate function reads them there);
        `context` is the resolved context length. The top-p goes to the sampling dict only: on
        slime's `args` a top-p below 1 means top-p replay, which the generate function refuses
        for a training run."""
        return {
            "rollout_temperature": self.rollout_temperature,
            "rollout_top_k": self.rollout_top_k,
            "rollout_max_response_len": self.rollout_max_response_len,
            "rollout_max_context_len": context,
            "rollout_stop": list(self.rollout_stop) or None,
            "sglang_tool_call_parser": self.sglang_tool_call_parser,
            "sglang_reasoning_parser": self.sglang_reasoning_parser,
        }

    def sampling_params(self) -> dict[str, Any]:
        """The sampling dict slime's rollout builds from these flags (`GenerateState`), plus
        `min_p` when set (slime has no flag for it) and without slime's top-p replay request
        (which the generate function refuses: outside slime there is no trainer to replay it)."""
        params: dict[str, Any] = {
            "temperature": self.rollout_temperature,
            "top_p": self.rollout_top_p,
            "top_k": self.rollout_top_k,
            "max_new_tokens": self.rollout_max_response_len,
            "stop": list(self.rollout_stop) or None,
            "stop_token_ids": None,
            "skip_special_tokens": False,
            "no_stop_trim": True,
            "spaces_between_special_tokens": False,
        }
        if self.min_p:
            params["min_p"] = self.min_p
        return params

    def episode_settings(self, generate: str, **others: Any) -> EpisodeSettings:
        return EpisodeSettings(
            generate,
            wall_clock_s=self.wall_clock_s,
            max_turns=self.max_turns,
            max_episode_new_tokens=self.max_episode_new_tokens,
            **others,
        )

    def adapter_settings(self, **others: Any) -> AdapterSettings:
        return AdapterSettings(template_mode=self.template_mode, **others)

    def run_file_tables(self) -> dict[str, dict[str, object]]:
        """The same settings as a training run file's tables (slime-backend's launcher): what
        `RUN_FILE` says, for the values a run file can hold. A value slime cannot run with is
        refused by name: a top-p below 1 (slime then asks for top-p replay, which the adapters
        cannot record) and a min-p (slime has no flag for it)."""
        if self.rollout_top_p != 1.0:
            raise FieldError(
                "rollout_top_p",
                f"{self.rollout_top_p} has no training run: below 1 slime asks for top-p replay, "
                "which the adapters do not record",
            )
        if self.min_p:
            raise FieldError("min_p", f"{self.min_p} has no training run: slime has no min-p")
        if self.rollout_max_context_len is None:
            raise FieldError("rollout_max_context_len", "a training run states it")
        rollout: dict[str, object] = {
            "max_context_len": self.rollout_max_context_len,
            "max_response_len": self.rollout_max_response_len,
            "temperature": self.rollout_temperature,
            "top_k": self.rollout_top_k,
            "stop": list(self.rollout_stop),
            "tool_call_parser": self.sglang_tool_call_parser,
            "reasoning_parser": self.sglang_reasoning_parser or NONE,
        }
        episode: dict[str, object] = {
            "wall_clock_s": self.wall_clock_s,
            "max_turns": self.max_turns,
        }
        if self.max_episode_new_tokens is not None:
            episode["max_episode_new_tokens"] = self.max_episode_new_tokens
        return {
            "rollout": rollout,
            "episode": episode,
            "adapter": {"template_mode": self.template_mode.value},
        }


RUN_FILE: dict[str, str | None] = {
    "rollout_temperature": "rollout.temperature",
    "rollout_top_p": None,
    "rollout_top_k": "rollout.top_k",
    "min_p": None,
    "rollout_max_response_len": "rollout.max_response_len",
    "max_episode_new_tokens": "episode.max_episode_new_tokens",
    "rollout_max_context_len": "rollout.max_context_len",
    "rollout_stop": "rollout.stop",
    "max_turns": "episode.max_turns",
    "wall_clock_s": "episode.wall_clock_s",
    "sglang_tool_call_parser": "rollout.tool_call_parser",
    "sglang_reasoning_parser": "rollout.reasoning_parser",
    "template_mode": "adapter.template_mode",
}
"""Each setting's field in a training run file (None: a training run cannot have it)."""

SLIME_FLAGS = {
    name: "--" + name.replace("_", "-")
    for name in (
        "rollout_temperature",
        "rollout_top_p",
        "rollout_top_k",
        "rollout_max_response_len",
        "rollout_max_context_len",
        "rollout_stop",
        "sglang_tool_call_parser",
        "sglang_reasoning_parser",
    )
}
"""The settings slime has, with its flag (the same name)."""

FIELDS = tuple(f.name for f in dataclasses.fields(RolloutSettings))


def _positive_number(settings: RolloutSettings, name: str) -> None:
    value = getattr(settings, name)
    if not (math.isfinite(value) and value > 0):
        raise FieldError(name, f"must be a positive number, got {value!r}")


# -- where each value comes from ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ResolvedSettings:
    """The settings, and for each field where its value came from (and a note saying how)."""

    settings: RolloutSettings
    sources: Mapping[str, str]
    notes: Mapping[str, str] = field(default_factory=dict)

    def with_engine_context(self, engine_context: int) -> ResolvedSettings:
        """The context resolved against the engine's: the engine's when nothing set it, and
        refused by name when set larger than the engine serves."""
        context = self.settings.rollout_max_context_len
        if context is None:
            settings = dataclasses.replace(self.settings, rollout_max_context_len=engine_context)
            sources = {**self.sources, "rollout_max_context_len": "engine"}
            return ResolvedSettings(settings, sources, self.notes)
        if context > engine_context:
            source = self.sources["rollout_max_context_len"]
            raise UsageError(
                f"rollout_max_context_len: {context} (from {source}) is larger than the "
                f"engine's context length ({engine_context} tokens); leave it unset to use "
                "the engine's, or start the engine with a larger --context-length"
            )
        return self

    @property
    def context(self) -> int:
        context = self.settings.rollout_max_context_len
        if context is None:
            raise RuntimeError("the context is resolved against the engine first")
        return context

    def record(self) -> dict[str, dict[str, object]]:
        """What run.json keeps: every value and its source."""
        values = to_mapping(self.settings)
        assert isinstance(values, dict)
        return {
            name: {"value": values[name], "source": self.sources[name]}
            | ({"note": self.notes[name]} if name in self.notes else {})
            for name in FIELDS
        }

    def table(self) -> Table:
        view = Table(title="rollout settings", title_justify="left")
        for column in ("setting", "value", "source", "slime"):
            view.add_column(column)
        for name in FIELDS:
            source = self.sources[name]
            note = self.notes.get(name)
            view.add_row(
                name,
                _shown(getattr(self.settings, name)),
                f"{source} ({note})" if note else source,
                SLIME_FLAGS.get(name, "-"),
            )
        return view


def _shown(value: object) -> str:
    if value is None:
        return "none"
    if isinstance(value, TemplateMode):
        return value.value
    if isinstance(value, tuple):
        return json.dumps(list(value))
    return repr(value) if isinstance(value, float) else str(value)


def resolve_settings(
    checkpoint_dir: Path,
    template_source: str,
    *,
    file: Path | None = None,
    flags: Mapping[str, object] | None = None,
) -> ResolvedSettings:
    """Defaults, then the checkpoint's, then the file's, then the flags'; each layer checked
    on its own so a bad value is named with where it came from."""
    sources = dict.fromkeys(FIELDS, "default")
    notes: dict[str, str] = {}
    values: dict[str, object] = {}
    stated, stated_notes = checkpoint_defaults(checkpoint_dir, template_source)
    _check_layer(stated, lambda name: f"the checkpoint's {stated_notes[name]}", advise=True)
    for name, value in stated.items():
        values[name], sources[name], notes[name] = value, "checkpoint", stated_notes[name]
    if file is not None:
        from_file = read_settings_file(file)
        _check_layer(from_file, lambda name: str(file))
        for name, value in from_file.items():
            values[name], sources[name] = value, "file"
            notes.pop(name, None)
    for name, value in (flags or {}).items():
        values[name], sources[name] = value, "flag"
        notes.pop(name, None)
    _check_layer(dict(flags or {}), lambda name: f"--{name.replace('_', '-')}")
    try:
        settings = from_mapping(RolloutSettings, values)
    except ConfigError as error:  # each layer was fine alone; no setting depends on another
        raise UsageError(f"rollout settings: {error}") from None
    return ResolvedSettings(settings, sources, notes)


def _check_layer(
    values: Mapping[str, object], where: Callable[[str], str], *, advise: bool = False
) -> None:
    """One layer's values alone, over the defaults: a bad one named with where it came from."""
    try:
        from_mapping(RolloutSettings, values)
    except ConfigError as error:
        name = error.path.split(".")[0].split("[")[0]
        hint = f"; set it with --settings FILE or --{name.replace('_', '-')}" if advise else ""
        raise UsageError(f"{error.path}: {error.message} (from {where(name)}){hint}") from None


def read_settings_file(path: Path) -> dict[str, object]:
    """The file's settings as written (checked against the type by the caller)."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise UsageError(f"--settings {path}: cannot read it: {error.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise UsageError(f"--settings {path}: not a TOML file: {error}") from None
    for name in ("sglang_reasoning_parser", "max_episode_new_tokens", "rollout_max_context_len"):
        if data.get(name) == NONE:  # TOML has no null
            data[name] = None
    return data


# -- what the checkpoint states -----------------------------------------------------------------

_GENERATION_KEYS = {
    "temperature": "rollout_temperature",
    "top_p": "rollout_top_p",
    "top_k": "rollout_top_k",
    "min_p": "min_p",
    "max_new_tokens": "rollout_max_response_len",
}

TOOL_CALL_MARKUP = (
    ("<arg_key>", "glm45", "GLM-4.5 <arg_key>/<arg_value> tool calls"),
    ("<function=", "qwen3_coder", "Qwen3-Coder <function=...> tool calls"),
    ("<tool_call>", "qwen25", "<tool_call> JSON tool calls"),
    ("tool▁calls▁begin", "deepseekv31", "DeepSeek tool-call tokens"),
    ("[TOOL_CALLS]", "mistral", "Mistral [TOOL_CALLS]"),
    ("<|python_tag|>", "llama3", "Llama 3 JSON tool calls"),
)
"""Chat-template markup that names a tool-call format, most specific first."""


def checkpoint_defaults(
    directory: Path, template_source: str
) -> tuple[dict[str, object], dict[str, str]]:
    """What the checkpoint states: sampling from generation_config.json (Hugging Face's
    `top_k = 0`, no cut, is -1 here), the reply parsers from its chat template's markup."""
    values: dict[str, object] = {}
    notes: dict[str, str] = {}
    path = directory / GENERATION_CONFIG
    if path.is_file():
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise UsageError(f"--checkpoint {directory}: {GENERATION_CONFIG}: {error}") from None
        if isinstance(config, dict):
            for key, name in _GENERATION_KEYS.items():
                value = config.get(key)
                if value is None:
                    continue
                values[name] = -1 if key == "top_k" and value == 0 else value
                notes[name] = f"{GENERATION_CONFIG} {key}"
    for marker, parser, what in TOOL_CALL_MARKUP:
        if marker in template_source:
            values["sglang_tool_call_parser"] = parser
            notes["sglang_tool_call_parser"] = f"chat template: {what}"
            break
    if "<think>" in template_source:
        values["sglang_reasoning_parser"] = "qwen3"
        notes["sglang_reasoning_parser"] = "chat template: <think> reasoning"
    else:
        values["sglang_reasoning_parser"] = None
        notes["sglang_reasoning_parser"] = "chat template: no <think>"
    return values, notes


# -- the command line ---------------------------------------------------------------------------


def settings_from_args(
    args: argparse.Namespace, checkpoint_dir: Path, template_source: str
) -> ResolvedSettings:
    """A command's settings: its --settings file and flags over the checkpoint's."""
    return resolve_settings(
        checkpoint_dir, template_source, file=args.settings, flags=flag_settings(args)
    )


def template_verdict(checkpoint: Checkpoint, mode: TemplateMode) -> str:
    """The chat template's audit verdict, when `mode` serves it (what the adapter will check
    at its start, asked before any episode); the user's error naming the verdict and the mode
    that would serve it, when not."""
    try:
        renderer = Renderer(checkpoint.vocabulary, checkpoint.template, RendererConfig(mode=mode))
    except TemplateRefused as refused:
        raise UsageError(f"template_mode: {refused}") from None
    return str(renderer.audit.verdict)
